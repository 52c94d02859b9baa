//! Which weights a rank loaded: sha256 of the bytes of every rank-file entry of the named EXL3
//! tensors, by index key (`prefix|cols|rows|part`), printed in rank 1's loaded line and rank 0's
//! first line. A test slices the same part of a safetensors file (the checkpoint's, or the `ABLIT`
//! overlay's) and compares, so it sees whether the rank files carry the genuine or the overlaid
//! weights (the index holds no content hash, and a genuine and an overlaid file share one name).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::rank_file::{RankFile, RankFileError};

/// Env: the tensors to digest, a comma list of EXL3 prefixes; unset = the overlay's
/// ([`crate::checkpoint::OVERLAID`]).
pub const DIGEST_ENV: &str = "TF_STANDIN_DIGEST";

/// The prefixes named by `v` (the value of [`DIGEST_ENV`]), or the overlay's when unset or empty.
#[must_use]
pub fn tensors_from_env(v: Option<&str>) -> Vec<String> {
    let named: Vec<String> = v
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if named.is_empty() {
        crate::checkpoint::OVERLAID
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    } else {
        named
    }
}

/// sha256 (hex) of every entry of `rf` whose EXL3 prefix is in `tensors`, by index key. Tensors
/// the file does not hold are simply absent.
///
/// # Errors
/// Reading an entry fails.
pub fn digests(
    rf: &RankFile,
    tensors: &[String],
) -> Result<BTreeMap<String, String>, RankFileError> {
    let mut out = BTreeMap::new();
    for e in &rf.entries {
        if e.exl3().is_some_and(|k| tensors.contains(&k.prefix)) {
            out.insert(e.key.clone(), hex::encode(Sha256::digest(rf.read(e)?)));
        }
    }
    Ok(out)
}
