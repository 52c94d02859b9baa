//! The head's file server: an allow-list of files, bound to one address, behind a bearer token.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt as _;
use tower_http::services::ServeFile;

use super::TransferError;
use crate::secret::Secret;

struct Shared {
    token: Secret,
    files: std::sync::RwLock<HashMap<String, PathBuf>>,
}

/// A running file server; stops when dropped.
pub struct FileServer {
    addr: SocketAddr,
    token: Secret,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FileServer {
    /// Serves nothing yet on `bind` (port 0 picks one) with a fresh random token; see [`Self::allow`].
    ///
    /// # Errors
    ///
    /// [`TransferError::Bind`].
    pub async fn start(bind: SocketAddr) -> Result<Self, TransferError> {
        let token = Secret::new(random_token());
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|source| TransferError::Bind {
                addr: bind.to_string(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| TransferError::Bind {
                addr: bind.to_string(),
                source,
            })?;
        let shared = Arc::new(Shared {
            token: token.clone(),
            files: std::sync::RwLock::new(HashMap::new()),
        });
        let app = axum::Router::new()
            .route("/f/{id}", axum::routing::get(serve))
            .with_state(Arc::clone(&shared));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Self {
            addr,
            token,
            shared,
            stop: Some(tx),
        })
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The per-run token.
    #[must_use]
    pub fn token(&self) -> &Secret {
        &self.token
    }

    /// Adds `path` to the allow-list; returns its URL.
    #[must_use]
    pub fn allow(&self, path: PathBuf) -> String {
        let mut files = self
            .shared
            .files
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = files.len().to_string();
        files.insert(id.clone(), path);
        format!("http://{}/f/{id}", self.addr)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        // Still unguessable enough for a per-run token bound to a private link.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b[..16].copy_from_slice(&t.to_le_bytes());
    }
    hex::encode(b)
}

async fn serve(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<String>,
    req: Request<Body>,
) -> Response {
    let authorised = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == s.token.expose());
    if !authorised {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Some(path) = s.files.read().ok().and_then(|f| f.get(&id).cloned()) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match ServeFile::new(path).oneshot(req).await {
        Ok(r) => r.map(Body::new).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
