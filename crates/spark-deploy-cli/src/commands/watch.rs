//! `watch`: supervise the running pair (foreground, or `--detach`ed), and its pause lease.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Subcommand};
use spark_deploy_core::lifecycle::watch_state::WatchFiles;
use spark_deploy_core::run::Context;
use spark_deploy_core::supervise;

use super::Global;
use crate::events::TerminalSink;
use crate::exit::{Failure, INTERRUPTED, RUNTIME};
use crate::render;

#[derive(Args, Debug)]
pub(crate) struct WatchArgs {
    /// Run in the background: output to `<state_dir>/watch/watch.log`, pid printed and written
    /// to `<state_dir>/watch/watch.pid`.
    #[arg(long)]
    detach: bool,
    #[command(subcommand)]
    action: Option<WatchAction>,
}

#[derive(Subcommand, Debug)]
enum WatchAction {
    /// Sample but do not act until the lease expires (benchmarks, maintenance): `30m`, `2h`.
    Pause {
        /// How long: `90s`, `30m`, `2h`, `1d`.
        duration: String,
    },
    /// End the pause lease now.
    Resume,
}

/// `watch`, `watch --detach`, `watch pause DURATION`, `watch resume`.
pub(crate) fn run(global: &Global, args: &WatchArgs) -> Result<(), Failure> {
    let config = global.load()?;
    let state_dir = PathBuf::from(&config.config().deployment.state_dir);
    match &args.action {
        Some(WatchAction::Pause { duration }) => {
            let d = supervise::parse_duration(duration).map_err(|e| {
                Failure::usage(
                    e.to_string(),
                    "give the lease's length like `30m`, `2h`, `90s` or `1d`",
                )
            })?;
            let until =
                supervise::pause(&state_dir, d).map_err(|e| Failure::new(RUNTIME, &e, None))?;
            if global.json {
                render::out(&serde_json::json!({"paused_until": until}).to_string());
            } else {
                render::out(&format!(
                    "watch paused until {until} (`spark-deploy watch resume` ends it)"
                ));
            }
            return Ok(());
        }
        Some(WatchAction::Resume) => {
            supervise::resume(&state_dir).map_err(|e| Failure::new(RUNTIME, &e, None))?;
            if !global.json {
                render::out("watch resumed: findings are acted on again");
            }
            return Ok(());
        }
        None => {}
    }
    render::warnings(config.warnings());
    if args.detach {
        return detach(global, &state_dir);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let ctx = Arc::new(Context::new(
        config,
        Arc::new(TerminalSink::new(global.json, global.verbosity)),
    ));
    let interrupted = Arc::new(AtomicBool::new(false));
    let result = rt.block_on(async {
        let (c2, i2) = (Arc::clone(&ctx), Arc::clone(&interrupted));
        let signals = tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            let terminated = async {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                r = tokio::signal::ctrl_c() => if r.is_ok() { i2.store(true, Ordering::SeqCst); },
                () = terminated => {}
            }
            c2.cancel();
        });
        let r = supervise::watch(&ctx).await;
        signals.abort();
        r
    });
    result.map_err(|e| Failure::new(RUNTIME, &e, None))?;
    if interrupted.load(Ordering::SeqCst) {
        if !global.json {
            render::note("interrupted (Ctrl-C): watch ended; the pair keeps running unsupervised");
        }
        return Err(Failure::reported(INTERRUPTED));
    }
    Ok(())
}

/// Starts this command again without `--detach`, in its own process group, output to the
/// watch log; prints its pid.
fn detach(global: &Global, state_dir: &std::path::Path) -> Result<(), Failure> {
    use std::os::unix::process::CommandExt as _;
    let files = WatchFiles::of(state_dir);
    let io = |e: std::io::Error| Failure::new(RUNTIME, &e, None);
    std::fs::create_dir_all(files.dir()).map_err(io)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(files.log())
        .map_err(io)?;
    let exe = std::env::current_exe().map_err(io)?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let child = std::process::Command::new(exe)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(io)?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(io)?;
    let pid = child.id();
    spark_deploy_core::safe_fs::write_exclusive(&files.pid(), format!("{pid}\n")).map_err(io)?;
    if global.json {
        render::out(&serde_json::json!({"pid": pid, "log": files.log()}).to_string());
    } else {
        render::out(&format!(
            "watch runs in the background: pid {pid}, output in {}",
            files.log().display()
        ));
    }
    Ok(())
}
