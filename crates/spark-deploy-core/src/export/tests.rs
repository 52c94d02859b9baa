//! The exports of the default TP=2 plan, and the worker template at the data-structure level
//! for four ranks (configs accept two nodes today).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

use super::lws::{self, LeaderWorkerSet, RestartPolicy, StartupPolicy};
use super::worker::{self, INDEX_VAR};
use super::*;
use crate::config::{DeploymentConfig, ValidatedConfig, WorkerStorage, validate};
use crate::container::ContainerSpec;
use crate::engine::{Engine, for_config};
use crate::facts::DeploymentFacts;

const CONTENT: &str = "5f1c0a9e4b7d2c3e8f6a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e";

fn config_with(storage: WorkerStorage) -> ValidatedConfig {
    let mut raw = DeploymentConfig::default();
    raw.deployment.worker_storage = storage;
    validate(raw, Path::new("/home/owner")).unwrap()
}

/// Facts as preflight detects them on two Sparks.
fn resolved(config: &ValidatedConfig) -> DeploymentFacts {
    let names: Vec<String> = config
        .config()
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .collect();
    let mut o = FactOverrides::default();
    o.set_model_commit(&"3c0ffee".repeat(6)[..40]).unwrap();
    for (i, n) in names.iter().enumerate() {
        o.set("fabric-addr", &format!("{n}=192.168.100.{}", i + 1))
            .unwrap();
        o.set("netdev", &format!("{n}=enp1s0f1np1")).unwrap();
        o.set("rdma-devices", &format!("{n}=rocep1s0f1,roceP2p1s0f1"))
            .unwrap();
        o.set("gid-index", &format!("{n}=3")).unwrap();
    }
    facts_for_export(config, None, &o).unwrap()
}

fn opts() -> LwsOptions {
    LwsOptions {
        image_content: CONTENT.into(),
        verifier: lws::DEFAULT_VERIFIER.into(),
        rdma_resource: lws::DEFAULT_RDMA_RESOURCE.into(),
    }
}

fn pod(t: &PodTemplateSpec) -> &PodSpec {
    t.spec.as_ref().unwrap()
}

fn engine_container(t: &PodTemplateSpec) -> &Container {
    &pod(t).containers[0]
}

/// The container's argv after the ulimit shell (`/bin/sh -c SCRIPT argv...`).
fn argv_of(c: &Container) -> Vec<String> {
    let cmd = c.command.clone().unwrap();
    assert_eq!(cmd[..2], ["/bin/sh", "-c"], "{cmd:?}");
    cmd[3..].to_vec()
}

fn env_of(c: &Container) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap()))
        .collect()
}

fn vars(i: usize) -> BTreeMap<String, String> {
    BTreeMap::from([(INDEX_VAR.to_owned(), i.to_string())])
}

#[test]
fn tp2_lws_yaml_snapshot() {
    let c = config_with(WorkerStorage::Nfs);
    let engine = for_config(&c);
    let text = lws_yaml(&c, engine.as_ref(), &resolved(&c), &opts()).unwrap();
    insta::assert_snapshot!("tp2_lws", text);
}

#[test]
fn the_yaml_parses_back_into_the_typed_resource_with_its_comments() {
    let c = config_with(WorkerStorage::Nfs);
    let engine = for_config(&c);
    let facts = resolved(&c);
    let typed = leader_worker_set(&c, engine.as_ref(), &facts, &opts()).unwrap();
    let text = lws::render(&c, &typed).unwrap();
    let back: LeaderWorkerSet = serde_norway::from_str(&text).unwrap();
    assert_eq!(back, typed);
    let t = &typed.spec.leader_worker_template;
    assert_eq!(t.size.get(), 2);
    assert_eq!(t.restart_policy, RestartPolicy::RecreateGroupOnPodRestart);
    assert_eq!(typed.spec.startup_policy, StartupPolicy::LeaderCreated);
    // The comments as prose (wrapped lines joined).
    let prose = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    for want in [
        "LeaderReady would deadlock",
        "rank 0 becomes ready only after every follower has joined its rendezvous",
        "/health stays ok",
        "kubectl create secret generic dsv41-api-key",
        "io.spark-deploy.content",
    ] {
        assert!(prose.contains(want), "{want:?} missing from {prose}");
    }
    // An unknown enum value or an empty group does not parse into the type.
    for (from, to) in [
        ("startupPolicy: LeaderCreated", "startupPolicy: LeaderLater"),
        (
            "restartPolicy: RecreateGroupOnPodRestart",
            "restartPolicy: Sometimes",
        ),
        ("size: 2", "size: 0"),
        ("kind: LeaderWorkerSet", "kind: StatefulSet"),
    ] {
        assert!(text.contains(from), "{from}");
        let bad = text.replace(from, to);
        assert!(
            serde_norway::from_str::<LeaderWorkerSet>(&bad).is_err(),
            "{to} parsed"
        );
    }
}

