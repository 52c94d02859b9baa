//! NFS mode of ConfigureWorkerStorage (as the bash recipe sets it up): the head exports its HF cache read-only to
//! the worker's fabric address; the worker gets a Docker `local` volume of type `nfs` created
//! through its own Docker (over SSH) with the seed's options; a throwaway container of the engine
//! image on the worker mounts it (the mount happens at container start) and lists the snapshot,
//! which must match the head's file for file, size for size.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use bollard::models::{ContainerCreateBody, HostConfig, Volume};

use crate::ports::docker::{DockerError, DockerNode};

/// Errors of the NFS volume.
#[derive(Debug, thiserror::Error)]
pub enum NfsError {
    /// The head does not export the cache to the worker read-only.
    #[error(
        "the head does not export {path} read-only to {client} ({why}); remedy, on the head as root: `sudo apt install nfs-kernel-server && echo '{path} {client}(ro,no_subtree_check)' | sudo tee -a /etc/exports && sudo exportfs -ra`"
    )]
    NotExported {
        /// Exported path.
        path: String,
        /// The worker's fabric address.
        client: Ipv4Addr,
        /// What the exports say.
        why: String,
    },
    /// A volume of that name exists with other options.
    #[error(
        "volume {name} on {node} exists with {found}, expected {wanted}; remedy: remove it there (`docker volume rm {name}`) or set storage.nfs_volume to another name"
    )]
    Conflicting {
        /// Worker.
        node: String,
        /// Volume name.
        name: String,
        /// Its device and options.
        found: String,
        /// The device and server wanted.
        wanted: String,
    },
    /// The worker's kernel or Docker cannot mount NFS at all.
    #[error(
        "NFS not available on this host: {node} cannot mount volume {name} ({detail}); remedy: install NFS client support on {node} (`sudo apt install nfs-common`) or set deployment.worker_storage = \"copy\""
    )]
    NotAvailable {
        /// Worker.
        node: String,
        /// Volume name.
        name: String,
        /// Docker's error.
        detail: String,
    },
    /// The mount reached NFS but failed (server down, export, path).
    #[error(
        "{node} cannot mount volume {name} from the head ({detail}); remedy: check the head's NFS server (`systemctl status nfs-server`), its export (`sudo exportfs -v`) and the fabric link"
    )]
    Mount {
        /// Worker.
        node: String,
        /// Volume name.
        name: String,
        /// Docker's error.
        detail: String,
    },
    /// The volume's snapshot differs from the head's.
    #[error(
        "volume {name} on {node} does not show the head's snapshot: {}; remedy: check the export path (storage.nfs_path) and that the fetch finished",
        .problems.join("; ")
    )]
    Differs {
        /// Worker.
        node: String,
        /// Volume name.
        name: String,
        /// Missing or differing files.
        problems: Vec<String>,
    },
    /// A Docker call failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
}

pub use crate::preflight::exports::check_exports;

/// Whether an existing volume carries the wanted device and server (the device
/// must match and `o` contain `addr=<server>,`).
///
/// # Errors
///
/// [`NfsError::Conflicting`].
pub fn check_existing(
    node: &str,
    volume: &Volume,
    wanted: &BTreeMap<String, String>,
    server: &str,
) -> Result<(), NfsError> {
    let get = |k: &str| volume.options.get(k).cloned().unwrap_or_default();
    let (device, o) = (get("device"), get("o"));
    let expected_device = wanted.get("device").cloned().unwrap_or_default();
    if device == expected_device && o.contains(&format!("addr={server},")) {
        return Ok(());
    }
    Err(NfsError::Conflicting {
        node: node.to_owned(),
        name: volume.name.clone(),
        found: format!("device {device:?} and options {o:?}"),
        wanted: format!("device {expected_device:?} with addr={server}"),
    })
}

