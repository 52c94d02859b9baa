//! The one reader of safetensors headers, for local shards (the Hub port's verification, the
//! engine inputs) and for bytes fetched by range from the Hub.
//!
//! A safetensors file is an 8-byte little-endian length `N`, `N` bytes of JSON naming every
//! tensor's dtype, shape and `[begin, end)` offsets in the data section, then the data section.
//! The header is validated by the `safetensors` crate (offsets contiguous from 0, each tensor's
//! byte length equal to its shape times its dtype size) under one size limit, [`MAX_HEADER_LEN`].

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

/// The largest header accepted: the limit the `safetensors` crate itself enforces.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// What is wrong with a header (the caller names the file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than the 8 bytes of the header length.
    #[error("the file has {0} bytes, fewer than the 8-byte header length")]
    TooShort(u64),
    /// The header length is above the limit or does not fit the file.
    #[error("header length {len} is impossible{}", match .file_len {
        Some(f) => format!(" for a {f}-byte file"),
        None => format!(" (the format allows at most {MAX_HEADER_LEN} bytes)"),
    })]
    Length {
        /// `N`, as read.
        len: u64,
        /// The file's length, when known.
        file_len: Option<u64>,
    },
    /// The JSON does not parse or does not describe a valid data section.
    #[error("header does not parse: {0}")]
    Parse(String),
    /// The data section does not end at the end of the file.
    #[error("the header describes {expected} bytes but the file has {found}")]
    FileLength {
        /// `8 + N + data`, from the header.
        expected: u64,
        /// The file's length.
        found: u64,
    },
}

/// A header or I/O problem of a local file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The header is malformed or does not match the file's length.
    #[error("{path}: {problem}")]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: HeaderError,
    },
}

/// One tensor of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpan {
    /// Its name.
    pub name: String,
    /// Its dtype as the header writes it (`"BF16"`, `"I16"`, ...).
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// `[begin, end)` offsets relative to the start of the data section.
    pub data_offsets: (u64, u64),
}

/// A parsed, validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `N`, the JSON length.
    pub len: u64,
    /// `__metadata__` (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// The tensors in data order.
    pub tensors: Vec<TensorSpan>,
}

impl Header {
    /// Where the data section starts: `8 + N`.
    #[must_use]
    pub fn data_start(&self) -> u64 {
        self.len.saturating_add(8)
    }

    /// The data section's length.
    #[must_use]
    pub fn data_len(&self) -> u64 {
        self.tensors.last().map_or(0, |t| t.data_offsets.1)
    }

    /// The length of the whole file this header describes.
    #[must_use]
    pub fn file_len(&self) -> u64 {
        self.data_start().saturating_add(self.data_len())
    }
}

/// `N` from the first 8 bytes of a file, checked against [`MAX_HEADER_LEN`] and (when known) the
/// file's length.
///
/// # Errors
/// [`HeaderError::TooShort`] with fewer than 8 bytes, [`HeaderError::Length`] for an impossible
/// length.
pub fn header_len(prefix: &[u8], file_len: Option<u64>) -> Result<u64, HeaderError> {
    let n: [u8; 8] = prefix
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(HeaderError::TooShort(prefix.len() as u64))?;
    let len = u64::from_le_bytes(n);
    if len > MAX_HEADER_LEN || file_len.is_some_and(|f| len > f.saturating_sub(8)) {
        return Err(HeaderError::Length { len, file_len });
    }
    Ok(len)
}

/// The header JSON as written: `__metadata__` and one entry per tensor.
#[derive(serde::Deserialize)]
struct RawHeader {
    #[serde(rename = "__metadata__")]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(flatten)]
    tensors: std::collections::HashMap<String, safetensors::tensor::TensorInfo>,
}

/// The byte length of a tensor of `shape` and `bits` per element, with checked arithmetic: a shape
/// holding a 0 is empty whatever its other dimensions (`[2^62, 4, 0]` is 0 bytes), anything that
/// overflows 64 bits or ends mid-byte is refused.
///
/// # Errors
/// What is wrong, for the caller to prefix with the tensor's name.
pub fn tensor_bytes(shape: &[usize], bits: usize) -> Result<u64, String> {
    if shape.contains(&0) {
        return Ok(0);
    }
    let elements = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .ok_or_else(|| format!("shape {shape:?} has more than 2^64 elements"))?;
    if bits.is_multiple_of(8) {
        return elements
            .checked_mul(bits as u64 / 8)
            .ok_or_else(|| format!("shape {shape:?} holds more than 2^64 bytes"));
    }
    let total_bits = elements
        .checked_mul(bits as u64)
        .ok_or_else(|| format!("shape {shape:?} holds more than 2^64 bits"))?;
    if !total_bits.is_multiple_of(8) {
        return Err(format!(
            "shape {shape:?} of {bits}-bit elements does not end on a byte"
        ));
    }
    Ok(total_bits / 8)
}

