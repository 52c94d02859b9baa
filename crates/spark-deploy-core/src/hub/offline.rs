//! Offline mode (`HF_HUB_OFFLINE`, [`HubConfig::offline`](super::HubConfig)): no socket is
//! opened; a fetch stands on the verified cache and names every file it lacks.
//!
//! What a fetch wants is found without the Hub: the revision from the commit itself or
//! `refs/<branch>`; the files from what the cache knows of that commit (our manifest,
//! `huggingface_hub`'s `trees/<commit>.json` listing, the snapshot directory, and the shards a
//! cached `*.safetensors.index.json` names), filtered by the fetch's patterns; each must be
//! present. When no listing of the commit is cached (a cache written by an older client), every
//! file a pattern names must be present and every wildcard pattern must match a file. Blobs
//! verified before (an unchanged stamp) are not hashed again; the others are verified in full.

use std::collections::BTreeSet;

use super::cache::HfCache;
use super::client::{Hub, RemoteFile, ResolvedRepo};
use super::error::HubError;
use super::fetch::{FetchError, FetchReport, FetchedFile, select};
use super::patterns::AllowPatterns;
use super::progress::FileOutcome;
use super::snapshot;
use super::verify::VerifyError;

impl Hub {
    /// `Err(`[`HubError::Offline`]`)` in offline mode: called before every request.
    pub(crate) fn ensure_online(
        &self,
        what: &str,
        repo: &str,
        revision: &str,
    ) -> Result<(), HubError> {
        if self.cfg.offline {
            return Err(HubError::Offline {
                what: what.to_owned(),
                repo: repo.to_owned(),
                revision: revision.to_owned(),
            });
        }
        Ok(())
    }

    /// [`Hub::fetch_repo`] in offline mode: the files matching `patterns` of `repo` at
    /// `revision`, present and verified in the cache, with no network.
    pub(crate) fn fetch_offline(
        &self,
        repo: &str,
        revision: &str,
        patterns: &[String],
    ) -> Result<FetchReport, FetchError> {
        let offline = |problems: Vec<String>| FetchError::Offline {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            cache: self.cache.root().to_path_buf(),
            problems,
        };
        let commit = if crate::commit::is_commit_id(revision) {
            revision.to_ascii_lowercase()
        } else {
            match self.cache.read_ref(repo, revision)? {
                Some(c) => c,
                None => {
                    return Err(offline(vec![format!(
                        "no commit recorded for {revision} ({} is missing)",
                        self.cache.ref_path(repo, revision).display()
                    )]));
                }
            }
        };
        let snap = self.cache.snapshot_dir(repo, &commit);
        let (known, listed) = known_files(&self.cache, repo, &commit);
        let known: Vec<RemoteFile> = known
            .into_iter()
            .map(|path| RemoteFile {
                path,
                size: 0,
                is_lfs: false,
                lfs_sha256: None,
            })
            .collect();
        let selected: Vec<String> = select(&known, patterns)?
            .into_iter()
            .map(|f| f.path.clone())
            .collect();
        let mut problems = if listed {
            Vec::new()
        } else {
            unlisted_problems(patterns, &selected)
        };
        let (present, absent): (Vec<String>, Vec<String>) =
            selected.into_iter().partition(|f| snap.join(f).is_file());
        problems.extend(absent.iter().map(|f| format!("{f} is missing")));
        // Blobs verified before and unchanged since are taken as they are; the rest are hashed.
        let (stamped, unstamped): (Vec<String>, Vec<String>) = present.into_iter().partition(|f| {
            HfCache::linked_etag(&snap.join(f))
                .is_some_and(|e| snapshot::stamp_ok(&self.cache, repo, &e))
        });
        let mut verified = stamped;
        if !unstamped.is_empty() {
            let report = snapshot::verify_snapshot(&self.cache, repo, &commit, Some(&unstamped))
                .map_err(|e| offline(vec![e.to_string()]))?;
            verified.extend(report.verified);
            problems.extend(report.problems.iter().map(describe));
        }
        if !problems.is_empty() {
            return Err(offline(problems));
        }
        verified.sort();
        let files = verified
            .into_iter()
            .map(|path| {
                let local = snap.join(&path);
                FetchedFile {
                    etag: HfCache::linked_etag(&local).unwrap_or_default(),
                    size: std::fs::metadata(&local).map_or(0, |m| m.len()),
                    path,
                    local,
                    outcome: FileOutcome::AlreadyVerified,
                }
            })
            .collect();
        Ok(FetchReport {
            repo: ResolvedRepo {
                repo: repo.to_owned(),
                requested: revision.to_owned(),
                commit,
            },
            snapshot_dir: snap,
            files,
            transferred: 0,
        })
    }
}