/// Sorts a mount failure at container start: the host cannot do NFS at all, or the mount reached
/// for the server and failed.
#[must_use]
pub fn classify_mount_error(node: &str, name: &str, detail: String) -> NfsError {
    let d = detail.to_lowercase();
    let no_nfs = [
        "no such device",
        "protocol not supported",
        "unknown filesystem type",
        "operation not permitted",
        "not supported",
        "bad option",
    ];
    if no_nfs.iter().any(|p| d.contains(p)) {
        NfsError::NotAvailable {
            node: node.to_owned(),
            name: name.to_owned(),
            detail,
        }
    } else {
        NfsError::Mount {
            node: node.to_owned(),
            name: name.to_owned(),
            detail,
        }
    }
}

/// What to create and check on one worker.
pub(crate) struct VolumeSpec<'a> {
    /// Worker node name.
    pub node: &'a str,
    /// Volume name.
    pub name: &'a str,
    /// Driver options (type, device, o).
    pub options: &'a BTreeMap<String, String>,
    /// The NFS server address in `o`.
    pub server: &'a str,
    /// Labels for the volume.
    pub labels: BTreeMap<String, String>,
    /// Engine image on the worker, for the throwaway container.
    pub image: String,
    /// Snapshot directory as seen inside the volume (relative to its root).
    pub snapshot: String,
    /// The head's snapshot: (relative path, size), sorted.
    pub expected: Vec<(String, u64)>,
}

/// Creates the volume, or accepts an existing one with the same device and server; whether it
/// was created.
///
/// # Errors
///
/// [`NfsError::Conflicting`] or a Docker error.
pub(crate) async fn create_or_accept(
    docker: &DockerNode,
    v: &VolumeSpec<'_>,
) -> Result<bool, NfsError> {
    match docker.inspect_volume(v.name).await? {
        Some(existing) => {
            check_existing(v.node, &existing, v.options, v.server)?;
            Ok(false)
        }
        None => {
            docker
                .create_volume(v.name, "local", v.options, &v.labels)
                .await?;
            Ok(true)
        }
    }
}

