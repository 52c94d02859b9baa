//! What spark-deploy hands to `ssh` for a node: a generated config file and a few command-line
//! options, built so that ssh resolves everything else exactly as it does for `ssh <destination>`.
//!
//! - The generated file (`-F`) first enforces the options that keep sessions non-interactive
//!   and host keys strictly checked, then `Include`s the user's `~/.ssh/config` and the
//!   system-wide `/etc/ssh/ssh_config`, in the order ssh reads them itself. In an ssh config
//!   the first value obtained for an option wins, so the enforced options cannot be relaxed by
//!   the included files, and everything else (`HostName`, `User`, `Port`, `IdentityFile`,
//!   `ProxyJump`, ...) comes from them. ssh passes `-F` on to the ssh it runs for a
//!   `ProxyJump` host, so every hop is held to the same options.
//! - The node's explicit settings are command-line options (`-p`, `-i` with
//!   `IdentitiesOnly=yes`, `-o UserKnownHostsFile=...`), which take precedence over any config
//!   file. Unset, ssh's own resolution applies: the ssh config, then ssh's defaults (port 22,
//!   the agent's keys and `~/.ssh/id_ed25519`, `id_ecdsa`, `id_rsa`, ..., `~/.ssh/known_hosts`).
//!
//! Values are checked before they reach ssh ([`check_destination`], [`check_path`]): a
//! destination starting with `-` would be read as an option, and a quote, newline, `%` token or
//! `${}` variable would change what a config line or option means.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use openssh::{KnownHosts, SessionBuilder};

use crate::ports::SshTarget;

/// Options enforced on every hop, whatever the ssh config says.
const ENFORCED: &[(&str, &str)] = &[
    ("BatchMode", "yes"),
    ("StrictHostKeyChecking", "yes"),
    ("PasswordAuthentication", "no"),
    ("KbdInteractiveAuthentication", "no"),
    ("UpdateHostKeys", "no"),
    ("LogLevel", "ERROR"),
];

/// The system-wide client config, read after the user's.
pub const SYSTEM_CONFIG: &str = "/etc/ssh/ssh_config";

/// Why a value cannot be handed to ssh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsafe {
    /// Nothing given.
    #[error("is empty")]
    Empty,
    /// `-...`: ssh would read it as an option.
    #[error("starts with '-', which ssh would read as an option")]
    LeadingDash,
    /// Spaces or tabs.
    #[error("contains whitespace")]
    Whitespace,
    /// A newline or another control character.
    #[error("contains a newline or another control character")]
    Control,
    /// `"`, `'` or `\`.
    #[error("contains a quote or a backslash")]
    Quote,
    /// `%`: ssh expands `%` tokens in file names.
    #[error("contains '%', which ssh expands as a token")]
    Percent,
    /// `${`: ssh expands environment variables in file names.
    #[error("contains '${{', which ssh expands as an environment variable")]
    EnvVar,
    /// `*`, `?`, `[`: `Include` expands globs.
    #[error("contains a glob character (*, ? or [)")]
    Glob,
    /// Not UTF-8.
    #[error("is not valid UTF-8")]
    NotUtf8,
}

/// Checks an ssh destination (`user@host`, `host` or a `Host` alias of the ssh config).
///
/// # Errors
///
/// The reason it would not reach ssh as a destination.
pub fn check_destination(destination: &str) -> Result<(), Unsafe> {
    if destination.is_empty() {
        return Err(Unsafe::Empty);
    }
    if destination.starts_with('-') {
        return Err(Unsafe::LeadingDash);
    }
    if destination.chars().any(char::is_control) {
        return Err(Unsafe::Control);
    }
    if destination.chars().any(char::is_whitespace) {
        return Err(Unsafe::Whitespace);
    }
    if destination.contains(['"', '\'', '\\']) {
        return Err(Unsafe::Quote);
    }
    Ok(())
}