/// Without a listing: every file a pattern names must be there, every wildcard must match.
fn unlisted_problems(patterns: &[String], selected: &[String]) -> Vec<String> {
    let why = "no file listing of this commit is cached, so every file the fetch names is required";
    patterns
        .iter()
        .filter_map(|p| {
            if p.contains(['*', '?']) {
                (!AllowPatterns::new(std::slice::from_ref(p))
                    .is_ok_and(|a| selected.iter().any(|f| a.is_match(f))))
                .then(|| format!("no cached file matches {p} ({why})"))
            } else {
                (!selected.contains(p)).then(|| format!("{p} is missing ({why})"))
            }
        })
        .collect()
}

/// A problem as one line naming the file.
fn describe(e: &VerifyError) -> String {
    match e {
        VerifyError::Missing { file, .. } => format!("{file} is missing"),
        other => format!("{other} (corrupt: a fetch with the Hub reachable replaces it)"),
    }
}

/// Every file the cache knows `repo@commit` has, present or not, and whether a listing (ours or
/// `huggingface_hub`'s) was among the sources.
fn known_files(cache: &HfCache, repo: &str, commit: &str) -> (BTreeSet<String>, bool) {
    let mut out = BTreeSet::new();
    out.extend(snapshot::manifest_paths(cache, repo, commit));
    out.extend(snapshot::python_tree_paths(cache, repo, commit));
    let listed = !out.is_empty();
    let snap = cache.snapshot_dir(repo, commit);
    out.extend(snapshot::snapshot_files(&snap));
    // The shards a cached safetensors index names (its folder-relative names).
    let indexes: Vec<String> = out
        .iter()
        .filter(|f| f.ends_with(".safetensors.index.json"))
        .cloned()
        .collect();
    for index in indexes {
        let Some(map) = crate::safe_fs::read_capped(&snap.join(&index), crate::safe_fs::JSON_CAP)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        else {
            continue;
        };
        let dir = index.rsplit_once('/').map(|(d, _)| format!("{d}/"));
        if let Some(m) = map.get("weight_map").and_then(|m| m.as_object()) {
            for shard in m.values().filter_map(|v| v.as_str()) {
                if super::cache::check_rel(repo, shard).is_ok() {
                    out.insert(format!("{}{shard}", dir.as_deref().unwrap_or("")));
                }
            }
        }
    }
    (out, listed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::{HubConfig, NoProgress};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const REPO: &str = "o/model";
    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A loopback port that counts the connections made to it (and answers none).
    fn counting_listener() -> (String, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        let n = Arc::new(AtomicUsize::new(0));
        let seen = n.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                seen.fetch_add(1, Ordering::SeqCst);
                drop(s);
            }
        });
        (endpoint, n)
    }

    fn safetensors(len: usize) -> Vec<u8> {
        let mut h = format!(r#"{{"t":{{"dtype":"U8","shape":[{len}],"data_offsets":[0,{len}]}}}}"#)
            .into_bytes();
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend(h);
        out.extend(std::iter::repeat_n(3u8, len));
        out
    }

    /// A cache holding `files` of REPO@COMMIT, each blob named by its git sha1 (as the Hub's ETag).
    fn cache_with(dir: &std::path::Path, files: &[(&str, Vec<u8>)]) -> HfCache {
        let cache = HfCache::new(dir);
        let blobs = cache.repo_dir(REPO).join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        for (path, bytes) in files {
            let tmp = dir.join("tmp");
            std::fs::write(&tmp, bytes).unwrap();
            let etag = super::super::verify::digest_file(&tmp, false, true)
                .unwrap()
                .git_sha1
                .unwrap();
            std::fs::rename(&tmp, blobs.join(&etag)).unwrap();
            cache.link_snapshot(REPO, COMMIT, path, &etag).unwrap();
        }
        cache
    }

    fn hub(endpoint: &str, dir: &std::path::Path, offline: bool) -> Hub {
        let mut cfg = HubConfig::new(Some(endpoint.to_owned()), dir);
        cfg.offline = offline;
        cfg.max_retries = 0;
        Hub::new(cfg).unwrap()
    }

    fn patterns() -> Vec<String> {
        [
            "config.json",
            "model.safetensors.index.json",
            "*.safetensors",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    #[tokio::test]
    async fn offline_stands_on_the_cache_and_opens_no_socket() {
        let (endpoint, connections) = counting_listener();
        let d = tempfile::tempdir().unwrap();
        let index = br#"{"weight_map":{"a":"model-1.safetensors","b":"model-2.safetensors"}}"#;
        let cache = cache_with(
            d.path(),
            &[
                ("config.json", b"{}".to_vec()),
                ("model.safetensors.index.json", index.to_vec()),
                ("model-1.safetensors", safetensors(64)),
                ("model-2.safetensors", safetensors(32)),
                ("README.md", b"not wanted".to_vec()),
            ],
        );
        let h = hub(&endpoint, d.path(), true);
        let report = h
            .fetch_repo(REPO, COMMIT, &patterns(), &NoProgress)
            .await
            .unwrap();
        let got: Vec<&str> = report.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            got,
            [
                "config.json",
                "model-1.safetensors",
                "model-2.safetensors",
                "model.safetensors.index.json"
            ]
        );
        assert_eq!(report.transferred, 0);
        // Verified once: the second run goes by the stamps (same answer).
        assert!(
            h.fetch_repo(REPO, COMMIT, &patterns(), &NoProgress)
                .await
                .is_ok()
        );

        // A shard the index names is gone: named, with the cache and a remedy.
        std::fs::remove_file(cache.snapshot_dir(REPO, COMMIT).join("model-2.safetensors")).unwrap();
        let e = h
            .fetch_repo(REPO, COMMIT, &patterns(), &NoProgress)
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(e.is_offline(), "{msg}");
        assert!(msg.contains("model-2.safetensors is missing"), "{msg}");
        assert!(msg.contains(&d.path().display().to_string()), "{msg}");
        assert!(
            e.remedy().unwrap().contains("HF_HUB_OFFLINE unset"),
            "{e:?}"
        );

        // A branch with no recorded commit, a literal file and a wildcard that match nothing.
        let e = h
            .fetch_repo(REPO, "main", &patterns(), &NoProgress)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("refs/main"), "{e}");
        let want = ["tokenizer.json".to_owned(), "*.bin".to_owned()];
        let e = h
            .fetch_repo(REPO, COMMIT, &want, &NoProgress)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tokenizer.json is missing") && e.contains("no cached file matches *.bin"),
            "{e}"
        );
        // With huggingface_hub's listing of the commit cached, the listing decides: a listed
        // file is required, a named one the repository lacks is not.
        let trees = cache.repo_dir(REPO).join("trees");
        std::fs::create_dir_all(&trees).unwrap();
        let listed = [
            "config.json",
            "model-1.safetensors",
            "model-2.safetensors",
            "x.safetensors",
        ];
        let files: serde_json::Map<String, serde_json::Value> = listed
            .iter()
            .map(|f| {
                (
                    (*f).to_owned(),
                    serde_json::json!({"size": 1, "blob_id": "00"}),
                )
            })
            .collect();
        std::fs::write(
            trees.join(format!("{COMMIT}.json")),
            serde_json::json!({"format_version": 1, "files": files}).to_string(),
        )
        .unwrap();
        let mut want = patterns();
        want.push("generation_config.json".into());
        let e = h
            .fetch_repo(REPO, COMMIT, &want, &NoProgress)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.safetensors is missing")
                && e.contains("model-2.safetensors is missing")
                && !e.contains("generation_config.json"),
            "{e}"
        );
        std::fs::remove_dir_all(&trees).unwrap();

        // A corrupt blob is found, not trusted.
        let cfg_blob =
            std::fs::canonicalize(cache.snapshot_dir(REPO, COMMIT).join("config.json")).unwrap();
        std::fs::write(&cfg_blob, b"{ }").unwrap();
        let e = h
            .fetch_repo(REPO, COMMIT, &["config.json".to_owned()], &NoProgress)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json") && e.contains("corrupt"), "{e}");

        // Every other request refuses before a socket.
        let e = h.resolve(REPO, COMMIT).await.unwrap_err();
        assert!(matches!(e, HubError::Offline { .. }), "{e}");
        assert_eq!(
            connections.load(Ordering::SeqCst),
            0,
            "offline mode connected"
        );

        // The listener does count: the same hub online connects.
        let online = hub(&endpoint, d.path(), false);
        assert!(online.resolve(REPO, COMMIT).await.is_err());
        assert!(connections.load(Ordering::SeqCst) > 0);
    }
}