/// Mounts the volume in a throwaway container of the engine image (the mount happens at start)
/// and compares the snapshot listing with the head's.
///
/// # Errors
///
/// [`NfsError::NotAvailable`] / [`NfsError::Mount`] when the mount fails, [`NfsError::Differs`]
/// when files are missing or differ.
pub(crate) async fn verify_mount(docker: &DockerNode, v: &VolumeSpec<'_>) -> Result<(), NfsError> {
    let probe = format!("{}-nfs-check", v.name);
    let _ = docker.remove_container(&probe).await;
    let body = ContainerCreateBody {
        image: Some(v.image.clone()),
        entrypoint: Some(vec!["sh".into(), "-c".into()]),
        cmd: Some(vec![format!(
            "cd \"/hf/{}\" && find -L . -type f -printf '%P %s\\n'",
            v.snapshot
        )]),
        labels: Some(v.labels.clone().into_iter().collect()),
        host_config: Some(HostConfig {
            binds: Some(vec![format!("{}:/hf:ro", v.name)]),
            ..HostConfig::default()
        }),
        ..ContainerCreateBody::default()
    };
    docker.create_container(&probe, body).await?;
    let listing = async {
        if let Err(e) = docker.start_container(&probe).await {
            let detail = crate::preflight::decide::error_chain(&e);
            return Err(classify_mount_error(v.node, v.name, detail));
        }
        let code = docker.wait_container(&probe).await?;
        let out = docker.logs(&probe, false, None).await?;
        Ok((code, String::from_utf8_lossy(&out).into_owned()))
    }
    .await;
    let _ = docker.remove_container(&probe).await;
    let (code, listing) = listing?;
    let mut problems = Vec::new();
    if code != 0 {
        problems.push(format!("listing exited with {code}: {}", listing.trim()));
    }
    let seen: BTreeMap<&str, u64> = listing
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(p, s)| s.trim().parse().ok().map(|s| (p, s)))
        .collect();
    for (path, size) in &v.expected {
        match seen.get(path.as_str()) {
            None => problems.push(format!("{path} missing")),
            Some(s) if s != size => {
                problems.push(format!("{path} is {s} bytes, the head's {size}"))
            }
            Some(_) => {}
        }
    }
    if !problems.is_empty() {
        return Err(NfsError::Differs {
            node: v.node.to_owned(),
            name: v.name.to_owned(),
            problems,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    #[test]
    fn exports_are_matched_by_path_client_and_ro() {
        let path = "/home/me/.cache/huggingface";
        assert!(
            check_exports(
                "/home/me/.cache/huggingface 198.18.0.2(ro,no_subtree_check)\n",
                path,
                W
            )
            .is_ok()
        );
        assert!(check_exports("# comment\n/home/me 198.18.0.0/24(ro,crossmnt)\n", path, W).is_ok());
        assert!(check_exports("\"/home/me/.cache/huggingface/\" *(ro)\n", path, W).is_ok());
        assert!(
            check_exports(
                "/home/me/.cache/huggingface \\\n  198.18.0.2(ro)\n",
                path,
                W
            )
            .is_ok()
        );
        let e = check_exports("/home/me/.cache/huggingface 198.18.0.2(rw,sync)\n", path, W)
            .unwrap_err();
        assert!(e.contains("read-write"), "{e}");
        let e = check_exports(
            "/home/me/.cache/huggingface 198.18.0.3(ro)\n/srv 198.18.0.2(ro)\n",
            path,
            W,
        )
        .unwrap_err();
        assert!(e.contains("no export"), "{e}");
        assert!(check_exports("/home/me/.cache/huggingface 10.0.0.0/8(ro)\n", path, W).is_err());
        assert!(check_exports("", path, W).is_err());
        let fix = NfsError::NotExported {
            path: path.into(),
            client: W,
            why: e,
        }
        .to_string();
        assert!(fix.contains("echo '/home/me/.cache/huggingface 198.18.0.2(ro,no_subtree_check)' | sudo tee -a /etc/exports && sudo exportfs -ra"), "{fix}");
    }

    #[test]
    fn an_existing_volume_must_carry_the_device_and_server() {
        let wanted = BTreeMap::from([
            ("type".to_owned(), "nfs".to_owned()),
            ("device".to_owned(), ":/hf".to_owned()),
            ("o".to_owned(), "addr=198.18.0.1,nfsvers=4.2,ro".to_owned()),
        ]);
        let vol = |device: &str, o: &str| Volume {
            name: "spark-deploy-hf".into(),
            options: std::collections::HashMap::from([
                ("device".to_owned(), device.to_owned()),
                ("o".to_owned(), o.to_owned()),
            ]),
            ..Volume::default()
        };
        assert!(
            check_existing(
                "w",
                &vol(":/hf", "addr=198.18.0.1,nfsvers=4.2,ro"),
                &wanted,
                "198.18.0.1"
            )
            .is_ok()
        );
        let e = check_existing(
            "w",
            &vol(":/other", "addr=198.18.0.1,ro"),
            &wanted,
            "198.18.0.1",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("docker volume rm spark-deploy-hf"),
            "{e}"
        );
        assert!(
            check_existing(
                "w",
                &vol(":/hf", "addr=192.0.2.7,ro"),
                &wanted,
                "198.18.0.1"
            )
            .is_err()
        );
    }

    #[test]
    fn mount_errors_are_sorted_into_no_nfs_here_and_server_side() {
        let no = classify_mount_error("w", "v", "error while mounting volume: failed to mount local volume: mount :/hf:/var/lib/docker/volumes/v/_data, data: addr=198.18.0.1: no such device".into());
        assert!(matches!(no, NfsError::NotAvailable { .. }));
        assert!(no.to_string().starts_with("NFS not available on this host"));
        let srv = classify_mount_error(
            "w",
            "v",
            "failed to mount local volume: mount :/hf: connection refused".into(),
        );
        assert!(matches!(srv, NfsError::Mount { .. }), "{srv}");
    }
}