#[test]
fn leader_and_worker_run_the_exact_rank_containers() {
    let c = config_with(WorkerStorage::Nfs);
    let engine = for_config(&c);
    let facts = resolved(&c);
    let specs = engine.rank_containers(&c, &facts);
    let (rank1, rank0) = (&specs[0], &specs[1]);
    let lws = leader_worker_set(&c, engine.as_ref(), &facts, &opts()).unwrap();
    let t = &lws.spec.leader_worker_template;
    let leader = t.leader_template.as_ref().unwrap();
    let worker = &t.worker_template;
    let none = BTreeMap::new();
    let expand_all = |v: Vec<String>, vars: &BTreeMap<String, String>| -> Vec<String> {
        v.iter().map(|a| worker::expand(a, vars)).collect()
    };
    assert_eq!(
        expand_all(argv_of(engine_container(leader)), &none),
        rank0.argv
    );
    assert_eq!(env_of(engine_container(leader)), rank0.env);
    // The worker's rank is the pod's index.
    let wargv = argv_of(engine_container(worker));
    assert_eq!(wargv[3], "$(LWS_WORKER_INDEX)");
    assert_eq!(expand_all(wargv, &vars(1)), rank1.argv);
    assert_eq!(env_of(engine_container(worker)), rank1.env);
    // Images, stack limit, IPC_LOCK, host network and IPC.
    for (t, spec) in [(leader, rank0), (worker, rank1)] {
        let e = engine_container(t);
        assert_eq!(e.image.as_deref(), Some(spec.image.as_str()));
        assert_eq!(
            e.command.as_ref().unwrap()[2],
            "ulimit -s 65536 && exec \"$$0\" \"$$@\""
        );
        let caps = e
            .security_context
            .as_ref()
            .unwrap()
            .capabilities
            .as_ref()
            .unwrap();
        assert_eq!(caps.add.as_deref(), Some(&["IPC_LOCK".to_owned()][..]));
        let p = pod(t);
        assert_eq!((p.host_network, p.host_ipc), (Some(true), Some(true)));
        let ann = t.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
        assert_eq!(ann[lws::CONTENT_ANNOTATION], CONTENT);
        let limits = e.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert!(
            limits.contains_key("nvidia.com/gpu")
                && limits.contains_key(lws::DEFAULT_RDMA_RESOURCE)
        );
        let req = &e.resources.as_ref().unwrap().requests.as_ref().unwrap()["memory"].0;
        let mem = engine.memory(&c);
        let budget =
            crate::preflight::budget::RankBudget::of(&crate::preflight::budget::MemoryInputs {
                weights_per_rank: mem.rank_weights_estimate,
                context: c.config().serving.context,
                model: mem,
            })
            .total();
        assert_eq!(*req, format!("{}Mi", budget.div_ceil(1 << 20)));
    }
    // Readiness: only the leader, by generation, never /health; the key from the Secret.
    let probe = engine_container(leader).readiness_probe.as_ref().unwrap();
    let script = probe
        .exec
        .as_ref()
        .unwrap()
        .command
        .as_ref()
        .unwrap()
        .join(" ");
    assert!(script.contains("/v1/chat/completions") && script.contains("\"max_tokens\":1"));
    let health = engine.serving_signals().health_path;
    assert!(!script.contains(health) && script.contains("$(cat '/run/spark-deploy/api-key')"));
    assert!(engine_container(worker).readiness_probe.is_none());
    assert!(engine_container(worker).liveness_probe.is_none());
    let secret = pod(leader)
        .volumes
        .iter()
        .flatten()
        .find_map(|v| v.secret.clone())
        .unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("dsv41-api-key"));
    // NFS mode: the worker reads the head's cache over NFS, everything else from hostPath.
    let wvols = pod(worker).volumes.clone().unwrap();
    let nfs = wvols.iter().find_map(|v| v.nfs.clone()).unwrap();
    assert_eq!(nfs.server, "192.168.100.1");
    assert!(wvols.iter().filter(|v| v.host_path.is_some()).count() >= 4);
    // Init containers: spark-deploy's own verify of the rank's file, the worker's by its index.
    let init = |t: &PodTemplateSpec| {
        pod(t).init_containers.clone().unwrap()[0]
            .command
            .clone()
            .unwrap()
    };
    let (li, wi) = (init(leader), init(worker));
    assert_eq!(li[1..3], ["rank-cache", "verify"]);
    assert_eq!(li[4..7], ["/cache/rank-cache", "0", "2"]);
    assert_eq!(wi[5], "$(LWS_WORKER_INDEX)");
    // Pinning: the leader on rank 0's Spark, the worker on rank 1's.
    let ranks = |t: &PodTemplateSpec| {
        let na = pod(t).affinity.clone().unwrap().node_affinity.unwrap();
        let term = &na
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms[0];
        term.match_expressions
            .clone()
            .unwrap()
            .into_iter()
            .find(|r| r.key == lws::NODE_RANK_LABEL)
            .unwrap()
            .values
            .unwrap()
    };
    assert_eq!(ranks(leader), ["0"]);
    assert_eq!(ranks(worker), ["1"]);
}

