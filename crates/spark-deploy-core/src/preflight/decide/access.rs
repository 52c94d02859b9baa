//! Reaching the node: the head's local Exec or a worker's SSH login, passwordless sudo, and the
//! Docker daemon.

use std::error::Error as StdError;
use std::fmt::Write as _;

use super::{DockerProbe, NodeFacts};
use crate::preflight::report::{Check, CheckResult};

/// An error and its sources on one line (`a: b: c`), so the underlying cause (ssh's stderr) is
/// visible to [`ssh_remedy`].
#[must_use]
pub fn error_chain(e: &dyn StdError) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            let _ = write!(s, ": {t}");
        }
        cur = c.source();
    }
    s
}

/// The remedy for a failed SSH login, classified from ssh's own error text (the only form in
/// which ssh reports why).
#[must_use]
pub fn ssh_remedy(error: &str, ssh: &str) -> String {
    let e = error.to_ascii_lowercase();
    let host = ssh.rsplit('@').next().unwrap_or(ssh);
    if e.contains("host key verification failed")
        || e.contains("host key is known")
        || e.contains("remote host identification has changed")
        || e.contains("host key for")
    {
        format!(
            "the host key of {host} is not in known_hosts (or changed): verify its fingerprint on the node \
             (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then add it with \
             `ssh-keyscan -H {host} >> ~/.ssh/known_hosts` (or the node's known_hosts file); host keys are always checked"
        )
    } else if e.contains("connection refused") {
        format!(
            "{host} refuses SSH connections: start sshd there (`sudo systemctl enable --now ssh`) or set the node's ssh_port"
        )
    } else if e.contains("permission denied") {
        format!(
            "{host} refused the key (BatchMode, no password): install it with `ssh-copy-id {ssh}` or set the node's identity_file"
        )
    } else if e.contains("could not resolve hostname") || e.contains("name or service not known") {
        format!(
            "{host} does not resolve: use its management IP or add it to /etc/hosts / ~/.ssh/config"
        )
    } else if e.contains("timed out") || e.contains("no route to host") {
        format!("{host} is unreachable: check the management network and the node's power")
    } else {
        format!(
            "check that `ssh -o BatchMode=yes {ssh} true` works with the configured key and known_hosts"
        )
    }
}

/// The reach, sudo and Docker rows of `f`; whether the node was reached at all (nothing else is
/// decided for a node that was not).
pub(super) fn decide(f: &NodeFacts, out: &mut Vec<CheckResult>) -> bool {
    let n = f.name.as_str();
    match &f.reach {
        Ok(()) if f.index == 0 => out.push(CheckResult::ok(Check::Exec, n, "local")),
        Ok(()) => out.push(CheckResult::ok(
            Check::Ssh,
            n,
            format!("BatchMode login to {} with host key checking", f.ssh),
        )),
        Err(e) => {
            out.push(CheckResult::fail(
                Check::Ssh,
                n,
                e.clone(),
                ssh_remedy(e, &f.ssh),
            ));
            return false;
        }
    }
    out.push(if f.sudo {
        CheckResult::ok(Check::Sudo, n, "sudo -n available")
    } else {
        CheckResult::ok(
            Check::Sudo,
            n,
            "no passwordless sudo: non-sudo paths are used",
        )
    });
    out.push(match &f.docker {
        DockerProbe::Reachable => CheckResult::ok(Check::Docker, n, "daemon reachable"),
        DockerProbe::PingFailed(e) => CheckResult::fail(
            Check::Docker,
            n,
            e.clone(),
            "start the Docker daemon (`sudo systemctl start docker`) and add the user to the docker group (`sudo usermod -aG docker $USER`, then log in again)",
        ),
        DockerProbe::Unreachable(e) => CheckResult::fail(
            Check::Docker,
            n,
            e.clone(),
            "make the Docker socket reachable for the SSH user (/var/run/docker.sock; workers: the socket is forwarded over the SSH session, so the user must be in the docker group there)",
        ),
    });
    true
}

#[cfg(test)]
mod tests {
    use super::super::testing::{healthy, pair, remedy, row, seed};
    use super::*;
    use crate::preflight::decide::decide as decide_all;
    use crate::preflight::report::Verdict;

    #[test]
    fn worker_ssh_refused_or_unknown_host_key_gets_a_clear_remedy() {
        let (a, b) = pair();
        let cases = [
            (
                "worker-1: cannot connect for remote commands: ssh: connect to host spark-2 port 22: Connection refused",
                "sudo systemctl enable --now ssh",
            ),
            (
                "worker-1: cannot connect for remote commands: No ED25519 host key is known for spark-2 and you have requested strict checking.\r\nHost key verification failed.",
                "ssh-keyscan -H spark-2 >> ~/.ssh/known_hosts",
            ),
            (
                "me@spark-2: Permission denied (publickey).",
                "ssh-copy-id me@spark-2",
            ),
        ];
        for (err, want) in cases {
            let mut w = healthy(1, &b);
            w.reach = Err(err.into());
            let d = decide_all(&seed(), &[healthy(0, &a), w]);
            let r = row(&d, Check::Ssh, "worker-1");
            assert_eq!(r.verdict, Verdict::Fail);
            assert!(remedy(r).contains(want), "{err}: {r:?}");
            assert!(
                !d.results
                    .iter()
                    .any(|r| r.node == "worker-1" && r.check == Check::Docker),
                "nothing else is decided for an unreachable node"
            );
        }
    }

    #[test]
    fn the_exec_ports_error_chain_carries_sshs_reason() {
        use crate::ports::exec::ExecError;
        use crate::ports::ssh::SshError;
        let chain = |stderr: &str| {
            let e = ExecError::Connect {
                node: "worker-1".into(),
                source: Box::new(SshError::Connect {
                    node: "worker-1".into(),
                    destination: "me@spark-2".into(),
                    resolved: "me@spark-2 port 22".into(),
                    reason: "failed to connect to the remote host".into(),
                    source: openssh::Error::Connect(std::io::Error::other(stderr.to_owned())),
                }),
            };
            error_chain(&e)
        };
        let refused = chain("ssh: connect to host spark-2 port 22: Connection refused");
        assert!(refused.contains("Connection refused"), "{refused}");
        assert!(ssh_remedy(&refused, "me@spark-2").contains("start sshd"));
        let unknown = chain(
            "No ED25519 host key is known for spark-2 and you have requested strict checking.\r\nHost key verification failed.",
        );
        assert!(ssh_remedy(&unknown, "me@spark-2").contains("ssh-keyscan -H spark-2"));
    }

    #[test]
    fn an_unreachable_docker_daemon_fails_with_what_to_do() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.docker = DockerProbe::PingFailed("ping: connection reset".into());
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, Check::Docker, "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("systemctl start docker"), "{r:?}");
    }
}