/// Checks a file name handed to ssh (identity file, known_hosts file).
///
/// # Errors
///
/// The reason ssh would read it as something else.
pub fn check_path(path: &str) -> Result<(), Unsafe> {
    if path.is_empty() {
        return Err(Unsafe::Empty);
    }
    if path.starts_with('-') {
        return Err(Unsafe::LeadingDash);
    }
    if path.chars().any(char::is_control) {
        return Err(Unsafe::Control);
    }
    if path.contains(['"', '\'', '\\']) {
        return Err(Unsafe::Quote);
    }
    if path.contains('%') {
        return Err(Unsafe::Percent);
    }
    if path.contains("${") {
        return Err(Unsafe::EnvVar);
    }
    Ok(())
}

/// Checks the home directory whose `.ssh/config` is included.
fn check_home(home: &Path) -> Result<&str, Unsafe> {
    let s = home.to_str().ok_or(Unsafe::NotUtf8)?;
    check_path(s)?;
    if s.contains(['*', '?', '[']) {
        return Err(Unsafe::Glob);
    }
    Ok(s)
}

fn path_str(path: &Path) -> Result<&str, Unsafe> {
    let s = path.to_str().ok_or(Unsafe::NotUtf8)?;
    check_path(s)?;
    Ok(s)
}

/// Which value of a target was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// `destination`, `identity file`, `known_hosts file`, `home directory`.
    pub what: &'static str,
    /// The value.
    pub value: String,
    /// Why.
    pub problem: Unsafe,
}

impl Refused {
    /// What to do instead.
    #[must_use]
    pub fn remedy(&self) -> &'static str {
        match self.what {
            "destination" => {
                "set the node's ssh to `user@host`, `host` or a Host alias of ~/.ssh/config"
            }
            "home directory" => "run with HOME set to a plain absolute path",
            _ => "use a path without quotes, backslashes, '%', '${' or control characters",
        }
    }
}

/// Everything ssh is given for one target, besides the control options of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterOptions {
    /// The generated config file (`-F`).
    pub config_file: PathBuf,
    /// Its contents.
    pub config_text: String,
    /// `-p`, when set.
    pub port: Option<u16>,
    /// `-i` with `IdentitiesOnly=yes`, when set.
    pub identity_file: Option<PathBuf>,
    /// The value of `-o UserKnownHostsFile=` (quoted), when set.
    pub known_hosts: Option<String>,
    /// `SSH_AUTH_SOCK` for the master, when set.
    pub agent_socket: Option<PathBuf>,
}

impl MasterOptions {
    /// The options for `target`, with the generated config to be written at `config_file`.
    ///
    /// # Errors
    ///
    /// [`Refused`] when a value of the target cannot be handed to ssh.
    pub fn new(target: &SshTarget, config_file: PathBuf) -> Result<Self, Refused> {
        let refused = |what, value: &Path, problem| Refused {
            what,
            value: value.display().to_string(),
            problem,
        };
        check_destination(&target.destination).map_err(|problem| Refused {
            what: "destination",
            value: target.destination.clone(),
            problem,
        })?;
        let home = match &target.home {
            Some(h) => Some(check_home(h).map_err(|p| refused("home directory", h, p))?),
            None => None,
        };
        if let Some(k) = &target.identity_file {
            path_str(k).map_err(|p| refused("identity file", k, p))?;
        }
        let known_hosts = match &target.known_hosts {
            Some(k) => Some(format!(
                "\"{}\"",
                path_str(k).map_err(|p| refused("known_hosts file", k, p))?
            )),
            None => None,
        };
        Ok(Self {
            config_file,
            config_text: generated_config(home),
            port: target.port,
            identity_file: target.identity_file.clone(),
            known_hosts,
            agent_socket: target.agent_socket.clone(),
        })
    }

