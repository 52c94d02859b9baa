//! Byte-range reads of a remote safetensors file: the header, then only the named tensors.
//!
//! Used to extract small tensors (e.g. the `bias_vl` routing biases, ~65 KB) from multi-GB shards
//! without downloading them: one ranged GET for the header (usually a single 64 KiB request),
//! then one ranged GET per run of adjacent requested tensors.

use std::collections::BTreeMap;

use super::client::{Hub, ResolvedRepo};
use super::error::HubError;
use crate::safetensors_header;

/// A run of adjacent tensors: `[start, end)` in the file and its members.
type Run<'a> = (u64, u64, Vec<(&'a str, &'a TensorEntry)>);

/// First request size: header length plus, usually, the whole header.
const HEAD_PROBE: u64 = 64 * 1024;

/// Errors of remote safetensors reads.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The Hub refused or failed.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The server did not honour the range (it would have sent the whole file).
    #[error(
        "{file} of {repo} at {commit}: the server ignored the byte range {start}-{end} (HTTP {status})"
    )]
    RangeIgnored {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// First byte asked for.
        start: u64,
        /// Last byte asked for (inclusive).
        end: u64,
        /// Status received.
        status: u16,
    },
    /// The bytes received are not what was asked for.
    #[error("{file} of {repo} at {commit}: {what}")]
    Short {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// What went wrong.
        what: String,
    },
    /// The header does not parse or validate.
    #[error("{file} of {repo} at {commit}: bad safetensors header: {reason}")]
    Header {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A range request got no answer, or its bytes stopped arriving, within the stall timeout.
    #[error(
        "{file} of {repo} at {commit}: bytes {start}-{end} did not arrive within {secs} s; check the connection to the Hub and retry"
    )]
    Stalled {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// First byte asked for.
        start: u64,
        /// Last byte asked for (inclusive).
        end: u64,
        /// The stall timeout, in seconds.
        secs: f64,
    },
    /// A requested tensor is not in the file.
    #[error("{file} of {repo} at {commit}: no tensor named {name}")]
    NoTensor {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// Tensor name.
        name: String,
    },
}

impl RemoteError {
    /// Stalls, transport failures and 408/429/5xx answers are worth retrying.
    fn is_transient(&self) -> bool {
        match self {
            Self::Stalled { .. } => true,
            Self::Hub(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// Where one tensor lives in a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// dtype as written in the header (`BF16`, `F32`, …).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Absolute byte offsets in the file, `[begin, end)`.
    pub file_range: (u64, u64),
}

/// The parsed header of a remote safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSafetensors {
    /// Repository-relative path.
    pub file: String,
    /// `N`, the JSON header length.
    pub header_len: u64,
    /// `__metadata__`, if any.
    pub metadata: BTreeMap<String, String>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorEntry>,
}

/// One tensor's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTensor {
    /// Tensor name.
    pub name: String,
    /// Where it is and what it is.
    pub entry: TensorEntry,
    /// Its raw little-endian bytes.
    pub data: bytes::Bytes,
}

impl Hub {
    /// GET bytes `start..=end` of a file at the pinned commit, insisting on a 206; transport
    /// failures, stalls and 408/429/5xx answers are retried under [`HubConfig::backoff`](super::HubConfig::backoff).
    async fn get_range(
        &self,
        r: &ResolvedRepo,
        file: &str,
        start: u64,
        end: u64,
    ) -> Result<bytes::Bytes, RemoteError> {
        let url = self.resolve_url(r, file)?;
        self.cfg
            .backoff()
            .retry(
                || self.get_range_once(&url, r, file, start, end),
                RemoteError::is_transient,
            )
            .await
    }

    async fn get_range_once(
        &self,
        url: &reqwest::Url,
        r: &ResolvedRepo,
        file: &str,
        start: u64,
        end: u64,
    ) -> Result<bytes::Bytes, RemoteError> {
        let stalled = || RemoteError::Stalled {
            repo: r.repo.clone(),
            commit: r.commit.clone(),
            file: file.to_owned(),
            start,
            end,
            secs: self.cfg.stall_timeout.as_secs_f64(),
        };
        let resp = tokio::time::timeout(
            self.cfg.stall_timeout,
            self.http
                .get(url.clone())
                .header(reqwest::header::RANGE, format!("bytes={start}-{end}"))
                .header(reqwest::header::ACCEPT_ENCODING, "identity")
                .send(),
        )
        .await
        .map_err(|_| stalled())?
        .map_err(|e| self.transport(r, file, e))?;
        let status = resp.status().as_u16();
        match status {
            206 => {}
            200 => {
                return Err(RemoteError::RangeIgnored {
                    repo: r.repo.clone(),
                    commit: r.commit.clone(),
                    file: file.to_owned(),
                    start,
                    end,
                    status,
                });
            }
            _ => return Err(self.status_error(r, file, &resp).into()),
        }
        Ok(tokio::time::timeout(self.cfg.stall_timeout, resp.bytes())
            .await
            .map_err(|_| stalled())?
            .map_err(|e| self.transport(r, file, e))?)
    }