/// Parse and validate the `N` bytes of header JSON: offsets contiguous from 0 and each tensor's
/// byte length equal to its shape times its dtype's size, all in checked 64-bit arithmetic.
///
/// # Errors
/// [`HeaderError::Parse`] naming what is wrong (bad JSON, an unknown dtype, offsets that leave a
/// gap or overlap, a tensor whose byte length does not match its shape and dtype), and the tensor.
pub fn parse(json: &[u8]) -> Result<Header, HeaderError> {
    let raw: RawHeader =
        serde_json::from_slice(json).map_err(|e| HeaderError::Parse(e.to_string()))?;
    let mut tensors: Vec<(TensorSpan, usize)> = raw
        .tensors
        .into_iter()
        .map(|(name, info)| {
            let span = TensorSpan {
                name,
                dtype: info.dtype.to_string(),
                shape: info.shape,
                data_offsets: (info.data_offsets.0 as u64, info.data_offsets.1 as u64),
            };
            (span, info.dtype.bitsize())
        })
        .collect();
    tensors.sort_by(|(a, _), (b, _)| (a.data_offsets, &a.name).cmp(&(b.data_offsets, &b.name)));
    let mut at = 0u64;
    for (t, bits) in &tensors {
        let bad = |problem: String| HeaderError::Parse(format!("tensor `{}`: {problem}", t.name));
        let (begin, end) = t.data_offsets;
        if begin != at || end < begin {
            return Err(bad(format!(
                "data_offsets [{begin}, {end}] do not start where the previous tensor ends ({at})"
            )));
        }
        let want = tensor_bytes(&t.shape, *bits).map_err(&bad)?;
        if end - begin != want {
            return Err(bad(format!(
                "{} bytes, but {} {:?} needs {want}",
                end - begin,
                t.dtype,
                t.shape
            )));
        }
        at = end;
    }
    let len = json.len() as u64;
    if at.checked_add(len).and_then(|n| n.checked_add(8)).is_none() {
        return Err(HeaderError::Parse(format!(
            "the data section's {at} bytes after an {len}-byte header exceed 2^64 bytes"
        )));
    }
    Ok(Header {
        len,
        metadata: raw.metadata.unwrap_or_default(),
        tensors: tensors.into_iter().map(|(t, _)| t).collect(),
    })
}

