//! Reading the running ranks' engine logs: the newest lines of every rank ordered by time, then
//! (following) each new line as it arrives, whichever rank wrote it.

use std::collections::HashMap;

use bollard::container::LogOutput;
use futures::StreamExt as _;

use super::log_time::{Instant, parse_rfc3339};
use crate::container::rank_container_name;
use crate::ports::docker::{DockerError, DockerNode};
use crate::run::Context;

/// Which lines to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Only the last `tail` lines of each rank (all when `None`).
    pub tail: Option<usize>,
    /// Only lines written at or after this Unix time.
    pub since: Option<i64>,
    /// Keep reading new lines until the containers stop (or the caller stops polling).
    pub follow: bool,
}

/// One line of a rank's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Rank that wrote it.
    pub rank: usize,
    /// Node it runs on.
    pub node: String,
    /// Docker's RFC 3339 stamp of the line (empty when the line carried none).
    pub timestamp: String,
    /// The line, without its stamp and newline.
    pub text: String,
}

/// Errors of reading rank logs.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// The node's Docker could not be reached.
    #[error(
        "rank {rank} on {node}: Docker is unreachable; remedy: check the node with `spark-deploy preflight`"
    )]
    Unreachable {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// Why.
        #[source]
        source: DockerError,
    },
    /// The rank has no container.
    #[error(
        "rank {rank} on {node}: no container {container}; remedy: the deployment is down \
         (`spark-deploy up` starts it); logs saved by `down` are gzipped under the node's \
         data_dir/logs"
    )]
    NoContainer {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// Container name.
        container: String,
    },
    /// Docker failed while sending the log.
    #[error("reading the log of {container} (rank {rank} on {node}): {source}")]
    Read {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// Container name.
        container: String,
        /// Why.
        #[source]
        source: Box<bollard::errors::Error>,
    },
}

/// Splits `ts text` as Docker writes it with timestamps on.
fn split_stamp(line: &str) -> (String, String) {
    match line.split_once(' ') {
        Some((ts, text)) if parse_rfc3339(ts).is_some() => (ts.to_owned(), text.to_owned()),
        _ => (String::new(), line.to_owned()),
    }
}

/// The order key of a line: its time, unstamped lines first.
fn key(line: &LogLine) -> Instant {
    parse_rfc3339(&line.timestamp).unwrap_or((i64::MIN, 0))
}

/// Cuts a rank's byte stream into lines (a chunk may end mid-line).
#[derive(Default)]
struct LineBuffer(Vec<u8>);

impl LineBuffer {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.0.extend_from_slice(bytes);
        let mut lines = Vec::new();
        while let Some(i) = self.0.iter().position(|&b| b == b'\n') {
            let rest = self.0.split_off(i + 1);
            let line = std::mem::replace(&mut self.0, rest);
            lines.push(
                String::from_utf8_lossy(&line[..i])
                    .trim_end_matches('\r')
                    .to_owned(),
            );
        }
        lines
    }

    fn finish(&mut self) -> Option<String> {
        (!self.0.is_empty())
            .then(|| String::from_utf8_lossy(&std::mem::take(&mut self.0)).into_owned())
    }
}

struct Source<'a> {
    rank: usize,
    node: String,
    container: String,
    docker: &'a DockerNode,
}

impl Source<'_> {
    fn stream(
        &self,
        tail: Option<usize>,
        since: Option<i64>,
        follow: bool,
    ) -> impl futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + use<'_> {
        let tail = tail.map_or_else(|| "all".to_owned(), |n| n.to_string());
        let opts = bollard::query_parameters::LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .timestamps(true)
            .follow(follow)
            .since(since.map_or(0, |s| i32::try_from(s.max(0)).unwrap_or(i32::MAX)))
            .tail(&tail)
            .build();
        self.docker.docker().logs(&self.container, Some(opts))
    }

    fn line(&self, raw: &str) -> LogLine {
        let (timestamp, text) = split_stamp(raw);
        LogLine {
            rank: self.rank,
            node: self.node.clone(),
            timestamp,
            text,
        }
    }

    fn read_err(&self, source: bollard::errors::Error) -> LogsError {
        LogsError::Read {
            rank: self.rank,
            node: self.node.clone(),
            container: self.container.clone(),
            source: Box::new(source),
        }
    }
}

