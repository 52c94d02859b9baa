//! The Hub's JSON answers (the tree listing, the repo info) and the cache's manifests, through
//! the same types and checks the client applies.
#![no_main]

use hf_hub::repository::{ModelInfo, RepoTreeEntry};
use libfuzzer_sys::fuzz_target;
use spark_deploy_core::commit::is_commit_id;
use spark_deploy_core::hub::snapshot::ManifestEntry;
use spark_deploy_core::hub::{Expected, RemoteFile, client::normalize_etag};

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = serde_json::from_slice::<Vec<RepoTreeEntry>>(data) {
        for e in entries {
            if let Ok(Some(f)) = RemoteFile::from_listing("owner/name", e) {
                assert!(!f.path.is_empty() && !f.path.split('/').any(|c| c == ".."));
            }
        }
    }
    if let Ok(info) = serde_json::from_slice::<ModelInfo>(data) {
        let _ = info.sha.as_deref().map(is_commit_id);
    }
    if let Ok(manifest) = serde_json::from_slice::<Vec<ManifestEntry>>(data) {
        let _ = manifest.len();
    }
    let text = String::from_utf8_lossy(data);
    let etag = normalize_etag(&text);
    let _ = Expected::from_etag(&etag);
});
