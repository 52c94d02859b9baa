//! A [`ContainerSpec`] (the plan's data) as the Docker Engine API's create body.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, HostConfigLogConfig,
    ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
};

use crate::container::ContainerSpec;

/// The process namespace of a rank whose node is itself a container (`network_mode =
/// "container:<name>"`, the testbed's Spark): the node's, as on a machine, so the node's restart
/// ends the rank as a reboot would. A rank on a host (`host`) keeps its own.
fn node_pid_mode(network_mode: &str) -> Option<String> {
    network_mode
        .starts_with("container:")
        .then(|| network_mode.to_owned())
}

/// The create body of `spec`: the command is the spec's argv exactly (the image's entrypoint, if
/// any, stays and receives it), mounts as binds, GPUs as a device request.
#[must_use]
pub fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let binds = spec
        .mounts
        .iter()
        .map(|m| {
            format!(
                "{}:{}:{}",
                m.source,
                m.target,
                if m.read_only { "ro" } else { "rw" }
            )
        })
        .collect();
    let device_requests = (spec.gpus == "all").then(|| {
        vec![DeviceRequest {
            driver: Some(String::new()),
            count: Some(-1),
            capabilities: Some(vec![vec!["gpu".to_owned()]]),
            ..DeviceRequest::default()
        }]
    });
    let devices = spec
        .devices
        .iter()
        .map(|d| DeviceMapping {
            path_on_host: Some(d.clone()),
            path_in_container: Some(d.clone()),
            cgroup_permissions: Some("rwm".into()),
        })
        .collect();
    let host_config = HostConfig {
        binds: Some(binds),
        network_mode: Some(spec.network_mode.clone()),
        pid_mode: node_pid_mode(&spec.network_mode),
        ipc_mode: Some(spec.ipc_mode.clone()),
        runtime: Some(spec.runtime.clone()),
        device_requests,
        devices: Some(devices),
        ulimits: Some(
            spec.ulimits
                .iter()
                .map(|u| ResourcesUlimits {
                    name: Some(u.name.clone()),
                    soft: Some(u.soft),
                    hard: Some(u.hard),
                })
                .collect(),
        ),
        cap_add: Some(spec.cap_add.clone()),
        oom_score_adj: Some(spec.oom_score_adj),
        restart_policy: Some(RestartPolicy {
            name: Some(if spec.restart == "no" {
                RestartPolicyNameEnum::NO
            } else {
                RestartPolicyNameEnum::ON_FAILURE
            }),
            maximum_retry_count: None,
        }),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(
                spec.log_opts
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<HashMap<_, _>>(),
            ),
        }),
        ..HostConfig::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: Some(spec.argv.clone()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(
            spec.labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        host_config: Some(host_config),
        ..ContainerCreateBody::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentConfig, EngineProfileName, validate};
    use crate::facts::DeploymentFacts;

    /// After a crash or a reboot only the pair-aware path (`up`, the service units) may start a
    /// rank: Docker restarting one rank on its own would leave a lone rank (a wedged pair).
    #[test]
    fn no_rank_of_any_engine_carries_a_docker_restart_policy() {
        for profile in [EngineProfileName::TensorfoldDsv41] {
            let mut raw = DeploymentConfig::default();
            raw.deployment.engine = profile;
            let config = validate(raw, std::path::Path::new("/home/u")).unwrap();
            let facts = DeploymentFacts::placeholders(&config);
            let specs =
                crate::engine::registry::for_profile(profile).rank_containers(&config, &facts);
            assert_eq!(specs.len(), 2);
            for spec in &specs {
                assert_eq!(spec.restart, "no", "rank {}", spec.rank);
                let policy = create_body(spec)
                    .host_config
                    .unwrap()
                    .restart_policy
                    .unwrap();
                assert_eq!(
                    policy.name,
                    Some(RestartPolicyNameEnum::NO),
                    "rank {}",
                    spec.rank
                );
                assert_eq!(policy.maximum_retry_count, None);
            }
        }
    }

    #[test]
    fn a_rank_on_a_container_node_shares_its_processes_a_rank_on_a_host_does_not() {
        let config =
            validate(DeploymentConfig::default(), std::path::Path::new("/home/u")).unwrap();
        let facts = DeploymentFacts::placeholders(&config);
        let mut spec = crate::engine::for_config(&config)
            .rank_containers(&config, &facts)
            .remove(1);
        let pid = |spec: &ContainerSpec| create_body(spec).host_config.unwrap().pid_mode;
        assert_eq!(spec.network_mode, "host");
        assert_eq!(pid(&spec), None);
        spec.network_mode = "container:sd-testbed-worker-1".into();
        assert_eq!(pid(&spec).as_deref(), Some("container:sd-testbed-worker-1"));
    }
}
