//! A client that asks the deployment's API for one token every 50 ms and remembers which answers
//! were good: how the upgrade tests and `bench-upgrade` measure downtime as a user sees it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spark_deploy_core::config::ValidatedConfig;

/// How often the poller asks.
pub const EVERY: Duration = Duration::from_millis(50);

/// A running poller.
pub struct Poller {
    seen: Arc<Mutex<Vec<(Instant, bool)>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// Errors of starting a poller.
#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    /// The deployment's API key could not be read.
    #[error("the API key of the deployment: {0}")]
    Key(#[from] spark_deploy_core::lifecycle::api_key::ApiKeyError),
    /// No HTTP client.
    #[error("HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

impl Poller {
    /// Starts polling `v`'s API on loopback (needs a Tokio runtime).
    ///
    /// # Errors
    ///
    /// [`PollerError`] when the key cannot be read or the client not built.
    pub fn start(v: &ValidatedConfig) -> Result<Self, PollerError> {
        let key = spark_deploy_core::lifecycle::api_key::read(Path::new(
            &v.config().serving.api_key_file,
        ))?;
        let url = format!(
            "http://127.0.0.1:{}/v1/chat/completions",
            v.config().serving.port
        );
        let model = v.config().model.served_name.clone();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (Arc::clone(&seen), Arc::clone(&stop));
        let task = tokio::spawn(async move {
            while !stop2.load(Ordering::SeqCst) {
                let ok = client
                    .post(&url)
                    .bearer_auth(key.expose())
                    .json(&serde_json::json!({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "Say OK."}]}))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                s2.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((Instant::now(), ok));
                tokio::time::sleep(EVERY).await;
            }
        });
        Ok(Self { seen, stop, task })
    }

    fn answers(&self) -> Vec<(Instant, bool)> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The first good answer at or after `t`.
    #[must_use]
    pub fn first_good_after(&self, t: Instant) -> Option<Instant> {
        self.answers()
            .into_iter()
            .find(|(at, ok)| *ok && *at >= t)
            .map(|(at, _)| at)
    }

    /// The longest gap between two good answers within `[from, to]`, seconds, and whether the
    /// last answer by `to` was good.
    #[must_use]
    pub fn gap(&self, from: Instant, to: Instant) -> (f64, bool) {
        let seen = self.answers();
        let good: Vec<Instant> = seen
            .iter()
            .filter(|(t, ok)| *ok && *t >= from && *t <= to)
            .map(|(t, _)| *t)
            .collect();
        let gap = good
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64())
            .fold(0.0, f64::max);
        let last_good = seen
            .iter()
            .rev()
            .find(|(t, _)| *t <= to)
            .is_some_and(|(_, ok)| *ok);
        (gap, last_good)
    }

    /// Stops polling.
    pub async fn end(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
    }
}
