//! A throwaway container run to its end with its output streamed line by line (the engine build).

use std::time::Duration;

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::LogsOptionsBuilder;
use futures::StreamExt;

use super::{DockerError, DockerNode};

/// The longest a throwaway container may run (a cold engine build with its CUDA kernels).
const LIMIT: Duration = Duration::from_secs(6 * 3600);

impl DockerNode {
    /// Runs `body` as container `name` to its end: removes an old container of that name, creates
    /// and starts it, hands every line of its output (stdout and stderr interleaved) to `line` as
    /// it arrives, waits for its exit and removes it, whatever happened. Returns the exit code.
    ///
    /// # Errors
    ///
    /// [`DockerError::CreateContainer`], [`DockerError::StartContainer`], [`DockerError::Logs`]
    /// or [`DockerError::Wait`].
    pub async fn run_to_end(
        &self,
        name: &str,
        body: ContainerCreateBody,
        line: &mut (dyn FnMut(&str) + Send),
    ) -> Result<i64, DockerError> {
        self.remove_container(name).await?;
        self.create_container(name, body).await?;
        let result = self.follow_and_wait(name, line).await;
        let removed = self.remove_container(name).await;
        let code = result?;
        removed?;
        Ok(code)
    }

    async fn follow_and_wait(
        &self,
        name: &str,
        line: &mut (dyn FnMut(&str) + Send),
    ) -> Result<i64, DockerError> {
        self.start_container(name).await?;
        let docker = self.docker_with_timeout(LIMIT);
        let opts = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .follow(true)
            .build();
        let mut stream = docker.logs(name, Some(opts));
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let bytes = chunk
                .map_err(|e| DockerError::Logs {
                    node: self.node().to_owned(),
                    name: name.to_owned(),
                    source: Box::new(e),
                })?
                .into_bytes();
            pending.extend_from_slice(&bytes);
            while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                let text: Vec<u8> = pending.drain(..=i).collect();
                line(String::from_utf8_lossy(&text).trim_end_matches(['\n', '\r']));
            }
        }
        if !pending.is_empty() {
            line(String::from_utf8_lossy(&pending).trim_end_matches(['\n', '\r']));
        }
        self.wait_container(name).await
    }
}
