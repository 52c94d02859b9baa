//! Element types as the safetensors header and the TFDSRK01 index name them.

use std::fmt;

/// An element type a checkpoint tensor or a rank-file entry can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// bfloat16 (`BF16` / `bfloat16`).
    Bf16,
    /// IEEE half (`F16` / `float16`).
    F16,
    /// IEEE single (`F32` / `float32`).
    F32,
    /// `I16` / `int16` (EXL3 trellises).
    I16,
    /// `I32` / `int32`.
    I32,
    /// `I64` / `int64`.
    I64,
    /// `U8` / `uint8`.
    U8,
    /// `F8_E4M3` / `float8_e4m3fn` (Engram tables).
    F8E4M3,
    /// `F8_E8M0` (Engram scales; no torch name in the rank file).
    F8E8M0,
}

impl DType {
    /// Bytes per element.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::U8 | Self::F8E4M3 | Self::F8E8M0 => 1,
            Self::Bf16 | Self::F16 | Self::I16 => 2,
            Self::F32 | Self::I32 => 4,
            Self::I64 => 8,
        }
    }

    /// The dtype a safetensors header names (`"BF16"`, `"F16"`, ...), if supported.
    #[must_use]
    pub fn from_safetensors(name: &str) -> Option<Self> {
        Some(match name {
            "BF16" => Self::Bf16,
            "F16" => Self::F16,
            "F32" => Self::F32,
            "I16" => Self::I16,
            "I32" => Self::I32,
            "I64" => Self::I64,
            "U8" => Self::U8,
            "F8_E4M3" => Self::F8E4M3,
            "F8_E8M0" => Self::F8E8M0,
            _ => return None,
        })
    }

    /// The safetensors header name.
    #[must_use]
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Self::Bf16 => "BF16",
            Self::F16 => "F16",
            Self::F32 => "F32",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::U8 => "U8",
            Self::F8E4M3 => "F8_E4M3",
            Self::F8E8M0 => "F8_E8M0",
        }
    }

    /// torch's name as the rank-file index writes it (`str(dtype).split(".")[1]`); `None` for a
    /// dtype the TFDSRK01 format cannot hold.
    #[must_use]
    pub fn torch_name(self) -> Option<&'static str> {
        Some(match self {
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U8 => "uint8",
            Self::F8E4M3 => "float8_e4m3fn",
            Self::F8E8M0 => return None,
        })
    }

    /// The dtype a rank-file index names (torch's name).
    #[must_use]
    pub fn from_torch_name(name: &str) -> Option<Self> {
        [
            Self::Bf16,
            Self::F16,
            Self::F32,
            Self::I16,
            Self::I32,
            Self::I64,
            Self::U8,
            Self::F8E4M3,
        ]
        .into_iter()
        .find(|d| d.torch_name() == Some(name))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

/// IEEE half to single, exact (NaN payloads kept, as torch's CPU `.to(torch.float32)` does).
#[must_use]
pub fn f16_to_f32_bits(h: u16) -> u32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // subnormal: normalise
            let mut e: i32 = -14;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            let m = m & 0x3ff;
            sign | (((e + 127) as u32) << 23) | (m << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_matches_rust_f32_semantics() {
        for h in 0..=u16::MAX {
            let bits = f16_to_f32_bits(h);
            let exp = (h >> 10) & 0x1f;
            if exp == 0x1f {
                assert!(f32::from_bits(bits).is_nan() || f32::from_bits(bits).is_infinite());
                continue;
            }
            // value = (-1)^s * 2^(e-15) * (1 + m/1024), or subnormal 2^-14 * m/1024
            let s = if h & 0x8000 != 0 { -1.0f64 } else { 1.0 };
            let m = f64::from(h & 0x3ff);
            let v = if exp == 0 {
                s * m / 1024.0 * 2f64.powi(-14)
            } else {
                s * (1.0 + m / 1024.0) * 2f64.powi(i32::from(exp) - 15)
            };
            assert_eq!(f64::from(f32::from_bits(bits)), v, "h={h:#06x}");
        }
        assert_eq!(f16_to_f32_bits(0x3c00), 1.0f32.to_bits());
        assert_eq!(f16_to_f32_bits(0x8000), (-0.0f32).to_bits());
    }

    #[test]
    fn names_round_trip() {
        for d in [
            DType::Bf16,
            DType::F16,
            DType::F32,
            DType::I16,
            DType::F8E4M3,
        ] {
            assert_eq!(DType::from_safetensors(d.safetensors_name()), Some(d));
            assert_eq!(DType::from_torch_name(d.torch_name().unwrap()), Some(d));
        }
        assert_eq!(DType::F8E8M0.torch_name(), None);
    }
}
