//! The deployment config that targets a running testbed, so the ordinary `spark-deploy`
//! commands (`plan`, `up`, `down`) run against it.

use spark_deploy_core::config::{DeploymentConfig, EngineProfileName, NodeConfig, WorkerStorage};

use crate::cluster::TestbedInfo;

/// A config for `info`: the head is this machine (fabric = the bridge gateway), every worker is
/// reached over the management network with the testbed's key and known_hosts, ranks of workers
/// share the worker container's network namespace, and worker storage is `copy` (this kernel has
/// no NFS). The test-scale pool keeps the stand-in's memory small. Three workers (four nodes)
/// take the TP=4 profile (`tensorfold-dsv41-tp4`); one worker the TP=2 profile.
///
/// Nothing here tells production code it runs on a testbed: the differences are ordinary
/// settings — each worker's image reference is its own tag (head and workers share one Docker
/// daemon here, so a distinct tag makes BuildImage really ship the image), and the shape guard
/// is off because the stand-in serves a test-scale checkpoint.
#[must_use]
pub fn deployment_config(info: &TestbedInfo) -> DeploymentConfig {
    let mut c = DeploymentConfig::default();
    c.deployment.name = "sd-testbed".into();
    c.engine.shape_guard = false;
    c.deployment.worker_storage = WorkerStorage::Copy;
    let head_dir = info.state_dir.join("head");
    c.deployment.state_dir = head_dir.join("state").display().to_string();
    c.hub.cache = head_dir.join("hf").display().to_string();
    c.hub.ablit_cache = head_dir.join("hf-ablit").display().to_string();
    c.serving.context = 4096;
    c.serving.max_tokens = 1024;
    c.lifecycle.min_avail_gib = 1;
    c.lifecycle.ready_timeout_s = 120;
    c.lifecycle.stop_timeout_s = 5;
    let mut head = NodeConfig::head();
    head.fabric_addr = Some(info.head_fabric_addr);
    head.data_dir = head_dir.join("data").display().to_string();
    let mut nodes = vec![head];
    for w in &info.workers {
        let mut n = NodeConfig::worker(&w.name, &w.ssh_destination);
        n.ssh_port = Some(w.ssh_port);
        n.identity_file = w.identity_file.display().to_string();
        n.known_hosts = w.known_hosts.display().to_string();
        n.fabric_addr = Some(w.fabric_addr);
        n.network_mode.clone_from(&w.network_mode);
        n.hf_cache = w.disk_dir.join("hf").display().to_string();
        n.data_dir = w.disk_dir.join("data").display().to_string();
        n.image = format!("{}-{}", crate::engine::IMAGE, w.name);
        nodes.push(n);
    }
    if nodes.len() == 4 {
        c.deployment.engine = EngineProfileName::TensorfoldDsv41Tp4;
    }
    c.nodes = nodes;
    crate::host_facts::configure(info, &mut c);
    c
}

/// Removes everything a deployment of `config` on `info` put on the head and the workers (the HF
/// caches, rank files, kit, Engram tables, worker manifests, the head's hash cache; not the
/// engine or its image), so the next `up` is a first deployment. Nothing of it may be running.
pub fn remove_deployment_files(
    config: &spark_deploy_core::config::ValidatedConfig,
    info: &TestbedInfo,
) {
    use spark_deploy_core::layout::NodeLayout;
    use std::path::PathBuf;
    let c = config.config();
    let mut dirs = vec![PathBuf::from(&c.hub.cache)];
    for node in &c.nodes {
        let l = NodeLayout::of(config, node);
        dirs.extend([&l.inputs_dir, &l.kit_dir, &l.engram_dir].map(PathBuf::from));
        dirs.push(PathBuf::from(&node.hf_cache));
        let _ = fs_err::remove_file(&l.bias_vl_file);
        let _ =
            fs_err::remove_file(PathBuf::from(&node.data_dir).join(".spark-deploy-received.tsv"));
    }
    for w in &info.workers {
        dirs.push(w.disk_dir.join("hf"));
    }
    for d in dirs {
        let _ = fs_err::remove_dir_all(d);
    }
    let _ = fs_err::remove_file(PathBuf::from(&c.deployment.state_dir).join("transfer-hashes.tsv"));
}