    /// Read and validate the header of a remote `.safetensors` file with range requests only.
    ///
    /// # Errors
    /// [`RemoteError::Hub`] (access, not found…), [`RemoteError::RangeIgnored`] if the server would
    /// send the whole file, [`RemoteError::Header`] if the header is invalid.
    pub async fn read_safetensors_header(
        &self,
        r: &ResolvedRepo,
        file: &str,
    ) -> Result<RemoteSafetensors, RemoteError> {
        let (n, header) = self.read_header(r, file).await?;
        Ok(remote_safetensors(file, n, header))
    }

    /// The parsed header of a remote `.safetensors` file and its length `N` (the data section
    /// starts at `8 + N`), read with range requests only.
    ///
    /// # Errors
    /// As [`Hub::read_safetensors_header`].
    pub async fn read_header(
        &self,
        r: &ResolvedRepo,
        file: &str,
    ) -> Result<(u64, safetensors_header::Header), RemoteError> {
        let bad = |reason: String| RemoteError::Header {
            repo: r.repo.clone(),
            commit: r.commit.clone(),
            file: file.to_owned(),
            reason,
        };
        let probe = self.get_range(r, file, 0, HEAD_PROBE - 1).await?;
        let n = safetensors_header::header_len(&probe, None).map_err(|e| bad(e.to_string()))?;
        let end = usize::try_from(8 + n).map_err(|e| bad(e.to_string()))?;
        let hdr = if end <= probe.len() {
            probe.slice(8..end)
        } else {
            let rest = self
                .get_range(r, file, probe.len() as u64, 8 + n - 1)
                .await?;
            let mut v = probe.slice(8..).to_vec();
            v.extend_from_slice(&rest);
            bytes::Bytes::from(v)
        };
        if hdr.len() as u64 != n {
            return Err(bad(format!("header has {} bytes, expected {n}", hdr.len())));
        }
        let header = safetensors_header::parse(&hdr).map_err(|e| bad(e.to_string()))?;
        Ok((n, header))
    }

    /// Fetch only the named tensors of a remote `.safetensors` file (header + their byte ranges;
    /// adjacent tensors share one request).
    ///
    /// # Errors
    /// As [`Hub::read_safetensors_header`], plus [`RemoteError::NoTensor`] for an unknown name and
    /// [`RemoteError::Short`] when a range arrives incomplete.
    pub async fn read_tensors(
        &self,
        r: &ResolvedRepo,
        file: &str,
        names: &[&str],
    ) -> Result<Vec<RemoteTensor>, RemoteError> {
        let header = self.read_safetensors_header(r, file).await?;
        let mut wanted: Vec<(&str, &TensorEntry)> = Vec::new();
        for name in names {
            let e = header
                .tensors
                .get(*name)
                .ok_or_else(|| RemoteError::NoTensor {
                    repo: r.repo.clone(),
                    commit: r.commit.clone(),
                    file: file.to_owned(),
                    name: (*name).to_owned(),
                })?;
            wanted.push((name, e));
        }
        wanted.sort_by_key(|(_, e)| e.file_range.0);
        // Group into runs of adjacent tensors.
        let mut runs: Vec<Run<'_>> = Vec::new();
        for (name, e) in wanted {
            match runs.last_mut() {
                Some((_, end, members)) if *end == e.file_range.0 => {
                    *end = e.file_range.1;
                    members.push((name, e));
                }
                _ => runs.push((e.file_range.0, e.file_range.1, vec![(name, e)])),
            }
        }
        let mut out = Vec::new();
        for (start, end, members) in runs {
            let data = if end > start {
                self.get_range(r, file, start, end - 1).await?
            } else {
                bytes::Bytes::new()
            };
            if data.len() as u64 != end - start {
                return Err(RemoteError::Short {
                    repo: r.repo.clone(),
                    commit: r.commit.clone(),
                    file: file.to_owned(),
                    what: format!(
                        "asked for {} bytes at {start}, got {}",
                        end - start,
                        data.len()
                    ),
                });
            }
            for (name, e) in members {
                let a = usize::try_from(e.file_range.0 - start).unwrap_or(usize::MAX);
                let b = usize::try_from(e.file_range.1 - start).unwrap_or(usize::MAX);
                out.push(RemoteTensor {
                    name: name.to_owned(),
                    entry: e.clone(),
                    data: data.slice(a..b),
                });
            }
        }
        let order: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        out.sort_by_key(|t| order.get(t.name.as_str()).copied().unwrap_or(usize::MAX));
        Ok(out)
    }
}

/// A parsed header as [`RemoteSafetensors`] (absolute byte ranges).
fn remote_safetensors(file: &str, n: u64, header: safetensors_header::Header) -> RemoteSafetensors {
    let data_start = header.data_start();
    RemoteSafetensors {
        file: file.to_owned(),
        header_len: n,
        metadata: header.metadata,
        tensors: header
            .tensors
            .into_iter()
            .map(|t| {
                let (begin, end) = t.data_offsets;
                (
                    t.name,
                    TensorEntry {
                        dtype: t.dtype,
                        shape: t.shape,
                        file_range: (data_start + begin, data_start + end),
                    },
                )
            })
            .collect(),
    }
}
