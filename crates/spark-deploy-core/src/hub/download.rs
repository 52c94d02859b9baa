//! One blob's transfer: resume the `.incomplete` file with ranged GETs, retry under the Hub's
//! backoff, hash while writing, verify, and rename into the cache.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::io::AsyncWriteExt as _;

use super::client::{Hub, ResolvedRepo};
use super::fetch::{FetchError, Job, Tally, cancelled};
use super::progress::{FetchEvent, FileOutcome};
use super::snapshot;
use super::verify::{self, Expected, StreamHasher, VerifyError};

/// What one blob transfer writes, and what it must become.
#[derive(Clone, Copy)]
struct Target<'a> {
    r: &'a ResolvedRepo,
    file: &'a str,
    incomplete: &'a Path,
    size: u64,
    exp: &'a Expected,
}

enum Attempt {
    Complete,
    Failed {
        reason: String,
        progressed: bool,
    },
    /// The cancel signal was raised; what arrived is on disk.
    Cancelled,
}

impl Hub {
    pub(super) async fn fetch_blob(
        &self,
        r: &ResolvedRepo,
        job: &Job,
        tally: &Tally<'_>,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<FileOutcome, FetchError> {
        let mut slot = Some(slot);
        if self.is_cancelled() {
            return Err(Self::cancelled_error(r));
        }
        let file = job.paths.first().cloned().unwrap_or_default();
        let blob = self.cache.blob_path(&r.repo, &job.etag);
        let incomplete = self.cache.incomplete_path(&r.repo, &job.etag);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            let (repo, file) = (r.repo.clone(), file.clone());
            move |source| FetchError::Io {
                repo,
                file,
                path,
                source,
            }
        };
        let mut outcome = FileOutcome::Downloaded;
        if blob.exists() {
            // A blob that is here is checked, not transferred: its slot goes to the next file
            // (a re-download, should the check fail, waits for one).
            slot = None;
            let ok = snapshot::stamp_ok(&self.cache, &r.repo, &job.etag)
                || verify_blocking(&blob, &file, &job.expected).await.is_ok();
            if ok {
                snapshot::write_stamp(&self.cache, &r.repo, &job.etag);
                tally.done.fetch_add(job.size, Ordering::Relaxed);
                tally.progress(&file, job.size, job.size);
                return Ok(FileOutcome::AlreadyVerified);
            }
            snapshot::remove_stamp(&self.cache, &r.repo, &job.etag);
            tokio::fs::remove_file(&blob).await.map_err(io(&blob))?;
            outcome = FileOutcome::Refetched;
        }
        if let Some(dir) = blob.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
        }
        let mut bad_downloads = 0;
        loop {
            let mut hasher = Some(StreamHasher::new(&job.expected, job.size));
            self.download_to(
                Target {
                    r,
                    file: &file,
                    incomplete: &incomplete,
                    size: job.size,
                    exp: &job.expected,
                },
                &mut hasher,
                tally,
                slot.take(),
            )
            .await?;
            let checked = match hasher {
                Some(h) => verify_streamed_blocking(&incomplete, &file, &job.expected, h).await,
                None => verify_blocking(&incomplete, &file, &job.expected).await,
            };
            match checked {
                Ok(()) => break,
                Err(e) => {
                    tokio::fs::remove_file(&incomplete)
                        .await
                        .map_err(io(&incomplete))?;
                    tally.done.fetch_sub(job.size, Ordering::Relaxed);
                    bad_downloads += 1;
                    if bad_downloads >= 2 {
                        return Err(FetchError::Verify {
                            repo: r.repo.clone(),
                            commit: r.commit.clone(),
                            file,
                            source: Box::new(e),
                        });
                    }
                    tally.progress.on_event(&FetchEvent::Retrying {
                        file: file.clone(),
                        attempt: bad_downloads,
                        reason: format!("downloaded file does not verify: {e}"),
                        backoff: Duration::ZERO,
                    });
                }
            }
        }
        tokio::fs::rename(&incomplete, &blob)
            .await
            .map_err(io(&blob))?;
        snapshot::write_stamp(&self.cache, &r.repo, &job.etag);
        Ok(outcome)
    }

    /// Fill `incomplete` up to `size` bytes, resuming from its length; the first transfer uses
    /// `slot` when given (the one the file was chosen in), later ones wait for a free slot.
    async fn download_to(
        &self,
        t: Target<'_>,
        hasher: &mut Option<StreamHasher>,
        tally: &Tally<'_>,
        mut slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<(), FetchError> {
        let Target {
            r,
            file,
            incomplete,
            size,
            ..
        } = t;
        let mut attempts = self.cfg.backoff().attempts();
        let mut first = true;
        // An empty file needs no transfer, but still an (empty) file to verify and rename.
        tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(crate::safe_fs::RESUME_FLAGS)
            .open(incomplete)
            .await
            .map_err(|e| self.io_err(r, file, incomplete, e))?;
        loop {
            let have = tokio::fs::metadata(incomplete).await.map_or(0, |m| m.len());
            let have = if have > size {
                truncate(incomplete, 0)
                    .await
                    .map_err(|e| self.io_err(r, file, incomplete, e))?;
                0
            } else {
                have
            };
            if first {
                tally.done.fetch_add(have, Ordering::Relaxed);
                first = false;
            }
            if have == size {
                return Ok(());
            }
            if self.is_cancelled() {
                return Err(Self::cancelled_error(r));
            }
            let slot = match slot.take() {
                Some(slot) => slot,
                None => tokio::select! {
                    slot = std::sync::Arc::clone(&tally.slots).acquire_owned() => slot.map_err(|_| Self::cancelled_error(r))?,
                    () = cancelled(self.cfg.cancel.as_ref()) => return Err(Self::cancelled_error(r)),
                },
            };
            tally.progress.on_event(&FetchEvent::FileStarted {
                file: file.to_owned(),
                offset: have,
                size,
            });
            match self.attempt(t, have, hasher, tally, slot).await? {
                Attempt::Complete => return Ok(()),
                Attempt::Cancelled => return Err(Self::cancelled_error(r)),
                Attempt::Failed { reason, progressed } => {
                    if progressed {
                        attempts.progressed();
                    }
                    let Some(backoff) = attempts.failed() else {
                        return Err(FetchError::GaveUp {
                            repo: r.repo.clone(),
                            commit: r.commit.clone(),
                            file: file.to_owned(),
                            attempts: attempts.failures(),
                            last: reason,
                        });
                    };
                    tally.progress.on_event(&FetchEvent::Retrying {
                        file: file.to_owned(),
                        attempt: attempts.failures(),
                        reason,
                        backoff,
                    });
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = cancelled(self.cfg.cancel.as_ref()) => return Err(Self::cancelled_error(r)),
                    }
                }
            }
        }
    }

    fn io_err(
        &self,
        r: &ResolvedRepo,
        file: &str,
        path: &Path,
        source: std::io::Error,
    ) -> FetchError {
        FetchError::Io {
            repo: r.repo.clone(),
            file: file.to_owned(),
            path: path.to_path_buf(),
            source,
        }
    }

    /// One ranged GET appended to `incomplete`, holding `slot` (a download slot on the link)
    /// until its last byte. Transport trouble is `Attempt::Failed`; refusals by the Hub (access,
    /// not found) are errors.
    async fn attempt(
        &self,
        t: Target<'_>,
        mut have: u64,
        hasher: &mut Option<StreamHasher>,
        tally: &Tally<'_>,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Attempt, FetchError> {
        let Target {
            r,
            file,
            incomplete,
            size,
            exp,
        } = t;
        let stall = self.cfg.stall_timeout;
        let failed = |reason: String, progressed: bool| Ok(Attempt::Failed { reason, progressed });
        let url = self.resolve_url(r, file)?;
        let mut req = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT_ENCODING, "identity");
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let sent = tokio::select! {
            sent = tokio::time::timeout(stall, req.send()) => sent,
            () = cancelled(self.cfg.cancel.as_ref()) => return Ok(Attempt::Cancelled),
        };
        let resp = match sent {
            Err(_) => {
                return failed(
                    format!("no response within {} s", stall.as_secs_f64()),
                    false,
                );
            }
            Ok(Err(e)) => return failed(format!("request failed: {}", e.without_url()), false),
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status().as_u16();
        let mut truncate_to_zero = false;
        match status {
            206 => {
                let cr = resp
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                if !cr.starts_with(&format!("bytes {have}-")) || !cr.ends_with(&format!("/{size}"))
                {
                    return failed(
                        format!("asked for bytes={have}- but got Content-Range `{cr}`"),
                        false,
                    );
                }
            }
            200 => {
                if have > 0 {
                    // The server ignored the range: start over rather than corrupt the file.
                    truncate_to_zero = true;
                }
            }
            416 => {
                truncate(incomplete, 0)
                    .await
                    .map_err(|e| self.io_err(r, file, incomplete, e))?;
                tally.done.fetch_sub(have, Ordering::Relaxed);
                return failed(
                    "416 range not satisfiable; restarting the file".into(),
                    false,
                );
            }
            408 | 429 | 500..=599 => return failed(format!("HTTP {status}"), false),
            _ => return Err(self.status_error(r, file, &resp).into()),
        }
        if truncate_to_zero {
            truncate(incomplete, 0)
                .await
                .map_err(|e| self.io_err(r, file, incomplete, e))?;
            tally.done.fetch_sub(have, Ordering::Relaxed);
            have = 0;
        }
        // The digests must cover exactly the bytes already on disk before we append.
        if let Some(h) = hasher.take() {
            *hasher = catch_up_blocking(h, incomplete, have, exp).await;
        }
        let f = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(crate::safe_fs::RESUME_FLAGS)
            .open(incomplete)
            .await
            .map_err(|e| self.io_err(r, file, incomplete, e))?;
        // A small buffer: whatever it holds is lost if the process is killed (the next fetch
        // continues from what reached the file), and 256 KiB writes are as fast as larger ones.
        let mut out = tokio::io::BufWriter::with_capacity(256 << 10, f);
        let mut stream = resp.bytes_stream();
        let mut got = 0u64;
        let mut slot = Some(slot);
        let first_byte_wait = Instant::now();
        let mut last_event = Instant::now();
        let mut was_cancelled = false;
        let result = loop {
            let next = tokio::select! {
                next = tokio::time::timeout(stall, stream.next()) => next,
                () = cancelled(self.cfg.cancel.as_ref()) => {
                    was_cancelled = true;
                    break None;
                }
            };
            match next {
                Err(_) => break Some(format!("stalled: no byte for {} s", stall.as_secs_f64())),
                Ok(None) => break None,
                Ok(Some(Err(e))) => break Some(format!("transfer broke: {}", e.without_url())),
                Ok(Some(Ok(chunk))) => {
                    let n = chunk.len() as u64;
                    if have + got + n > size {
                        break Some(format!("server sent more than the {size} bytes announced"));
                    }
                    if let Err(e) = out.write_all(&chunk).await {
                        return Err(self.io_err(r, file, incomplete, e));
                    }
                    if let Some(h) = hasher.as_mut() {
                        h.update(&chunk);
                    }
                    got += n;
                    if slot.is_some()
                        && hands_over(size - (have + got), got, first_byte_wait.elapsed())
                    {
                        slot = None;
                    }
                    tally.done.fetch_add(n, Ordering::Relaxed);
                    tally.transferred.fetch_add(n, Ordering::Relaxed);
                    if last_event.elapsed() >= Duration::from_millis(100) {
                        last_event = Instant::now();
                        tally.progress(file, have + got, size);
                    }
                }
            }
        };
        // The link is free for the next transfer while this file reaches the disk (if its tail
        // has not handed the slot over already).
        drop(slot);
        out.flush()
            .await
            .map_err(|e| self.io_err(r, file, incomplete, e))?;
        let f = out.into_inner();
        f.sync_data()
            .await
            .map_err(|e| self.io_err(r, file, incomplete, e))?;
        tally.progress(file, have + got, size);
        match result {
            None if was_cancelled => Ok(Attempt::Cancelled),
            None if have + got == size => Ok(Attempt::Complete),
            None => failed(
                format!("body ended at byte {} of {size}", have + got),
                got > 0,
            ),
            Some(reason) => failed(reason, got > 0),
        }
    }
}

