//! The settings ssh resolves for a target (`ssh -G`: the ssh config and the defaults applied,
//! nothing connected), to say in errors what ssh actually tried.

use std::ffi::OsString;
use std::fmt;
use std::process::Stdio;
use std::time::Duration;

use super::options::MasterOptions;

/// The settings ssh uses for one destination, as `ssh -G` prints them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Login user.
    pub user: String,
    /// The host actually connected to (`HostName`).
    pub hostname: String,
    /// Port.
    pub port: u16,
    /// Identity files offered, in order (besides the agent's keys); `~` as ssh prints it.
    pub identity_files: Vec<String>,
    /// `IdentitiesOnly`.
    pub identities_only: bool,
    /// known_hosts files checked (the user's, then the global ones).
    pub known_hosts: Vec<String>,
    /// `ProxyJump`, when one is used.
    pub proxy_jump: Option<String>,
    /// `StrictHostKeyChecking` (`true` = yes).
    pub strict_host_key_checking: String,
    /// `BatchMode`.
    pub batch_mode: String,
}

impl Resolved {
    /// Parses `ssh -G` output.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut r = Self::default();
        let mut global = Vec::new();
        for line in text.lines() {
            let Some((key, value)) = line.split_once(' ') else {
                continue;
            };
            let value = value.trim();
            match key.to_ascii_lowercase().as_str() {
                "user" => r.user = value.to_owned(),
                "hostname" => r.hostname = value.to_owned(),
                "port" => r.port = value.parse().unwrap_or(0),
                "identityfile" => r.identity_files.push(value.to_owned()),
                "identitiesonly" => r.identities_only = value == "yes",
                // Files are separated by spaces, but a file name with a space is printed
                // unquoted: the whole value is one file when such a file exists.
                "userknownhostsfile" => r.known_hosts.extend(split_files(value)),
                "globalknownhostsfile" => global.extend(split_files(value)),
                "proxyjump" if value != "none" => r.proxy_jump = Some(value.to_owned()),
                "stricthostkeychecking" => r.strict_host_key_checking = value.to_owned(),
                "batchmode" => r.batch_mode = value.to_owned(),
                _ => {}
            }
        }
        r.known_hosts.extend(global);
        r
    }

    /// The first known_hosts file: where a verified host key belongs.
    #[must_use]
    pub fn user_known_hosts(&self) -> &str {
        self.known_hosts
            .first()
            .map_or("~/.ssh/known_hosts", String::as_str)
    }
}

fn split_files(value: &str) -> Vec<String> {
    if std::path::Path::new(value).exists() {
        return vec![value.to_owned()];
    }
    value.split_whitespace().map(str::to_owned).collect()
}

impl fmt::Display for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{} port {}", self.user, self.hostname, self.port)?;
        if let Some(j) = &self.proxy_jump {
            write!(f, " via ProxyJump {j}")?;
        }
        write!(f, "; known_hosts: {}", self.known_hosts.join(", "))?;
        write!(
            f,
            "; identities: {}{}",
            if self.identities_only {
                ""
            } else {
                "ssh-agent's keys, "
            },
            self.identity_files.join(", ")
        )
    }
}

/// Runs `ssh -G` with `args` (ending with `--` and the destination). The generated config
/// must exist. Returns `None` when ssh cannot resolve (its complaint is then in the connect
/// error).
pub(crate) async fn resolve(args: Vec<OsString>) -> Option<Resolved> {
    let mut cmd = tokio::process::Command::new("ssh");
    cmd.arg("-G")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(10), cmd.output())
        .await
        .ok()?
        .ok()?;
    out.status
        .success()
        .then(|| Resolved::parse(&String::from_utf8_lossy(&out.stdout)))
}

