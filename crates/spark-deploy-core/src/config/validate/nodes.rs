//! The `[[nodes]]` checks: the world size, names, the head and the workers' ssh destinations and
//! files, network mode, sysfs/proc roots, `PATH` entries and fabric addresses.

use std::path::Path;

use super::Checker;
use crate::config::schema::DeploymentConfig;
use crate::engine::limits::EngineLimits;
use crate::ports::ssh::options::{check_destination, check_path};

pub(super) fn nodes(c: &mut Checker, config: &DeploymentConfig, limits: &EngineLimits) {
    // [[nodes]]
    let n = config.nodes.len();
    if !limits.world_sizes.contains(&n) {
        let four = if n == 4 && !limits.world_sizes.contains(&4) {
            format!(
                "; four Sparks take deployment.engine = \"{}\"",
                crate::config::EngineProfileName::TensorfoldDsv41Tp4.as_str()
            )
        } else {
            String::new()
        };
        c.refuse("nodes", format!("{n} node(s)"), format!("{:?} nodes: the engine's tensor-parallel world size (one rank per node, head first){four}", limits.world_sizes));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, node) in config.nodes.iter().enumerate() {
        let p = format!("nodes[{i}]");
        c.name(&format!("{p}.name"), &node.name, 32);
        if !names.insert(node.name.clone()) {
            c.refuse(format!("{p}.name"), &node.name, "a name no other node uses");
        }
        if i == 0 && !node.is_local() {
            c.refuse(
                format!("{p}.ssh"),
                &node.ssh,
                "\"local\": the first node is the head, where spark-deploy runs",
            );
        }
        if i > 0 {
            let dest = node.ssh.rsplit('@').next().unwrap_or("");
            let unsafe_dest = check_destination(&node.ssh).err();
            if node.is_local() || dest.is_empty() || unsafe_dest.is_some() {
                c.refuse(
                    format!("{p}.ssh"),
                    format!("{:?}", node.ssh),
                    format!(
                        "an ssh destination for a worker (set WORKER): `user@host`, `host` or a \
                         Host alias of ~/.ssh/config{}",
                        unsafe_dest
                            .map(|u| format!("; this one {u}"))
                            .unwrap_or_default()
                    ),
                );
            }
            if node.ssh_port == Some(0) {
                c.refuse(
                    format!("{p}.ssh_port"),
                    0,
                    "1 to 65535, or unset for ssh's own (the ssh config's Port, else 22)",
                );
            }
            for (field, value) in [
                ("identity_file", &node.identity_file),
                ("known_hosts", &node.known_hosts),
            ] {
                if let Some(problem) = (!value.is_empty())
                    .then(|| check_path(value).err())
                    .flatten()
                {
                    c.refuse(
                        format!("{p}.{field}"),
                        format!("{value:?}"),
                        format!(
                            "a file path ssh reads as written (this one {problem}), or unset for \
                             ssh's own resolution through ~/.ssh/config"
                        ),
                    );
                }
            }
        }
        if node.network_mode != "host"
            && node
                .network_mode
                .strip_prefix("container:")
                .is_none_or(str::is_empty)
        {
            c.refuse(
                format!("{p}.network_mode"),
                &node.network_mode,
                "\"host\" or \"container:<name>\"",
            );
        }
        if !Path::new(&node.sysfs_root).is_absolute() {
            c.refuse(
                format!("{p}.sysfs_root"),
                format!("{:?}", node.sysfs_root),
                "an absolute path on the node (\"/sys\")",
            );
        }
        if !Path::new(&node.proc_root).is_absolute() {
            c.refuse(
                format!("{p}.proc_root"),
                format!("{:?}", node.proc_root),
                "an absolute path on the node (\"/proc\")",
            );
        }
        for dir in &node.path {
            if !Path::new(dir).is_absolute() || dir.contains(':') {
                c.refuse(
                    format!("{p}.path"),
                    format!("{dir:?}"),
                    "absolute directories on the node, without ':'",
                );
            }
        }
        if let Some(addr) = node.fabric_addr
            && (addr.is_unspecified()
                || addr.is_loopback()
                || addr.is_multicast()
                || addr.is_broadcast())
        {
            c.refuse(
                format!("{p}.fabric_addr"),
                addr,
                "the node's unicast IPv4 on the fabric link",
            );
        }
    }
    let fabric: Vec<_> = config.nodes.iter().filter_map(|n| n.fabric_addr).collect();
    if fabric.len()
        != fabric
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    {
        c.refuse(
            "nodes[].fabric_addr",
            "duplicate",
            "a different fabric address per node",
        );
    }
}