/// Read and validate the header of a local file with two positioned reads, and check that the
/// data section ends exactly at the end of the file. Returns the header and the file's length.
///
/// # Errors
/// [`ReadError::Io`] or [`ReadError::Header`], both naming `path`.
pub fn read(path: &Path) -> Result<(Header, u64), ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bad = |problem| ReadError::Header {
        path: path.to_path_buf(),
        problem,
    };
    let file = crate::safe_fs::open_regular(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut prefix = [0u8; 8];
    let got = usize::try_from(file_len).map_or(8, |l| l.min(8));
    file.read_exact_at(&mut prefix[..got], 0).map_err(io)?;
    let len = header_len(&prefix[..got], Some(file_len)).map_err(bad)?;
    let mut json = vec![
        0u8;
        usize::try_from(len).map_err(|_| bad(HeaderError::Length {
            len,
            file_len: Some(file_len)
        }))?
    ];
    file.read_exact_at(&mut json, 8).map_err(io)?;
    let header = parse(&json).map_err(bad)?;
    if header.file_len() != file_len {
        return Err(bad(HeaderError::FileLength {
            expected: header.file_len(),
            found: file_len,
        }));
    }
    Ok((header, file_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `tensors` (name, dtype, shape, byte length), laid out in order.
    fn file(tensors: &[(&str, &str, &[usize], u64)], metadata: Option<&str>) -> Vec<u8> {
        let mut parts = Vec::new();
        let mut at = 0;
        for (name, dtype, shape, len) in tensors {
            let shape: Vec<String> = shape.iter().map(ToString::to_string).collect();
            parts.push(format!(
                r#""{name}":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[{at},{}]}}"#,
                shape.join(","),
                at + len
            ));
            at += len;
        }
        if let Some(m) = metadata {
            parts.push(format!(r#""__metadata__":{m}"#));
        }
        raw(&format!("{{{}}}", parts.join(",")), at)
    }

    /// A file of header `json` (space-padded to 8 bytes) and `data_len` zero bytes.
    fn raw(json: &str, data_len: u64) -> Vec<u8> {
        let mut json = json.as_bytes().to_vec();
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend(json);
        out.extend(std::iter::repeat_n(0u8, usize::try_from(data_len).unwrap()));
        out
    }

    fn read_bytes(bytes: &[u8]) -> Result<(Header, u64), ReadError> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.safetensors");
        std::fs::write(&p, bytes).unwrap();
        read(&p)
    }

    fn problem(bytes: &[u8]) -> HeaderError {
        match read_bytes(bytes) {
            Err(ReadError::Header { problem, .. }) => problem,
            other => panic!("expected a header problem, got {other:?}"),
        }
    }

    #[test]
    fn a_valid_file_lists_its_tensors_in_data_order() {
        let b = file(
            &[
                ("b", "BF16", &[2, 3], 12),
                ("a", "I16", &[4], 8),
                ("e", "F32", &[0], 0),
            ],
            Some(r#"{"format":"pt"}"#),
        );
        let (h, len) = read_bytes(&b).unwrap();
        assert_eq!(len, b.len() as u64);
        assert_eq!(h.file_len(), len);
        let names: Vec<_> = h.tensors.iter().map(|t| t.name.as_str()).collect();
        // "e" is empty at offset 20: data order, ties broken by the end offset.
        assert_eq!(names, ["b", "a", "e"]);
        assert_eq!(h.tensors[1].dtype, "I16");
        assert_eq!(h.tensors[1].data_offsets, (12, 20));
        assert_eq!(h.metadata["format"], "pt");
        assert!(h.data_start().is_multiple_of(8));
    }

    #[test]
    fn broken_files_are_refused_with_the_reason() {
        let good = file(&[("t", "U8", &[10], 10)], None);
        assert!(matches!(
            problem(&good[..good.len() - 1]),
            HeaderError::FileLength { found, .. } if found == good.len() as u64 - 1
        ));
        assert!(matches!(problem(&good[..5]), HeaderError::TooShort(5)));
        let mut huge = good.clone();
        huge[..8].copy_from_slice(&(MAX_HEADER_LEN + 1).to_le_bytes());
        assert!(matches!(problem(&huge), HeaderError::Length { .. }));
        let mut long = good.clone();
        long[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
        assert!(matches!(problem(&long), HeaderError::Length { .. }));
        // A shape that does not match the byte length; a gap between tensors; an unknown dtype.
        for bad in [
            file(&[("t", "F32", &[3], 10)], None),
            raw(
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}"#,
                5,
            ),
            file(&[("t", "Q4", &[10], 10)], None),
        ] {
            assert!(
                matches!(problem(&bad), HeaderError::Parse(_)),
                "{:?}",
                problem(&bad)
            );
        }
        assert!(parse(b"not json").is_err());
        let e = read_bytes(&good[..good.len() - 1]).unwrap_err().to_string();
        assert!(
            e.contains("x.safetensors") && e.contains("the file has"),
            "{e}"
        );
    }

    #[test]
    fn the_length_prefix_alone_is_checked_without_a_file_length() {
        assert_eq!(header_len(&16u64.to_le_bytes(), None), Ok(16));
        assert!(header_len(&(MAX_HEADER_LEN + 1).to_le_bytes(), None).is_err());
        assert_eq!(header_len(&[1, 2], None), Err(HeaderError::TooShort(2)));
    }

    #[test]
    fn sizes_are_checked_in_64_bits_and_zero_size_shapes_are_empty() {
        // A legitimate empty tensor whose other dimensions multiply past 2^64.
        let b = file(
            &[("z", "F32", &[1 << 62, 4, 0], 0), ("t", "U8", &[3], 3)],
            None,
        );
        let (h, _) = read_bytes(&b).unwrap();
        assert_eq!(h.tensors[0].name, "z");
        assert_eq!(h.tensors[0].data_offsets, (0, 0));
        assert_eq!(tensor_bytes(&[1 << 62, 4, 0], 32), Ok(0));
        assert_eq!(tensor_bytes(&[], 16), Ok(2), "a scalar");
        assert_eq!(
            tensor_bytes(&[3, 5], 4),
            Err("shape [3, 5] of 4-bit elements does not end on a byte".into())
        );
        // Element counts and bit counts past 2^64 are refused naming the tensor, in debug and
        // release alike.
        for (shape, needle) in [
            (vec![1usize << 32, 1 << 32, 2], "more than 2^64 elements"),
            (vec![1usize << 62, 2], "more than 2^64 bytes"),
        ] {
            let shape_text: Vec<String> = shape.iter().map(ToString::to_string).collect();
            let json = format!(
                r#"{{"big":{{"dtype":"F32","shape":[{}],"data_offsets":[0,0]}}}}"#,
                shape_text.join(",")
            );
            let e = parse(json.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("tensor `big`") && e.contains(needle), "{e}");
        }
        // A data section that ends past 2^64 bytes with the header in front of it.
        let json = format!(
            r#"{{"t":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}}}}"#,
            u64::MAX,
            u64::MAX
        );
        let e = parse(json.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("exceed 2^64 bytes"), "{e}");
        let json = format!(
            r#"{{"t":{{"dtype":"U8","shape":[2],"data_offsets":[{},{}]}}}}"#,
            u64::MAX - 1,
            u64::MAX
        );
        assert!(
            parse(json.as_bytes())
                .unwrap_err()
                .to_string()
                .contains("tensor `t`")
        );
    }
}