#[test]
fn copy_mode_mounts_the_workers_own_cache() {
    let c = config_with(WorkerStorage::Copy);
    let engine = for_config(&c);
    let lws = leader_worker_set(&c, engine.as_ref(), &resolved(&c), &opts()).unwrap();
    let vols = pod(&lws.spec.leader_worker_template.worker_template)
        .volumes
        .clone()
        .unwrap();
    assert!(vols.iter().all(|v| v.nfs.is_none()));
    let hf = vols.iter().find(|v| v.name == "hf").unwrap();
    assert!(hf.host_path.is_some());
}

#[test]
fn placeholders_refuse_the_export() {
    let c = config_with(WorkerStorage::Nfs);
    let engine = for_config(&c);
    let e = lws_yaml(
        &c,
        engine.as_ref(),
        &DeploymentFacts::placeholders(&c),
        &opts(),
    )
    .unwrap_err();
    assert!(matches!(e, ExportError::UnresolvedFacts { .. }), "{e}");
    let e = compose_files(&c, engine.as_ref(), &DeploymentFacts::placeholders(&c)).unwrap_err();
    assert!(
        e.to_string().contains("--fabric-addr worker-1=<IPv4>"),
        "{e}"
    );
}

/// Four ranks as the engine renders them for a world of 4: the TP=2 follower with its rank
/// and world replaced (configs accept two nodes today).
fn four_ranks(c: &ValidatedConfig, engine: &dyn Engine) -> (ContainerSpec, Vec<ContainerSpec>) {
    let specs = engine.rank_containers(c, &resolved(c));
    let (one, mut zero) = (specs[0].clone(), specs[1].clone());
    zero.env.insert("TF_TP_WORLD".into(), "4".into());
    let followers = (1..4usize)
        .map(|r| {
            let mut s = one.clone();
            s.rank = r;
            s.node = format!("spark-{}", r + 1);
            s.name = format!("dsv41-rank{r}");
            s.argv[3] = r.to_string();
            s.argv[4] = "4".into();
            s
        })
        .collect();
    (zero, followers)
}