/// The ranks' containers; the ranks without one go to `missing`.
async fn sources<'a>(
    ctx: &'a Context,
    ranks: &[usize],
    missing: &mut Vec<LogsError>,
) -> Result<Vec<Source<'a>>, LogsError> {
    let c = ctx.config().config();
    let mut out = Vec::new();
    for &rank in ranks {
        let node = c.nodes[rank].name.clone();
        let container = rank_container_name(&c.deployment.name, rank);
        let docker = ctx
            .docker(rank)
            .await
            .map_err(|source| LogsError::Unreachable {
                rank,
                node: node.clone(),
                source,
            })?;
        let exists = docker
            .inspect_container(&container)
            .await
            .map_err(|source| LogsError::Unreachable {
                rank,
                node: node.clone(),
                source,
            })?
            .is_some();
        if !exists {
            missing.push(LogsError::NoContainer {
                rank,
                node,
                container,
            });
            continue;
        }
        out.push(Source {
            rank,
            node,
            container,
            docker,
        });
    }
    Ok(out)
}

/// Calls `on_line` with the last lines of every rank in `ranks`, ordered by time across ranks;
/// with [`LogQuery::follow`], then with every new line as it arrives until every container's log
/// ends (the container stopped). Drop the future to stop following. Returns the ranks that have
/// no container while others have one (a half-stopped pair), so the caller can say so.
///
/// # Errors
///
/// [`LogsError`] naming the rank and node: Docker unreachable, a read failure, or no container
/// for any of `ranks`.
pub async fn read(
    ctx: &Context,
    ranks: &[usize],
    query: &LogQuery,
    on_line: &mut dyn FnMut(LogLine),
) -> Result<Vec<LogsError>, LogsError> {
    let mut missing = Vec::new();
    let sources = sources(ctx, ranks, &mut missing).await?;
    if sources.is_empty() && !missing.is_empty() {
        return Err(missing.swap_remove(0));
    }
    // The backlog: each rank's lines in full, then merged by time (a stable sort keeps each
    // rank's own order for equal stamps).
    let mut backlog = Vec::new();
    let mut last: HashMap<usize, Instant> = HashMap::new();
    let started = std::time::SystemTime::now();
    for s in &sources {
        let mut stream = s.stream(query.tail, query.since, false);
        let mut buf = LineBuffer::default();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| s.read_err(e))?;
            backlog.extend(buf.push(&chunk.into_bytes()).iter().map(|l| s.line(l)));
        }
        backlog.extend(buf.finish().map(|l| s.line(&l)));
        if let Some(k) = backlog.iter().filter(|l| l.rank == s.rank).map(key).max() {
            last.insert(s.rank, k);
        }
    }
    backlog.sort_by_key(key);
    for line in backlog {
        on_line(line);
    }
    if !query.follow {
        return Ok(missing);
    }
    // Following: from the last second already shown (Docker's `since` has whole seconds), with
    // the lines already shown skipped.
    let from = |rank: usize| {
        last.get(&rank).map_or_else(
            || {
                let now = started
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
                query.since.map_or(now, |s| s.max(now))
            },
            |k| k.0,
        )
    };
    let streams = sources.iter().enumerate().map(|(i, s)| {
        s.stream(None, Some(from(s.rank)), true)
            .map(move |chunk| (i, chunk))
            .boxed()
    });
    let mut merged = futures::stream::select_all(streams);
    let mut buffers: Vec<LineBuffer> = sources.iter().map(|_| LineBuffer::default()).collect();
    while let Some((i, chunk)) = merged.next().await {
        let s = &sources[i];
        let chunk = chunk.map_err(|e| s.read_err(e))?;
        for raw in buffers[i].push(&chunk.into_bytes()) {
            let line = s.line(&raw);
            if last.get(&s.rank).is_some_and(|k| key(&line) <= *k) {
                continue;
            }
            on_line(line);
        }
    }
    for (i, b) in buffers.iter_mut().enumerate() {
        if let Some(raw) = b.finish() {
            on_line(sources[i].line(&raw));
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_at_newlines_across_chunks_and_stamps_split_off() {
        let mut b = LineBuffer::default();
        assert!(b.push(b"2026-11-30T01:55:23.1Z hel").is_empty());
        let lines = b.push(b"lo\r\n2026-11-30T01:55:24Z world\nnext");
        assert_eq!(
            lines,
            ["2026-11-30T01:55:23.1Z hello", "2026-11-30T01:55:24Z world"]
        );
        assert_eq!(b.finish().as_deref(), Some("next"));
        assert_eq!(b.finish(), None);
        assert_eq!(
            split_stamp(&lines[0]),
            ("2026-11-30T01:55:23.1Z".to_owned(), "hello".to_owned())
        );
        assert_eq!(
            split_stamp("no stamp here"),
            (String::new(), "no stamp here".to_owned())
        );
    }
}
