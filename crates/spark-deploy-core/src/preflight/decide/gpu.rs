//! The GPU side of a node: the container runtime the ranks run under, other containers and
//! processes holding the GPU, the driver and model, and (across nodes) equal clock caps.
//!
//! Whether a rank gets a GPU device request is decided here too, from two facts the node
//! presents: the driver lists a GPU, and the daemon carries the NVIDIA Container Toolkit (its
//! `nvidia` runtime is registered; the toolkit's hook is what serves `--gpus` requests).

use super::{NodeFacts, Settings};
use crate::preflight::report::{Check, CheckResult};
use crate::preflight::{clocks, smi};

/// The runtime the NVIDIA Container Toolkit registers.
const NVIDIA_RUNTIME: &str = "nvidia";

/// The toolkit's registration command.
const TOOLKIT_FIX: &str = "install the NVIDIA Container Toolkit and register it: `sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`";

/// The GPU rows of `f`; whether its rank gets a GPU device request.
pub(super) fn decide(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) -> bool {
    let n = f.name.as_str();
    let toolkit = runtime(s, f, out);
    containers(f, out);
    let listed = driver(f, out);
    processes(f, out);
    if listed && toolkit == Some(false) && s.runtime != NVIDIA_RUNTIME {
        out.push(CheckResult::warn(
            Check::DockerRuntime,
            n,
            format!(
                "the driver lists a GPU but the daemon has no {NVIDIA_RUNTIME} runtime: the ranks (runtime {}) get no GPU device request",
                s.runtime
            ),
            format!("if the engine needs the GPU, {TOOLKIT_FIX}"),
        ));
    }
    listed && toolkit == Some(true)
}

/// The `docker.runtime` row; whether the daemon has the NVIDIA runtime (`None`: unknown).
fn runtime(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) -> Option<bool> {
    let n = f.name.as_str();
    match &f.runtimes {
        Some(Ok(runtimes)) => {
            let observed = format!("ranks use {}; runtimes: {}", s.runtime, runtimes.join(", "));
            out.push(if runtimes.contains(&s.runtime) {
                CheckResult::ok(Check::DockerRuntime, n, observed)
            } else if s.runtime == NVIDIA_RUNTIME {
                CheckResult::fail(Check::DockerRuntime, n, observed, TOOLKIT_FIX)
            } else {
                CheckResult::fail(
                    Check::DockerRuntime,
                    n,
                    observed,
                    format!(
                        "register runtime {} in the daemon's /etc/docker/daemon.json (then `sudo systemctl restart docker`), or set engine.runtime to one of the listed runtimes",
                        s.runtime
                    ),
                )
            });
            Some(runtimes.iter().any(|r| r == NVIDIA_RUNTIME))
        }
        Some(Err(e)) => {
            out.push(CheckResult::fail(
                Check::DockerRuntime,
                n,
                e.clone(),
                format!("`docker info` must answer on {n}: check the daemon's log (`journalctl -u docker`)"),
            ));
            None
        }
        None => None,
    }
}

fn containers(f: &NodeFacts, out: &mut Vec<CheckResult>) {
    let n = f.name.as_str();
    match &f.gpu_containers {
        Some(Ok(names)) if names.is_empty() => {
            out.push(CheckResult::ok(
                Check::GpuContainers,
                n,
                "no other GPU container",
            ));
        }
        Some(Ok(names)) => out.push(CheckResult::fail(
            Check::GpuContainers,
            n,
            format!("running GPU containers: {}", names.join(", ")),
            format!(
                "stop them first: `docker stop {}` (on {n})",
                names.join(" ")
            ),
        )),
        Some(Err(e)) => out.push(CheckResult::fail(
            Check::GpuContainers,
            n,
            e.clone(),
            format!("the Docker daemon on {n} must list and inspect containers: check its log (`journalctl -u docker`)"),
        )),
        None => {}
    }
}

