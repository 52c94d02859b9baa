//! Events from the core's sink to Python: a channel the calling thread drains, so callbacks run
//! on the thread that called `run`, with the GIL, never on a runtime thread.

use std::future::Future;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use pyo3::prelude::*;
use spark_deploy_core::event::{Event, EventSink};

/// How often the calling thread wakes up to check for Ctrl-C.
const POLL: Duration = Duration::from_millis(50);

/// What the runtime sends to the calling thread.
pub(crate) enum Msg<T> {
    /// An event for the callback.
    Event(Event),
    /// The work ended.
    Done(T),
    /// The work panicked (a bug): the message.
    Panicked(String),
}

/// A sink forwarding events into the channel.
pub(crate) struct ChannelSink<T>(Mutex<Sender<Msg<T>>>);

impl<T: Send> EventSink for ChannelSink<T> {
    fn emit(&self, event: Event) {
        if let Ok(tx) = self.0.lock() {
            let _ = tx.send(Msg::Event(event));
        }
    }
}

/// A channel and its sink.
pub(crate) fn channel_sink<T: Send>() -> (ChannelSink<T>, Sender<Msg<T>>, Receiver<Msg<T>>) {
    let (tx, rx) = channel();
    (ChannelSink(Mutex::new(tx.clone())), tx, rx)
}

/// An event as a dict: the JSON line's object (`schema`, `ts_ms`, `event`, the fields).
pub(crate) fn to_dict<'py>(py: Python<'py>, event: &Event) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?
        .call_method1("loads", (event.to_json_line(),))
}

/// Runs the future `make()` builds on the shared runtime while this thread, with the GIL released between
/// messages, delivers events to `on_event` and checks for signals.
///
/// `cancel_flag` (a `threading.Event`) cancels the run when set; the run's result follows.
/// On an exception from a signal handler (KeyboardInterrupt) or from the callback, `cancel` is
/// called, the work is awaited to its end (events are then dropped), and the exception returned.
pub(crate) fn drive<T, M, F>(
    py: Python<'_>,
    rx: Receiver<Msg<T>>,
    tx: Sender<Msg<T>>,
    make: M,
    on_event: Option<&Bound<'_, PyAny>>,
    cancel_flag: Option<&Bound<'_, PyAny>>,
    cancel: &dyn Fn(),
) -> PyResult<T>
where
    T: Send + 'static,
    M: FnOnce() -> F + Send + 'static,
    F: Future<Output = T>,
{
    let rt = crate::runtime::get()?;
    // The future is built and driven on its own thread (`block_on` on the shared runtime), so
    // it need not be `Send`; its tasks run on the runtime's workers.
    std::thread::Builder::new()
        .name("spark-deploy-run".into())
        .spawn(move || {
            let out =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(make())));
            let _ = tx.send(match out {
                Ok(out) => Msg::Done(out),
                Err(p) => Msg::Panicked(
                    p.downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into()),
                ),
            });
        })
        .map_err(|e| crate::errors::SparkDeployError::new_err(e.to_string()))?;
    let mut pending: Option<PyErr> = None;
    // Once the flag is seen the run is cancelled; its result (the cancelled step's error) is
    // returned as usual.
    let mut cancel_flag_seen = false;
    let mut rx = rx;
    loop {
        let block = pending.is_some();
        let (msg, back) = py.detach(move || {
            let msg = if block {
                rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                rx.recv_timeout(POLL)
            };
            (msg, rx)
        });
        rx = back;
        match msg {
            Ok(Msg::Done(out)) => {
                return match pending {
                    Some(e) => Err(e),
                    None => Ok(out),
                };
            }
            Ok(Msg::Panicked(message)) => {
                return Err(pending.unwrap_or_else(|| {
                    crate::errors::SparkDeployError::new_err(format!(
                        "spark-deploy bug: the run panicked: {message}"
                    ))
                }));
            }
            Ok(Msg::Event(ev)) => {
                if pending.is_none()
                    && let Some(cb) = on_event
                    && let Err(e) = to_dict(py, &ev).and_then(|d| cb.call1((d,)))
                {
                    cancel();
                    pending = Some(e);
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(pending.unwrap_or_else(|| {
                    crate::errors::SparkDeployError::new_err("the run ended without a result")
                }));
            }
        }
        if pending.is_none()
            && let Err(e) = py.check_signals()
        {
            cancel();
            pending = Some(e);
        }
        if pending.is_none()
            && !cancel_flag_seen
            && let Some(flag) = cancel_flag
        {
            match flag.call_method0("is_set").and_then(|v| v.is_truthy()) {
                Ok(false) => {}
                Ok(true) => {
                    cancel();
                    cancel_flag_seen = true;
                }
                Err(e) => {
                    cancel();
                    pending = Some(e);
                }
            }
        }
    }
}

/// A boxed error from a Rust future.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `work` on the shared runtime with the GIL released; Ctrl-C abandons it and re-raises.
pub(crate) fn block<T: Send + 'static>(
    py: Python<'_>,
    work: impl Future<Output = Result<T, BoxError>> + Send + 'static,
) -> PyResult<T> {
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let work = move || async move {
        tokio::select! {
            r = work => r,
            () = s.notified() => Err("interrupted".into()),
        }
    };
    let (sink, tx, rx) = channel_sink::<Result<T, BoxError>>();
    drop(sink);
    drive(py, rx, tx, work, None, None, &|| stop.notify_one())?
        .map_err(|e| crate::errors::SparkDeployError::new_err(e.to_string()))
}