/// Logs in to a ProxyJump host on its own (`true` as the command), because ssh discards what
/// the ssh it runs for the jump prints. Returns ssh's complaint when the hop fails.
pub(crate) async fn probe_hop(
    options: &MasterOptions,
    hop: &str,
    timeout: Duration,
) -> Option<String> {
    let mut cmd = tokio::process::Command::new("ssh");
    cmd.arg("-T")
        .arg("-o")
        .arg(format!("ConnectTimeout={}", timeout.as_secs().max(1)))
        .args(options.hop_args(hop))
        .arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(s) = &options.agent_socket {
        cmd.env("SSH_AUTH_SOCK", s);
    }
    match tokio::time::timeout(timeout + Duration::from_secs(5), cmd.output()).await {
        Err(_) => Some(format!("no answer within {timeout:?}")),
        Ok(Err(e)) => Some(format!("cannot run ssh: {e}")),
        Ok(Ok(out)) if out.status.success() => None,
        Ok(Ok(out)) => Some(
            String::from_utf8_lossy(&out.stderr)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_ssh_prints() {
        let r = Resolved::parse(
            "user bob\nhostname 198.18.1.2\nport 2222\nbatchmode yes\nidentitiesonly no\n\
             stricthostkeychecking true\nidentityfile /k/id_x\nidentityfile ~/.ssh/id_rsa\n\
             globalknownhostsfile /etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2\n\
             userknownhostsfile /k/kh\nproxyjump jumpy\n",
        );
        assert_eq!(r.user, "bob");
        assert_eq!(r.port, 2222);
        assert_eq!(r.identity_files, ["/k/id_x", "~/.ssh/id_rsa"]);
        assert_eq!(
            r.known_hosts,
            [
                "/k/kh",
                "/etc/ssh/ssh_known_hosts",
                "/etc/ssh/ssh_known_hosts2"
            ]
        );
        assert_eq!(r.user_known_hosts(), "/k/kh");
        assert_eq!(r.proxy_jump.as_deref(), Some("jumpy"));
        assert_eq!(
            r.to_string(),
            "bob@198.18.1.2 port 2222 via ProxyJump jumpy; known_hosts: /k/kh, \
             /etc/ssh/ssh_known_hosts, /etc/ssh/ssh_known_hosts2; identities: ssh-agent's keys, \
             /k/id_x, ~/.ssh/id_rsa"
        );
    }

    /// What ssh resolves for a target with our options and a `home` holding `.ssh/config`.
    async fn resolved(target: &crate::ports::SshTarget) -> Resolved {
        let dir = tempfile::tempdir().unwrap();
        let o = MasterOptions::new(target, dir.path().join("ssh_config")).unwrap();
        std::fs::write(&o.config_file, &o.config_text).unwrap();
        resolve(o.args(&target.destination))
            .await
            .expect("ssh -G resolves")
    }

    /// Precedence, as ssh itself resolves it (`ssh -G`, nothing connected): an explicit field
    /// beats the ssh config, which beats ssh's defaults; the enforced options beat the ssh
    /// config on the destination and on its ProxyJump host.
    #[tokio::test]
    async fn explicit_fields_beat_the_ssh_config_which_beats_the_defaults() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        let file = |name: &str| {
            let p = h.join(name);
            std::fs::write(&p, "").unwrap();
            p
        };
        let (cfg_id, cfg_kh) = (file("cfg_id"), file("cfg_kh"));
        let (explicit_id, explicit_kh) = (file("explicit_id"), file("explicit_kh"));
        std::fs::create_dir_all(h.join(".ssh")).unwrap();
        std::fs::write(
            h.join(".ssh/config"),
            format!(
                "Host sparky\n  HostName 198.18.1.2\n  User bob\n  Port 2222\n  \
                 IdentityFile {}\n  UserKnownHostsFile {}\n  ProxyJump jumpy\n  \
                 StrictHostKeyChecking no\n  BatchMode no\n\
                 Host jumpy\n  HostName 198.18.1.3\n  StrictHostKeyChecking accept-new\n",
                cfg_id.display(),
                cfg_kh.display()
            ),
        )
        .unwrap();
        let target = |dest: &str| crate::ports::SshTarget {
            home: Some(h.to_owned()),
            ..crate::ports::SshTarget::new(dest)
        };
        let s = |p: &std::path::Path| p.display().to_string();

        // The alias: everything from ~/.ssh/config, but host keys stay strictly checked.
        let r = resolved(&target("sparky")).await;
        assert_eq!(
            (r.user.as_str(), r.hostname.as_str(), r.port),
            ("bob", "198.18.1.2", 2222)
        );
        assert_eq!(r.identity_files, [s(&cfg_id)]);
        assert!(!r.identities_only, "agent keys stay usable: {r:?}");
        assert_eq!(r.user_known_hosts(), s(&cfg_kh));
        assert_eq!(r.proxy_jump.as_deref(), Some("jumpy"));
        assert_eq!(
            (r.strict_host_key_checking.as_str(), r.batch_mode.as_str()),
            ("true", "yes")
        );

        // The ProxyJump host gets the same generated config (`-F`), so the same enforcement.
        let j = resolved(&target("jumpy")).await;
        assert_eq!(j.hostname, "198.18.1.3");
        assert_eq!(
            (j.strict_host_key_checking.as_str(), j.batch_mode.as_str()),
            ("true", "yes")
        );

        // Explicit fields override the alias's settings.
        let mut t = target("alice@sparky");
        t.port = Some(2200);
        t.identity_file = Some(explicit_id.clone());
        t.known_hosts = Some(explicit_kh.clone());
        let r = resolved(&t).await;
        assert_eq!(
            (r.user.as_str(), r.hostname.as_str(), r.port),
            ("alice", "198.18.1.2", 2200)
        );
        assert_eq!(r.identity_files.first(), Some(&s(&explicit_id)));
        assert!(r.identities_only);
        assert_eq!(r.user_known_hosts(), s(&explicit_kh));

        // No alias, nothing set: ssh's defaults, with known_hosts under the given home.
        let r = resolved(&target("192.0.2.9")).await;
        assert_eq!((r.hostname.as_str(), r.port), ("192.0.2.9", 22));
        assert_ne!(r.user, "bob");
        assert_eq!(r.proxy_jump, None);
        for id in ["~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa"] {
            assert!(r.identity_files.iter().any(|f| f == id), "{id}: {r:?}");
        }
        assert_eq!(r.user_known_hosts(), s(&h.join(".ssh/known_hosts")));
        assert_eq!(
            (r.strict_host_key_checking.as_str(), r.batch_mode.as_str()),
            ("true", "yes")
        );
    }
}