/// How long before its last byte a transfer gives its download slot to the next file.
const HANDOVER: Duration = Duration::from_millis(250);

/// Whether a transfer with `left` bytes to go, which moved `got` bytes in `elapsed`, would end
/// within [`HANDOVER`] at that rate: its slot then goes to the next file, whose request, redirect
/// and first byte take their round trips while this tail arrives. Without it, files of one size
/// that share the link end together and every slot waits for its next first byte at once, the
/// link idle meanwhile. The rate counts only once the transfer has run for [`HANDOVER`]: the
/// first bytes arrive with the response, at no measurable rate, and a file that ends sooner keeps
/// its slot to the end (otherwise every file would give its slot away at its first chunk, and
/// twice as many would share the link).
fn hands_over(left: u64, got: u64, elapsed: Duration) -> bool {
    elapsed >= HANDOVER
        && got > 0
        && u128::from(left) * elapsed.as_nanos() <= u128::from(got) * HANDOVER.as_nanos()
}

async fn truncate(path: &Path, len: u64) -> std::io::Result<()> {
    match tokio::fs::OpenOptions::new()
        .write(true)
        .custom_flags(crate::safe_fs::RESUME_FLAGS)
        .open(path)
        .await
    {
        Ok(f) => f.set_len(len).await,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Catch the hasher up to `to` bytes of the file; `None` (verify by re-reading later) on failure.
async fn catch_up_blocking(
    mut h: StreamHasher,
    path: &Path,
    to: u64,
    exp: &Expected,
) -> Option<StreamHasher> {
    let (path, exp) = (path.to_path_buf(), exp.clone());
    tokio::task::spawn_blocking(move || h.catch_up(&path, to, &exp).ok().map(|()| h))
        .await
        .ok()
        .flatten()
}

async fn verify_streamed_blocking(
    path: &Path,
    file: &str,
    exp: &Expected,
    h: StreamHasher,
) -> Result<(), VerifyError> {
    let (path, file, exp) = (path.to_path_buf(), file.to_owned(), exp.clone());
    let p2 = path.clone();
    tokio::task::spawn_blocking(move || verify::verify_streamed(&path, &file, &exp, h))
        .await
        .unwrap_or_else(|e| {
            Err(VerifyError::Io {
                path: p2,
                source: std::io::Error::other(e),
            })
        })
}

async fn verify_blocking(path: &Path, file: &str, exp: &Expected) -> Result<(), VerifyError> {
    let (path, file, exp) = (path.to_path_buf(), file.to_owned(), exp.clone());
    let p2 = path.clone();
    tokio::task::spawn_blocking(move || verify::verify_file(&path, &file, &exp))
        .await
        .unwrap_or_else(|e| {
            Err(VerifyError::Io {
                path: p2,
                source: std::io::Error::other(e),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slot goes to the next file once the rest would take 250 ms or less at the rate so far:
    /// 10 MB in 1 s with 2.5 MB to go (0.25 s) hands over, with 2.6 MB not yet; a transfer that
    /// moved nothing never does, nor one that has run less than 250 ms (its first chunk came
    /// with the response: no rate yet).
    #[test]
    fn a_tail_within_250_ms_hands_its_slot_over() {
        let s = Duration::from_secs(1);
        assert!(hands_over(2_500_000, 10_000_000, s));
        assert!(!hands_over(2_600_000, 10_000_000, s));
        assert!(hands_over(0, 1, s));
        assert!(!hands_over(1, 0, s));
        assert!(!hands_over(1_000_000, 131_072, Duration::from_micros(5)));
        assert!(!hands_over(0, 131_072, Duration::from_millis(249)));
    }
}
