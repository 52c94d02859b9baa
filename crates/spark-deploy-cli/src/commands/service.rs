//! `spark-deploy service install|uninstall|status|boot|wait`: reboot persistence through systemd
//! units on the head (docs/operations.md, "After a reboot").

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::run::Context;
use spark_deploy_core::service::{self, SYSTEM_UNIT_DIR, UnitInputs};

use super::Global;
use crate::events::TerminalSink;
use crate::exit::{Failure, NOT_SERVING, RUNTIME};
use crate::render;

#[derive(Subcommand, Debug)]
pub(crate) enum ServiceCommand {
    /// Write the pair-aware systemd units on the head and enable them (when systemd runs and
    /// the unit directory is the system one): after boot they wait for the fabric link and the
    /// worker's SSH, bring the pair up worker-first, then watch it.
    Install(InstallArgs),
    /// Disable and remove the units (the running pair is left as it is).
    Uninstall(UnitDirArgs),
    /// Whether the units are installed and current, enabled and active; the stop marker.
    Status(UnitDirArgs),
    /// What the main unit runs: wait for the link and the workers' SSH, `up` (unless the stop
    /// marker says to stay down), then `watch` in the foreground.
    Boot(BootArgs),
    /// What the link unit runs: wait until the head's fabric netdev is up and every worker
    /// answers on its fabric address and over SSH.
    Wait(WaitArgs),
}

#[derive(Args, Debug)]
pub(crate) struct UnitDirArgs {
    /// Where the unit files live.
    #[arg(long, value_name = "DIR", default_value = SYSTEM_UNIT_DIR)]
    unit_dir: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct InstallArgs {
    #[command(flatten)]
    dir: UnitDirArgs,
    /// The spark-deploy executable the units run (default: this one).
    #[arg(long, value_name = "PATH")]
    bin: Option<PathBuf>,
    /// The user the units run as (default: the current user; its SSH keys and state dir are used).
    #[arg(long)]
    user: Option<String>,
    /// How long the link unit waits for the pair after boot, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    wait_timeout: u64,
}

#[derive(Args, Debug)]
pub(crate) struct WaitArgs {
    /// Give up after this many seconds (exit 5).
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    timeout: u64,
}

#[derive(Args, Debug)]
pub(crate) struct BootArgs {
    #[command(flatten)]
    wait: WaitArgs,
    /// Stop after the pair serves instead of running `watch`.
    #[arg(long)]
    no_watch: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_owned())
    })
}

/// systemd manages this machine (`/run/systemd/system` exists, as `sd_booted` checks).
fn systemd_runs() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Units in `dir` are activated by `systemctl` only when `dir` is the system unit directory and
/// systemd runs.
fn activates(dir: &Path) -> bool {
    absolute(dir) == Path::new(SYSTEM_UNIT_DIR) && systemd_runs()
}

fn systemctl(args: &[&str]) -> Result<String, String> {
    match std::process::Command::new("systemctl").args(args).output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned()),
        Ok(o) => Err(format!(
            "systemctl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&o.stdout).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("systemctl: {e}")),
    }
}

fn current_user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            std::process::Command::new("id")
                .arg("-un")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .filter(|u| !u.is_empty())
        })
        .unwrap_or_else(|| "root".into())
}

fn inputs(global: &Global, args: &InstallArgs) -> Result<UnitInputs, Failure> {
    let binary = match &args.bin {
        Some(b) => absolute(b),
        None => std::env::current_exe().map_err(|e| Failure::new(RUNTIME, &e, None))?,
    };
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
    Ok(UnitInputs {
        binary,
        config: global.config_path().map(|p| absolute(&p)),
        user: args.user.clone().unwrap_or_else(current_user),
        home,
        wait_timeout_s: args.wait_timeout,
    })
}

/// The units for `config` as `install` would write them now (for `uninstall` and `status`, the
/// names are what matter).
fn units_now(global: &Global, config: &ValidatedConfig) -> Result<Vec<service::Unit>, Failure> {
    let args = InstallArgs {
        dir: UnitDirArgs {
            unit_dir: SYSTEM_UNIT_DIR.into(),
        },
        bin: None,
        user: None,
        wait_timeout: 900,
    };
    Ok(service::units(config, &inputs(global, &args)?))
}

fn io_failure(e: &service::ServiceError) -> Failure {
    Failure::new(RUNTIME, e, None)
}

