//! The Hub port's errors, and how HTTP answers and `hf-hub` failures map onto them.

use hf_hub::HFError;

use super::client::{Hub, ResolvedRepo};

/// How a token was involved when access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// No token was sent.
    Missing,
    /// A token was sent and refused.
    Rejected,
}

/// Errors talking to the Hub (resolution, listing, metadata, transfers' HTTP status).
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The repository needs access the caller does not have (gated or private). Never holds the token.
    #[error(
        "access to {repo} at {revision} was refused (HTTP {status}{gated}): {why}. \
         This repository needs read access: accept its access conditions on the model page \
         with your account, then provide a read token through env HF_TOKEN or with \
         `hf auth login` (which stores it in $HF_HOME/token)",
        gated = if *.gated { ", gated repository" } else { "" },
        why = match .token { TokenState::Missing => "no token was provided", TokenState::Rejected => "the token provided was rejected (it lacks access to this repository or read permission)" }
    )]
    Access {
        /// Repository id.
        repo: String,
        /// Revision asked for.
        revision: String,
        /// 401 or 403.
        status: u16,
        /// Whether the Hub said `X-Error-Code: GatedRepo`.
        gated: bool,
        /// Whether a token was sent.
        token: TokenState,
    },
    /// Offline mode (`HF_HUB_OFFLINE`): the operation needs the Hub, so it was not attempted.
    #[error(
        "{what} of {repo} at {revision} needs the Hub, and offline mode is on (HF_HUB_OFFLINE or \
         hub.offline): no request was made. Remedy: run once with HF_HUB_OFFLINE unset where the \
         Hub is reachable, or copy a cache that holds it"
    )]
    Offline {
        /// What would have been requested (an operation or a file).
        what: String,
        /// Repository id.
        repo: String,
        /// Revision.
        revision: String,
    },
    /// No such repository (or it is private and the token cannot see it).
    #[error(
        "repository {repo} not found on the Hub (if it is private, provide a token with access through env HF_TOKEN or `hf auth login`)"
    )]
    RepoNotFound {
        /// Repository id.
        repo: String,
    },
    /// No such revision.
    #[error("revision {revision} not found in {repo}")]
    RevisionNotFound {
        /// Repository id.
        repo: String,
        /// Revision asked for.
        revision: String,
    },
    /// No such file at that revision.
    #[error("{file} not found in {repo} at {revision}")]
    EntryNotFound {
        /// Repository id.
        repo: String,
        /// Revision.
        revision: String,
        /// Repository-relative path.
        file: String,
    },
    /// An `hf-hub` call failed for another reason.
    #[error("{op} of {repo} at {revision} failed")]
    Api {
        /// What was being done.
        op: &'static str,
        /// Repository id.
        repo: String,
        /// Revision.
        revision: String,
        /// The hf-hub error.
        #[source]
        source: Box<HFError>,
    },
    /// An HTTP request of ours failed at the transport level.
    #[error("request for {file} of {repo} at {revision} failed")]
    Transport {
        /// Repository id.
        repo: String,
        /// Revision.
        revision: String,
        /// Repository-relative path.
        file: String,
        /// The reqwest error (its URL never carries the token).
        #[source]
        source: reqwest::Error,
    },
    /// The Hub answered with an unexpected status.
    #[error("{file} of {repo} at {revision}: HTTP {status}{}", .message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Status {
        /// Repository id.
        repo: String,
        /// Revision.
        revision: String,
        /// Repository-relative path.
        file: String,
        /// HTTP status.
        status: u16,
        /// `X-Error-Message`, if any.
        message: Option<String>,
    },
    /// A response lacked what the protocol requires.
    #[error("{file} of {repo} at {revision}: malformed Hub response: {what}")]
    Malformed {
        /// Repository id.
        repo: String,
        /// Revision.
        revision: String,
        /// Repository-relative path.
        file: String,
        /// What is wrong.
        what: String,
    },
    /// A file path from the Hub is unsafe to place in the cache.
    #[error(transparent)]
    Cache(#[from] super::cache::CacheError),
    /// The HTTP clients could not be built.
    #[error("cannot build the Hub client")]
    Build(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Hub {
    pub(crate) fn transport(
        &self,
        r: &ResolvedRepo,
        file: &str,
        source: reqwest::Error,
    ) -> HubError {
        HubError::Transport {
            repo: r.repo.clone(),
            revision: r.commit.clone(),
            file: file.to_owned(),
            source: source.without_url(),
        }
    }

    /// Map an error status of one of our requests.
    pub(crate) fn status_error(
        &self,
        r: &ResolvedRepo,
        file: &str,
        resp: &reqwest::Response,
    ) -> HubError {
        let status = resp.status().as_u16();
        let h = resp.headers();
        let code = h.get("x-error-code").and_then(|v| v.to_str().ok());
        let message = h
            .get("x-error-message")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match (status, code) {
            (401 | 403, c) if c != Some("RepoNotFound") => HubError::Access {
                repo: r.repo.clone(),
                revision: r.requested.clone(),
                status,
                gated: c == Some("GatedRepo"),
                token: self.token_state(),
            },
            (401 | 404, Some("RepoNotFound")) => HubError::RepoNotFound {
                repo: r.repo.clone(),
            },
            (404, Some("RevisionNotFound")) => HubError::RevisionNotFound {
                repo: r.repo.clone(),
                revision: r.requested.clone(),
            },
            (404, _) => HubError::EntryNotFound {
                repo: r.repo.clone(),
                revision: r.commit.clone(),
                file: file.to_owned(),
            },
            _ => HubError::Status {
                repo: r.repo.clone(),
                revision: r.commit.clone(),
                file: file.to_owned(),
                status,
                message,
            },
        }
    }

    fn token_state(&self) -> TokenState {
        if self.cfg.token.is_some() {
            TokenState::Rejected
        } else {
            TokenState::Missing
        }
    }

    pub(super) fn map_hf(
        &self,
        op: &'static str,
        repo: &str,
        revision: &str,
        e: HFError,
    ) -> HubError {
        let access = |status: u16, code: Option<&str>| HubError::Access {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            status,
            gated: code == Some("GatedRepo"),
            token: self.token_state(),
        };
        match &e {
            HFError::AuthRequired { context } | HFError::Forbidden { context }
                if context.error_code.as_deref() == Some("RepoNotFound") =>
            {
                HubError::RepoNotFound {
                    repo: repo.to_owned(),
                }
            }
            HFError::AuthRequired { context } | HFError::Forbidden { context } => {
                access(context.status.as_u16(), context.error_code.as_deref())
            }
            HFError::RepoNotFound { .. } => HubError::RepoNotFound {
                repo: repo.to_owned(),
            },
            HFError::RevisionNotFound {
                context: Some(c), ..
            } if c.error_code.as_deref() == Some("RepoNotFound") => HubError::RepoNotFound {
                repo: repo.to_owned(),
            },
            HFError::RevisionNotFound { .. } => HubError::RevisionNotFound {
                repo: repo.to_owned(),
                revision: revision.to_owned(),
            },
            HFError::Http { context }
                if context.error_code.as_deref() == Some("RevisionNotFound") =>
            {
                HubError::RevisionNotFound {
                    repo: repo.to_owned(),
                    revision: revision.to_owned(),
                }
            }
            HFError::Http { context } if context.error_code.as_deref() == Some("RepoNotFound") => {
                HubError::RepoNotFound {
                    repo: repo.to_owned(),
                }
            }
            _ => HubError::Api {
                op,
                repo: repo.to_owned(),
                revision: revision.to_owned(),
                source: Box::new(e),
            },
        }
    }
}

impl HubError {
    /// Transport failures and 408/429/5xx answers are worth retrying.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            Self::Status { status, .. } => matches!(status, 408 | 429 | 500..=599),
            _ => false,
        }
    }
}
