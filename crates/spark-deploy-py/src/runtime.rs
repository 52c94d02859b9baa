//! One tokio runtime shared by every call, created on first use and recreated in a forked child
//! (a runtime's worker threads do not survive `fork`; the parent's runtime is leaked there, never
//! dropped, since dropping it would wait for threads that do not exist).

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::PyResult;
use tokio::runtime::{Builder, Runtime};

use crate::errors::SparkDeployError;

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// The shared runtime of this process.
pub(crate) fn get() -> PyResult<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, rt)) = slot.as_ref()
        && *owner == pid
    {
        return Ok(rt.clone());
    }
    if let Some((_, stale)) = slot.take() {
        // Inherited through fork: its threads are gone in this process.
        std::mem::forget(stale);
    }
    let rt = Arc::new(
        Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("spark-deploy")
            .enable_all()
            .build()
            .map_err(|e| {
                SparkDeployError::new_err(format!("cannot start the tokio runtime: {e}"))
            })?,
    );
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}