pub(crate) fn run(global: &Global, cmd: &ServiceCommand) -> Result<(), Failure> {
    match cmd {
        ServiceCommand::Install(args) => install(global, args),
        ServiceCommand::Uninstall(args) => uninstall(global, args),
        ServiceCommand::Status(args) => status(global, args),
        ServiceCommand::Boot(args) => boot(global, args),
        ServiceCommand::Wait(args) => wait(global, args),
    }
}

fn install(global: &Global, args: &InstallArgs) -> Result<(), Failure> {
    let config = global.load()?;
    render::warnings(config.warnings());
    if global.config_path().is_none() {
        render::note(
            "warning: no config file: the units run `spark-deploy` with the built-in defaults \
             (pass --config FILE to install for a file)",
        );
    }
    let inputs = inputs(global, args)?;
    let units = service::units(&config, &inputs);
    let paths = service::write_units(&args.dir.unit_dir, &units).map_err(|e| io_failure(&e))?;
    let main = service::main_unit(&config);
    let mut next = Vec::new();
    let enabled = if activates(&args.dir.unit_dir) {
        systemctl(&["daemon-reload"])
            .and_then(|_| systemctl(&["enable", &main]))
            .map_err(|e| Failure::msg(RUNTIME, e, Some("run the command as root".into())))?;
        next.push(format!(
            "systemctl start {main}   # now, instead of at the next boot"
        ));
        true
    } else {
        next.push(format!(
            "systemd does not run here or {} is not {SYSTEM_UNIT_DIR}: copy the files into \
             {SYSTEM_UNIT_DIR} on the head, then: systemctl daemon-reload && systemctl enable {main}",
            args.dir.unit_dir.display()
        ));
        false
    };
    if global.json {
        render::out(
            &serde_json::json!({
                "units": paths,
                "enabled": enabled,
                "next": next,
            })
            .to_string(),
        );
    } else {
        let mut out = String::new();
        for p in &paths {
            out.push_str(&format!("wrote {}\n", p.display()));
        }
        if enabled {
            out.push_str(&format!(
                "enabled {main}: after every boot it waits for the fabric link and the worker's \
                 SSH, brings the pair up worker-first, then watches it\n"
            ));
        }
        for n in &next {
            out.push_str(&format!("next: {n}\n"));
        }
        render::out(&out);
    }
    Ok(())
}

fn uninstall(global: &Global, args: &UnitDirArgs) -> Result<(), Failure> {
    let config = global.load()?;
    let units = units_now(global, &config)?;
    let main = service::main_unit(&config);
    let systemd = activates(&args.unit_dir);
    if systemd {
        // Disabling the unit and stopping its watch leaves the running pair serving.
        systemctl(&["disable", "--now", &main])
            .map_err(|e| Failure::msg(RUNTIME, e, Some("run the command as root".into())))?;
    }
    let removed = service::remove_units(&args.unit_dir, &units).map_err(|e| io_failure(&e))?;
    if systemd {
        systemctl(&["daemon-reload"]).map_err(|e| Failure::msg(RUNTIME, e, None))?;
    }
    if global.json {
        render::out(&serde_json::json!({ "removed": removed, "disabled": systemd }).to_string());
    } else if removed.is_empty() {
        render::out(&format!(
            "no unit of {} in {}: nothing to remove",
            config.config().deployment.name,
            args.unit_dir.display()
        ));
    } else {
        let mut out = String::new();
        for p in &removed {
            out.push_str(&format!("removed {}\n", p.display()));
        }
        out.push_str("the running pair (if any) was left as it is; `spark-deploy down` stops it\n");
        render::out(&out);
    }
    Ok(())
}

fn status(global: &Global, args: &UnitDirArgs) -> Result<(), Failure> {
    let config = global.load()?;
    let units = units_now(global, &config)?;
    let found = service::installed(&args.unit_dir, &units);
    let systemd = activates(&args.unit_dir);
    let state = |verb: &str, unit: &str| {
        systemd.then(|| {
            std::process::Command::new("systemctl")
                .args([verb, unit])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_else(|e| e.to_string())
        })
    };
    let main = service::main_unit(&config);
    let enabled = state("is-enabled", &main);
    let active: Vec<(String, Option<String>)> = units
        .iter()
        .map(|u| (u.name.clone(), state("is-active", &u.name)))
        .collect();
    let state_dir = PathBuf::from(&config.config().deployment.state_dir);
    let stop = service::stop_marker(&state_dir);
    if global.json {
        render::out(
            &serde_json::json!({
                "units": found,
                "systemd": systemd,
                "enabled": enabled,
                "active": active.iter().map(|(n, a)| serde_json::json!({"unit": n, "active": a})).collect::<Vec<_>>(),
                "stop_marker": stop,
            })
            .to_string(),
        );
    } else {
        let mut out = String::new();
        for u in &found {
            let what = match (u.present, u.current) {
                (false, _) => "not installed",
                (true, true) => "installed",
                (true, false) => "installed, stale (`service install` rewrites it)",
            };
            out.push_str(&format!("{}: {what}\n", u.path.display()));
        }
        if systemd {
            out.push_str(&format!("{main}: {}\n", enabled.as_deref().unwrap_or("?")));
            for (n, a) in &active {
                out.push_str(&format!("{n}: {}\n", a.as_deref().unwrap_or("?")));
            }
        } else {
            out.push_str("systemd does not manage this directory here: enabled/active unknown\n");
        }
        match &stop {
            Some(r) => out.push_str(&format!(
                "stop marker: set ({r}): after boot the pair stays down\n"
            )),
            None => out.push_str("stop marker: none\n"),
        }
        render::out(&out);
    }
    if found.iter().all(|u| u.present) {
        Ok(())
    } else {
        Err(Failure::reported(NOT_SERVING))
    }
}