    /// Sets these options on an `openssh` builder (which adds `BatchMode=yes` and the control
    /// options itself).
    pub fn apply(&self, b: &mut SessionBuilder) {
        b.known_hosts_check(KnownHosts::Strict)
            .config_file(&self.config_file);
        if let Some(p) = self.port {
            b.port(p);
        }
        if let Some(k) = &self.identity_file {
            // `-o IdentitiesOnly=yes -i <k>`
            b.keyfile(k);
        }
        if let Some(k) = &self.known_hosts {
            b.user_known_hosts_file(k);
        }
        if let Some(s) = &self.agent_socket {
            b.ssh_auth_sock(s);
        }
    }

    /// The same options as `ssh` arguments, ending with `--` and the destination: what
    /// [`MasterOptions::apply`] makes the `openssh` builder pass, for `ssh -G` (print the
    /// resolved settings without connecting).
    pub fn args(&self, destination: &str) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
        ];
        if let Some(p) = self.port {
            a.extend(["-p".into(), p.to_string().into()]);
        }
        if let Some(k) = &self.identity_file {
            a.extend([
                "-o".into(),
                "IdentitiesOnly=yes".into(),
                "-i".into(),
                k.into(),
            ]);
        }
        a.extend(["-F".into(), self.config_file.clone().into()]);
        if let Some(k) = &self.known_hosts {
            a.extend(["-o".into(), format!("UserKnownHostsFile={k}").into()]);
        }
        a.extend(["--".into(), destination.into()]);
        a
    }

    /// The options for a ProxyJump host reached on its own (none of the node's explicit
    /// settings, which apply to the node only), ending with `--` and `hop`.
    pub fn hop_args(&self, hop: &str) -> Vec<OsString> {
        vec![
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
            "-F".into(),
            self.config_file.clone().into(),
            "--".into(),
            hop.into(),
        ]
    }
}

/// The first hop of a `ProxyJump` value (`[user@]host[:port]` or an `ssh://` URI, comma
/// separated) as an ssh destination.
#[must_use]
pub fn first_hop(proxy_jump: &str) -> Option<String> {
    let first = proxy_jump.split(',').next()?.trim();
    if first.is_empty() || first.eq_ignore_ascii_case("none") || check_destination(first).is_err() {
        return None;
    }
    let host = first.rsplit('@').next().unwrap_or(first);
    if first.starts_with("ssh://") || !host.contains(':') || host.starts_with('[') {
        Some(first.to_owned())
    } else {
        Some(format!("ssh://{first}"))
    }
}