#[test]
fn four_ranks_one_worker_template_reproduces_each_rank_exactly() {
    let c = config_with(WorkerStorage::Copy);
    let engine = for_config(&c);
    let facts = resolved(&c);
    let (zero, followers) = four_ranks(&c, engine.as_ref());
    let lws = lws::from_specs(&c, engine.as_ref(), &facts, &opts(), &zero, &followers).unwrap();
    let t = &lws.spec.leader_worker_template;
    assert_eq!(t.size.get(), 4);
    let w = engine_container(&t.worker_template);
    let mut table = String::new();
    for f in &followers {
        let argv: Vec<String> = argv_of(w)
            .iter()
            .map(|a| worker::expand(a, &vars(f.rank)))
            .collect();
        let env: BTreeMap<String, String> = env_of(w)
            .into_iter()
            .map(|(k, v)| (k, worker::expand(&v, &vars(f.rank))))
            .collect();
        assert_eq!(argv, f.argv, "index {}", f.rank);
        assert_eq!(env, f.env, "index {}", f.rank);
        table.push_str(&format!(
            "LWS_WORKER_INDEX={}: {}\n",
            f.rank,
            argv.join(" ")
        ));
    }
    table.push_str(&format!("template: {}\n", argv_of(w).join(" ")));
    insta::assert_snapshot!("four_ranks_worker_argv", table);
    // The workers may run on any of the three worker Sparks, one pod per node.
    let na = pod(&t.worker_template).affinity.clone().unwrap();
    let term = &na
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms[0];
    let values = term.match_expressions.clone().unwrap()[1]
        .values
        .clone()
        .unwrap();
    assert_eq!(values, ["1", "2", "3"]);
    assert!(na.pod_anti_affinity.is_some());
}

#[test]
fn a_follower_that_differs_by_more_than_its_rank_refuses_the_export() {
    let c = config_with(WorkerStorage::Copy);
    let engine = for_config(&c);
    let facts = resolved(&c);
    let (zero, mut followers) = four_ranks(&c, engine.as_ref());
    followers[2]
        .env
        .insert("NCCL_SOCKET_IFNAME".into(), "enp9s0".into());
    let e = lws::from_specs(&c, engine.as_ref(), &facts, &opts(), &zero, &followers).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("rank 3 on spark-4")
            && text.contains("env NCCL_SOCKET_IFNAME")
            && text.contains("remedy"),
        "{text}"
    );
    let (zero, mut followers) = four_ranks(&c, engine.as_ref());
    followers[1].mounts[0].source = "/elsewhere/engine".into();
    let e = lws::from_specs(&c, engine.as_ref(), &facts, &opts(), &zero, &followers).unwrap_err();
    assert!(
        e.to_string()
            .contains("rank 2 on spark-3: its mounts differ"),
        "{e}"
    );
}

#[test]
fn a_container_network_cannot_be_exported() {
    let c = config_with(WorkerStorage::Copy);
    let engine = for_config(&c);
    let facts = resolved(&c);
    let specs = engine.rank_containers(&c, &facts);
    let (mut one, zero) = (specs[0].clone(), specs[1].clone());
    one.network_mode = "container:sd-fabric".into();
    let e = lws::from_specs(&c, engine.as_ref(), &facts, &opts(), &zero, &[one]).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("rank 1") && text.contains("network_mode = \"host\""),
        "{text}"
    );
}

#[test]
fn compose_files_reproduce_each_rank_and_say_they_are_not_group_safe() {
    let c = config_with(WorkerStorage::Nfs);
    let engine = for_config(&c);
    let facts = resolved(&c);
    let files = compose_files(&c, engine.as_ref(), &facts).unwrap();
    let specs = engine.rank_containers(&c, &facts);
    assert_eq!(files.len(), 2);
    for (f, spec) in files.iter().zip(&specs) {
        assert!(f.yaml.starts_with("# NOT GROUP-SAFE."), "{}", f.yaml);
        let v: serde_json::Value = serde_norway::from_str(&f.yaml).unwrap();
        let svc = &v["services"][format!("rank{}", spec.rank)];
        let cmd: Vec<String> = serde_json::from_value(svc["command"].clone()).unwrap();
        assert_eq!(cmd, spec.argv);
        assert_eq!(svc["image"], spec.image.as_str());
        assert_eq!(svc["network_mode"], "host");
        assert_eq!(svc["ulimits"]["memlock"]["soft"], -1);
        assert_eq!(svc["entrypoint"], serde_json::json!([]));
    }
    assert_eq!(files[0].file_name, "worker-1.compose.yaml");
    insta::assert_snapshot!("tp2_compose_worker", files[0].yaml);
}
