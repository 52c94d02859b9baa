//! The `[lifecycle]`, `[watch]` and `[storage]` checks: timeouts, the watchdog's sampling and heal
//! budget, and where the workers find the model tree.

use super::Checker;
use crate::config::schema::{DeploymentConfig, WorkerStorage};

pub(super) fn lifecycle(c: &mut Checker, config: &DeploymentConfig) {
    // [lifecycle]
    let l = &config.lifecycle;
    c.range(
        "lifecycle.min_avail_gib",
        l.min_avail_gib,
        1,
        128,
        " (a Spark has 128 GB)",
    );
    c.range("lifecycle.log_keep", l.log_keep, 0, 1000, "");
    c.range("lifecycle.keep_generations", l.keep_generations, 0, 100, "");
    c.range(
        "lifecycle.ready_timeout_s",
        l.ready_timeout_s,
        1,
        86_400,
        "",
    );
    c.range("lifecycle.stop_timeout_s", l.stop_timeout_s, 1, 3600, "");

    // [watch]
    let w = &config.watch;
    c.range("watch.interval_s", w.interval_s, 0.2, 60.0, " seconds");
    c.range("watch.wedge_s", w.wedge_s, 1.0, 3600.0, " seconds");
    c.range(
        "watch.probe_idle_s",
        w.probe_idle_s,
        1.0,
        86_400.0,
        " seconds",
    );
    c.range(
        "watch.probe_timeout_s",
        w.probe_timeout_s,
        1.0,
        600.0,
        " seconds",
    );
    c.range(
        "watch.memory_floor_gib",
        w.memory_floor_gib,
        0.0,
        128.0,
        " GiB (a Spark has 128 GB)",
    );
    c.range("watch.max_heals_per_hour", w.max_heals_per_hour, 0, 60, "");
    c.range(
        "watch.heal_stop_grace_s",
        w.heal_stop_grace_s,
        0,
        600,
        " seconds",
    );
    if w.wedge_s < 2.0 * w.interval_s {
        c.refuse(
            "watch.wedge_s",
            w.wedge_s,
            format!(
                "at least two samples: >= 2 × watch.interval_s ({})",
                2.0 * w.interval_s
            ),
        );
    }

    // [storage]
    if config.storage.nfs_volume.is_empty() {
        c.refuse(
            "storage.nfs_volume",
            "\"\"",
            "a Docker volume name (set deployment.worker_storage = \"copy\" for no NFS)",
        );
    } else if config.storage.nfs_volume.starts_with('/') {
        c.refuse(
            "storage.nfs_volume",
            &config.storage.nfs_volume,
            "a Docker volume name; for a tree already on the worker set deployment.worker_storage = \"local\" and storage.worker_tree to that path (NFS_VOLUME=<absolute path> does both)",
        );
    }
    if config.deployment.worker_storage == WorkerStorage::Local
        && !config.storage.worker_tree.starts_with('/')
    {
        c.refuse(
            "storage.worker_tree",
            format!("{:?}", config.storage.worker_tree),
            "the absolute path of the worker's HF cache tree (holding hub/models--…), required by deployment.worker_storage = \"local\"",
        );
    }
}