/// The `gpu` row; whether the driver lists at least one GPU.
fn driver(f: &NodeFacts, out: &mut Vec<CheckResult>) -> bool {
    let n = f.name.as_str();
    match (&f.smi, &f.gpu_model) {
        (None, _) => false,
        (Some(Err(e)), _) => {
            out.push(CheckResult::fail(
                Check::Gpu,
                n,
                e.clone(),
                "install the NVIDIA driver; `nvidia-smi` must work on every node (a directory outside the default PATH goes into the node's `path`)",
            ));
            false
        }
        (Some(Ok(_)), Some(Err(e))) => {
            out.push(CheckResult::fail(
                Check::Gpu,
                n,
                e.clone(),
                "`nvidia-smi --query-gpu=name --format=csv,noheader` must work on every node: reinstall the NVIDIA driver",
            ));
            false
        }
        (Some(Ok(_)), None) => {
            out.push(CheckResult::ok(Check::Gpu, n, "nvidia-smi answers"));
            true
        }
        (Some(Ok(_)), Some(Ok(names))) => {
            let names: Vec<&str> = names
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let observed = match names.first() {
                None => "nvidia-smi lists no GPU".to_owned(),
                Some(first) if names.iter().all(|m| m == first) => {
                    format!("{} × {first}", names.len())
                }
                _ => names.join(", "),
            };
            out.push(if names.is_empty() {
                CheckResult::fail(
                    Check::Gpu,
                    n,
                    observed,
                    "the driver sees no GPU: check `nvidia-smi -L` and `dmesg | grep -i nvidia`, reboot after a driver update",
                )
            } else if names.iter().all(|m| m.contains("GB10")) {
                CheckResult::ok(Check::Gpu, n, observed)
            } else {
                CheckResult::warn(
                    Check::Gpu,
                    n,
                    observed,
                    "the engine profile and memory budget are made for the DGX Spark's GB10 (one GPU per node); on other GPUs check the engine's limits by hand before serving",
                )
            });
            !names.is_empty()
        }
    }
}

fn processes(f: &NodeFacts, out: &mut Vec<CheckResult>) {
    let n = f.name.as_str();
    match &f.gpu_processes {
        Some(Ok(csv)) => {
            let procs: Vec<&str> = csv
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            out.push(if procs.is_empty() {
                CheckResult::ok(Check::GpuProcesses, n, "no compute process on the GPU")
            } else if f.own_rank_running {
                CheckResult::ok(
                    Check::GpuProcesses,
                    n,
                    format!(
                        "{} (this deployment's rank, restarted by the launch)",
                        procs.join("; ")
                    ),
                )
            } else {
                CheckResult::fail(
                    Check::GpuProcesses,
                    n,
                    procs.join("; "),
                    format!("stop the processes holding the GPU on {n} (`nvidia-smi` lists them; `kill <pid>` or stop their container)"),
                )
            });
        }
        Some(Err(e)) => out.push(CheckResult::warn(
            Check::GpuProcesses,
            n,
            e.clone(),
            format!("`nvidia-smi --query-compute-apps` failed on {n}; check with `nvidia-smi` by hand that nothing holds the GPU"),
        )),
        None => {}
    }
}

