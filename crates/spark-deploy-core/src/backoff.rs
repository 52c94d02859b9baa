//! Retrying with exponential backoff: the one policy for every retried request.
//!
//! After the n-th consecutive failure the wait is `base · 2^(n-1)`, at most `max`; after
//! `retries` retries (so `retries + 1` failed tries in a row) the caller gives up. A transfer that
//! made progress starts counting again ([`Attempts::progressed`]).

use std::future::Future;
use std::time::Duration;

/// The policy: first wait, longest wait, retries allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure; it doubles per consecutive failure.
    pub base: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Retries allowed after consecutive failures before giving up.
    pub retries: u32,
}

impl Backoff {
    /// The wait after the `failure`-th consecutive failure (counted from 1).
    #[must_use]
    pub fn delay(&self, failure: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << failure.saturating_sub(1).min(16))
            .min(self.max)
    }

    /// A fresh count of consecutive failures under this policy.
    #[must_use]
    pub fn attempts(self) -> Attempts {
        Attempts {
            policy: self,
            failures: 0,
        }
    }

    /// Run `op` until it succeeds, fails with an error `transient` does not accept, or the
    /// retries are spent, waiting [`Backoff::delay`] between tries.
    ///
    /// # Errors
    /// The first error that is not transient, else the last transient one.
    pub async fn retry<T, E, Fut>(
        &self,
        mut op: impl FnMut() -> Fut,
        transient: impl Fn(&E) -> bool,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let mut attempts = self.attempts();
        loop {
            match op().await {
                Err(e) if transient(&e) => match attempts.failed() {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }
}

/// Consecutive failures counted under a [`Backoff`].
#[derive(Debug, Clone)]
pub struct Attempts {
    policy: Backoff,
    failures: u32,
}

impl Attempts {
    /// Record a failure: the wait before the next try, or `None` when the retries are spent.
    pub fn failed(&mut self) -> Option<Duration> {
        self.failures += 1;
        (self.failures <= self.policy.retries).then(|| self.policy.delay(self.failures))
    }

    /// The last try made progress: count failures from zero again.
    pub fn progressed(&mut self) {
        self.failures = 0;
    }

    /// Consecutive failures so far.
    #[must_use]
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const POLICY: Backoff = Backoff {
        base: Duration::from_millis(500),
        max: Duration::from_secs(30),
        retries: 6,
    };

    #[test]
    fn waits_double_up_to_the_ceiling() {
        let waits: Vec<u64> = (1..=8)
            .map(|n| POLICY.delay(n).as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
        );
        // No overflow far beyond the ceiling.
        assert_eq!(POLICY.delay(u32::MAX), POLICY.max);
    }

    #[test]
    fn gives_up_after_the_retries_and_restarts_on_progress() {
        let mut a = POLICY.attempts();
        for n in 1..=6 {
            assert_eq!(a.failed(), Some(POLICY.delay(n)));
        }
        assert_eq!(a.failed(), None);
        assert_eq!(a.failures(), 7);
        a.progressed();
        assert_eq!(a.failed(), Some(POLICY.base));
    }

    /// Runs `retry` over `answers` (one per try, the last repeated) and counts the tries.
    async fn tries(answers: &[Result<u32, &'static str>]) -> (Result<u32, &'static str>, usize) {
        let quick = Backoff {
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
            retries: 2,
        };
        let n = Cell::new(0);
        let r = quick
            .retry(
                || {
                    let i = n.get();
                    n.set(i + 1);
                    let a = answers[i.min(answers.len() - 1)];
                    async move { a }
                },
                |e| *e == "busy",
            )
            .await;
        (r, n.get())
    }

    #[tokio::test]
    async fn retry_stops_at_a_permanent_error_or_after_the_retries() {
        assert_eq!(tries(&[Err("busy")]).await, (Err("busy"), 3));
        assert_eq!(tries(&[Err("gone")]).await, (Err("gone"), 1));
        assert_eq!(tries(&[Err("busy"), Err("busy"), Ok(7)]).await, (Ok(7), 3));
        assert_eq!(
            tries(&[Err("busy"), Err("gone"), Ok(7)]).await,
            (Err("gone"), 2)
        );
    }
}
