//! The order a fetch downloads its blobs in, and the stream that hands a freed download slot its
//! next blob (choosing only once a slot is free): small files first (a consumer running
//! alongside plans from them), then the large ones by name, except that a file the consumer
//! wants first jumps the queue ([`FetchProgress::wanted_first`]); while a consumer that will say
//! what it wants has not said it yet, a large file waits a few seconds at most.

use std::time::{Duration, Instant};

use super::fetch::Job;
use super::progress::FetchProgress;

/// Files below this size are "small": a consumer plans from them (config, index, tokenizer).
const SMALL_FILE: u64 = 16 << 20;

/// How long a large file waits, at most, for an undecided consumer's wish
/// ([`FetchProgress::wanted_first`] is `None`).
const WISH_WAIT: Duration = Duration::from_secs(3);

/// The blobs still waiting (indices into the fetch's order), as a stream of the next one to
/// start together with the download slot it starts in. The stream first waits for a free slot
/// and only then chooses, so a file the consumer wants first jumps the queue at the moment a
/// slot frees (not when an earlier file was chosen); while the consumer is undecided a large file
/// waits (up to `undecided_until`). A closed semaphore (the fetch is over) ends the stream.
pub(super) struct Picks<'a> {
    waiting: std::collections::VecDeque<(usize, u64, &'a [String])>,
    progress: &'a dyn FetchProgress,
    slots: tokio_util::sync::PollSemaphore,
    undecided_until: Instant,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<'a> Picks<'a> {
    /// The jobs of `order` (indices into it), for a fetch reporting to `progress` whose transfers
    /// each hold one of `slots`.
    pub(super) fn new(
        order: &[&'a Job],
        progress: &'a dyn FetchProgress,
        slots: std::sync::Arc<tokio::sync::Semaphore>,
    ) -> Self {
        Self {
            waiting: order
                .iter()
                .enumerate()
                .map(|(i, j)| (i, j.size, j.paths.as_slice()))
                .collect(),
            progress,
            slots: tokio_util::sync::PollSemaphore::new(slots),
            undecided_until: Instant::now() + WISH_WAIT,
            slot: None,
            sleep: None,
        }
    }

    /// The next index to start; `Err(())` to wait a moment for the consumer.
    fn pick(&mut self) -> Result<Option<usize>, ()> {
        let Some(&(_, size, _)) = self.waiting.front() else {
            return Ok(None);
        };
        let at = match self.progress.wanted_first() {
            Some(wanted) => wanted
                .iter()
                .find_map(|p| {
                    self.waiting
                        .iter()
                        .position(|(_, _, paths)| paths.contains(p))
                })
                .unwrap_or(0),
            None if size < SMALL_FILE || Instant::now() >= self.undecided_until => 0,
            None => return Err(()),
        };
        Ok(self.waiting.remove(at).map(|(i, _, _)| i))
    }
}

impl futures::Stream for Picks<'_> {
    type Item = (usize, tokio::sync::OwnedSemaphorePermit);

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.waiting.is_empty() {
            return std::task::Poll::Ready(None);
        }
        if self.slot.is_none() {
            match std::task::ready!(self.slots.poll_acquire(cx)) {
                Some(slot) => self.slot = Some(slot),
                None => return std::task::Poll::Ready(None),
            }
        }
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.pick() {
                Ok(next) => {
                    let slot = self.slot.take();
                    return std::task::Poll::Ready(next.zip(slot));
                }
                Err(()) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(Duration::from_millis(20))));
                }
            }
        }
    }
}

/// The order blobs are fetched in: the small files first, smallest first (a consumer plans from
/// them, so they should be final early), then the large ones by name: a checkpoint's shards in
/// index order, so the shards that hold the start of a rank file land first and the file's
/// finished prefix (hashed, and sent to its worker, while the rest downloads) grows early
/// rather than all at the end.
pub(super) fn download_order(job: &Job) -> (bool, u64, &[String]) {
    let large = job.size >= SMALL_FILE;
    (large, if large { 0 } else { job.size }, &job.paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::verify::Expected;

    #[test]
    fn small_files_first_by_size_then_large_ones_by_name() {
        let files = [
            ("model-00002-of-00003.safetensors", 300 << 20),
            ("tokenizer.json", 9 << 20),
            ("model-00001-of-00003.safetensors", 310 << 20),
            ("config.json", 2 << 10),
            ("model-00003-of-00003.safetensors", 100 << 20),
            ("model.safetensors.index.json", 40 << 10),
        ];
        let mut jobs: Vec<Job> = files
            .iter()
            .map(|(p, s)| Job {
                etag: String::new(),
                paths: vec![(*p).to_owned()],
                size: *s,
                expected: Expected::default(),
            })
            .collect();
        jobs.sort_by(|a, b| download_order(a).cmp(&download_order(b)));
        let order: Vec<&str> = jobs.iter().map(|j| j.paths[0].as_str()).collect();
        assert_eq!(
            order,
            [
                "config.json",
                "model.safetensors.index.json",
                "tokenizer.json",
                "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors",
            ]
        );
    }
}