/// Clock caps across the nodes whose driver answered (a node whose `nvidia-smi` failed already
/// has its row).
pub(super) fn compare_clocks(facts: &[NodeFacts]) -> Vec<CheckResult> {
    let answered: Vec<(String, Vec<smi::GpuClocks>)> = facts
        .iter()
        .filter(|f| f.reach.is_ok())
        .filter_map(|f| match &f.smi {
            Some(Ok(t)) => Some((f.name.clone(), smi::parse_clocks(t))),
            _ => None,
        })
        .collect();
    if answered.is_empty() {
        return Vec::new();
    }
    clocks::compare(&answered)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{SMI, healthy, pair, remedy, row, seed};
    use super::*;
    use crate::preflight::decide::decide as decide_all;
    use crate::preflight::report::Verdict;

    #[test]
    fn clock_caps_differ_fails_with_the_lgc_command() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.smi = Some(Ok(SMI.replace("1980 MHz", "1830 MHz")));
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, Check::GpuClocks, "all");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(
            remedy(r).contains("sudo nvidia-smi -lgc 1830,1830"),
            "{r:?}"
        );
    }

    #[test]
    fn no_nvidia_runtime_fails_with_the_toolkit_command() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.runtimes = Some(Ok(vec!["runc".into()]));
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        assert_eq!(row(&d, Check::DockerRuntime, "head").verdict, Verdict::Ok);
        let r = row(&d, Check::DockerRuntime, "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed, "ranks use nvidia; runtimes: runc");
        assert!(remedy(r).contains("nvidia-ctk runtime configure"), "{r:?}");
        assert_eq!(
            (d.detected[0].gpu, d.detected[1].gpu),
            (true, false),
            "no toolkit, no GPU device request"
        );
    }

    #[test]
    fn the_runtime_the_ranks_use_is_the_one_checked() {
        let (a, b) = pair();
        let runc = Settings {
            runtime: "runc".into(),
            ..seed()
        };
        // A daemon without the toolkit passes for ranks under runc, warning that the GPUs the
        // driver lists are not handed to them.
        let mut h = healthy(0, &a);
        h.runtimes = Some(Ok(vec!["io.containerd.runc.v2".into(), "runc".into()]));
        let d = decide_all(&runc, &[h, healthy(1, &b)]);
        let rows: Vec<&CheckResult> = d
            .results
            .iter()
            .filter(|r| r.check == Check::DockerRuntime && r.node == "head")
            .collect();
        assert_eq!(rows.len(), 2, "{rows:#?}");
        assert_eq!(rows[0].verdict, Verdict::Ok);
        assert_eq!(rows[1].verdict, Verdict::Warn);
        assert!(
            rows[1].observed.contains("no GPU device request"),
            "{rows:?}"
        );
        assert!(!d.detected[0].gpu);
        // With the toolkit present, runc ranks get the GPU and no warning.
        assert!(d.detected[1].gpu);
        assert_eq!(
            d.results
                .iter()
                .filter(|r| r.check == Check::DockerRuntime && r.node == "worker-1")
                .count(),
            1
        );
        // A runtime the daemon does not have fails, naming the setting.
        let crun = Settings {
            runtime: "crun".into(),
            ..seed()
        };
        let d = decide_all(&crun, &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, Check::DockerRuntime, "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("engine.runtime"), "{r:?}");
    }

    #[test]
    fn another_gpu_container_or_process_fails_naming_it() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.gpu_containers = Some(Ok(vec!["vllm-old".into()]));
        let mut w = healthy(1, &b);
        w.gpu_processes = Some(Ok("4242, python3, 81920 MiB\n".into()));
        let d = decide_all(&seed(), &[h, w]);
        let r = row(&d, Check::GpuContainers, "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("docker stop vllm-old"), "{r:?}");
        let r = row(&d, Check::GpuProcesses, "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(r.observed.contains("4242, python3"), "{r:?}");
        // This deployment's own running rank is not a conflict (the launch restarts it).
        let mut w = healthy(1, &b);
        w.gpu_processes = Some(Ok("4242, tf-dsv41-lanes, 99000 MiB\n".into()));
        w.own_rank_running = true;
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        assert_eq!(
            row(&d, Check::GpuProcesses, "worker-1").verdict,
            Verdict::Ok
        );
    }

    #[test]
    fn the_gpu_model_is_reported_and_a_non_spark_gpu_warns() {
        let (a, b) = pair();
        let d = decide_all(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, Check::Gpu, "head");
        assert_eq!(
            (r.verdict, r.observed.as_str()),
            (Verdict::Ok, "1 × NVIDIA GB10")
        );
        let mut w = healthy(1, &b);
        w.gpu_model = Some(Ok("NVIDIA H200\nNVIDIA H200\n".into()));
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, Check::Gpu, "worker-1");
        assert_eq!(
            (r.verdict, r.observed.as_str()),
            (Verdict::Warn, "2 × NVIDIA H200")
        );
    }

    #[test]
    fn a_node_without_nvidia_smi_fails_and_gets_no_gpu() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.smi = Some(Err("nvidia-smi: command not found".into()));
        w.gpu_model = Some(Err("nvidia-smi: command not found".into()));
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, Check::Gpu, "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("node's `path`"), "{r:?}");
        assert!(!d.detected[1].gpu);
        // The clocks of the node that answered are still reported.
        assert!(d.results.iter().any(|r| r.check == Check::GpuClocks));
        let mut w = healthy(1, &b);
        w.gpu_model = Some(Ok(String::new()));
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        assert_eq!(row(&d, Check::Gpu, "worker-1").verdict, Verdict::Fail);
    }
}