/// The generated config: the enforced options, then the user's and the system's config, then
/// ssh's default known_hosts under `home` (used only when nothing before named one).
/// `home` = `None` includes `~/.ssh/config`, which ssh expands with the account's home.
fn generated_config(home: Option<&str>) -> String {
    let mut s = String::from(
        "# Generated by spark-deploy for one connection (read once by ssh, then removed).\n\
         # Enforced on the destination and every ProxyJump host: the first value obtained wins.\n\
         Host *\n",
    );
    for (k, v) in ENFORCED {
        let _ = writeln!(s, "  {k} {v}");
    }
    s.push_str("# The user's ssh config, then the system-wide one, as ssh reads them.\n");
    match home {
        Some(h) => {
            let _ = writeln!(s, "Include \"{h}/.ssh/config\"");
        }
        None => s.push_str("Include ~/.ssh/config\n"),
    }
    let _ = writeln!(s, "Include {SYSTEM_CONFIG}");
    if let Some(h) = home {
        let _ = write!(
            s,
            "# ssh's default known_hosts, under the same home.\n\
             Host *\n  UserKnownHostsFile \"{h}/.ssh/known_hosts\" \"{h}/.ssh/known_hosts2\"\n"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_that_ssh_would_misread_are_refused() {
        assert_eq!(check_destination("root@198.18.1.2"), Ok(()));
        assert_eq!(check_destination("sparky"), Ok(()));
        assert_eq!(check_destination("ssh://me@spark-2:2222"), Ok(()));
        assert_eq!(
            check_destination("-oProxyCommand=touch /tmp/x"),
            Err(Unsafe::LeadingDash)
        );
        assert_eq!(check_destination(""), Err(Unsafe::Empty));
        assert_eq!(check_destination("a b"), Err(Unsafe::Whitespace));
        assert_eq!(check_destination("a\nb"), Err(Unsafe::Control));
        assert_eq!(check_destination("a\"b"), Err(Unsafe::Quote));
    }

    #[test]
    fn paths_that_ssh_would_expand_or_split_are_refused() {
        assert_eq!(check_path("/home/me/My Keys/id_ed25519"), Ok(()));
        assert_eq!(check_path("/k/id\n  ProxyCommand x"), Err(Unsafe::Control));
        assert_eq!(check_path("/k/\"id"), Err(Unsafe::Quote));
        assert_eq!(check_path("/k/%h"), Err(Unsafe::Percent));
        assert_eq!(check_path("/k/${HOME}"), Err(Unsafe::EnvVar));
        assert_eq!(check_path("-i"), Err(Unsafe::LeadingDash));
        assert_eq!(check_home(Path::new("/home/*")), Err(Unsafe::Glob));
    }

    #[test]
    fn generated_config_enforces_before_it_includes() {
        let c = generated_config(Some("/home/me"));
        let enforced = c.find("StrictHostKeyChecking yes").unwrap();
        let batch = c.find("BatchMode yes").unwrap();
        let user = c.find("Include \"/home/me/.ssh/config\"").unwrap();
        let system = c.find("Include /etc/ssh/ssh_config").unwrap();
        let kh = c
            .find("UserKnownHostsFile \"/home/me/.ssh/known_hosts\"")
            .unwrap();
        assert!(
            enforced < user && batch < user && user < system && system < kh,
            "{c}"
        );
        assert!(!c.contains("IdentitiesOnly"), "{c}");
        assert!(!c.contains("IdentityAgent"), "{c}");
        let c = generated_config(None);
        assert!(c.contains("Include ~/.ssh/config\n"), "{c}");
        assert!(!c.contains("UserKnownHostsFile"), "{c}");
    }

    #[test]
    fn unsafe_values_are_refused_with_what_they_are() {
        let mut t = SshTarget::new("sparky");
        t.known_hosts = Some("/k/known\"hosts".into());
        let r = MasterOptions::new(&t, "/tmp/c".into()).unwrap_err();
        assert_eq!(r.what, "known_hosts file");
        assert_eq!(r.problem, Unsafe::Quote);
        let t = SshTarget::new("-oProxyCommand=x");
        let r = MasterOptions::new(&t, "/tmp/c".into()).unwrap_err();
        assert_eq!((r.what, r.problem), ("destination", Unsafe::LeadingDash));
    }

    #[test]
    fn first_hops_become_destinations() {
        assert_eq!(first_hop("jumpy").as_deref(), Some("jumpy"));
        assert_eq!(first_hop("me@a:2200,b").as_deref(), Some("ssh://me@a:2200"));
        assert_eq!(first_hop("ssh://a:22").as_deref(), Some("ssh://a:22"));
        assert_eq!(first_hop("-oProxyCommand=x"), None);
        assert_eq!(first_hop("none"), None);
    }

    #[test]
    fn args_put_the_destination_after_double_dash() {
        let mut t = SshTarget::new("sparky");
        t.port = Some(2200);
        t.known_hosts = Some("/k/kh".into());
        let o = MasterOptions::new(&t, "/tmp/c".into()).unwrap();
        let a = o.args("sparky");
        let n = a.len();
        assert_eq!(a[n - 2], "--");
        assert_eq!(a[n - 1], "sparky");
        assert!(a.contains(&OsString::from("UserKnownHostsFile=\"/k/kh\"")));
        assert!(a.windows(2).any(|w| w[0] == "-p" && w[1] == "2200"));
    }
}