async fn wait_pair(ctx: &Context, timeout: u64) -> Result<(), Failure> {
    let ready = service::wait_for_pair(ctx, Duration::from_secs(timeout))
        .await
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    render::note(&format!(
        "the pair is reachable ({:.1} s): {}",
        ready.waited_s,
        ready
            .probes
            .iter()
            .map(|p| p.what.clone())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(())
}

fn wait(global: &Global, args: &WaitArgs) -> Result<(), Failure> {
    let config = global.load()?;
    let rt = runtime()?;
    let ctx = Context::new(
        config,
        Arc::new(TerminalSink::new(global.json, global.verbosity)),
    );
    rt.block_on(wait_pair(&ctx, args.timeout))
}

fn boot(global: &Global, args: &BootArgs) -> Result<(), Failure> {
    let config = global.load()?;
    render::warnings(config.warnings());
    let state_dir = PathBuf::from(&config.config().deployment.state_dir);
    if let Some(reason) = service::stop_marker(&state_dir) {
        render::note(&format!(
            "staying down: {reason} (the stop marker {} survives reboots; `spark-deploy up` \
             brings the pair back and `watch` clears it)",
            state_dir
                .join(service::WATCH_DIR)
                .join(service::STOP_MARKER)
                .display()
        ));
        return Ok(());
    }
    super::run::key_agrees(&config)?;
    let rt = runtime()?;
    rt.block_on(async {
        let ctx = Context::new(
            config.clone(),
            Arc::new(TerminalSink::new(global.json, global.verbosity)),
        );
        wait_pair(&ctx, args.wait.timeout).await?;
        let why = match service::serving(&ctx, Duration::from_secs(60)).await {
            Ok(()) => {
                render::note("the pair is already serving: nothing to bring up");
                return Ok(());
            }
            Err(why) => why,
        };
        // `restart`: whatever survived the reboot is stopped (rank 0 first) before both start,
        // rank 1 before rank 0; on an absent pair its stop has nothing to do.
        render::note(&format!(
            "the pair does not serve ({why}): bringing it up (followers before rank 0)"
        ));
        let plan = Plan::for_verb(&config, super::run::Which::Restart);
        let (_, mut result, mut interrupted) = super::run::run_logged(global, &config, &plan).await;
        // A launch or smoke that failed stopped every rank (all or none): one more try
        // starts both afresh.
        if let Err(e) = &result
            && !interrupted
            && matches!(e.failure.step, StepKind::LaunchRank | StepKind::Smoke)
        {
            render::note("the pair did not come up; both ranks are stopped: trying once more");
            (_, result, interrupted) = super::run::run_logged(global, &config, &plan).await;
        }
        result
            .map(drop)
            .map_err(|e| super::run::failure(&e, interrupted, global.json))
    })?;
    if args.no_watch {
        return Ok(());
    }
    exec_watch(global)
}

/// Replaces this process with `spark-deploy [--config FILE] watch` (systemd keeps supervising
/// the same process).
fn exec_watch(global: &Global) -> Result<(), Failure> {
    use std::os::unix::process::CommandExt as _;
    let exe = std::env::current_exe().map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(c) = global.config_path() {
        cmd.arg("--config").arg(absolute(&c));
    }
    cmd.arg("watch");
    render::note("the pair serves: watching it (`spark-deploy watch`)");
    let e = cmd.exec();
    Err(Failure::new(
        RUNTIME,
        &e,
        Some("`spark-deploy watch` could not start; the pair keeps serving unwatched".into()),
    ))
}
