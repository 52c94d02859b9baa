//! Just enough PNG decoding for the stand-in to "see" an image: size and the mean colour of its
//! pixels (8-bit grey, grey+alpha, RGB or RGBA, not interlaced; all five row filters), named in
//! words.

use std::io::Read as _;

/// What the stand-in sees in a PNG.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
    /// Mean red, green and blue, 0..=255.
    pub mean: [f64; 3],
}

impl Seen {
    /// The mean colour's name: black, white, grey, red, green, blue, yellow, cyan or magenta.
    #[must_use]
    pub fn colour(&self) -> &'static str {
        let [r, g, b] = self.mean;
        let hi = r.max(g).max(b);
        let lo = r.min(g).min(b);
        if hi - lo < 40.0 {
            return if hi < 60.0 {
                "black"
            } else if lo > 200.0 {
                "white"
            } else {
                "grey"
            };
        }
        let strong = |v: f64| v > hi * 0.6;
        match (strong(r), strong(g), strong(b)) {
            (true, true, false) => "yellow",
            (false, true, true) => "cyan",
            (true, false, true) => "magenta",
            (true, false, false) => "red",
            (false, true, false) => "green",
            _ => "blue",
        }
    }
}

fn be32(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let p = i16::from(a) + i16::from(b) - i16::from(c);
    let (pa, pb, pc) = (
        (p - i16::from(a)).abs(),
        (p - i16::from(b)).abs(),
        (p - i16::from(c)).abs(),
    );
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

/// Decodes `bytes`; `Err` says why it cannot.
///
/// # Errors
/// A message naming what is not supported or malformed.
pub fn decode(bytes: &[u8]) -> Result<Seen, String> {
    const SIG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.len() < 33 || &bytes[..8] != SIG {
        return Err("not a PNG".into());
    }
    let mut i = 8;
    let (mut width, mut height, mut channels) = (0u32, 0u32, 0usize);
    let mut idat = Vec::new();
    while i + 8 <= bytes.len() {
        let len = be32(bytes, i).ok_or("truncated chunk")? as usize;
        let kind = &bytes[i + 4..i + 8];
        let data = bytes
            .get(i + 8..i + 8 + len)
            .ok_or("a chunk runs past the end of the file")?;
        match kind {
            b"IHDR" => {
                width = be32(data, 0).ok_or("short IHDR")?;
                height = be32(data, 4).ok_or("short IHDR")?;
                let (depth, colour, interlace) = (data[8], data[9], data[12]);
                if depth != 8 || interlace != 0 {
                    return Err(format!(
                        "bit depth {depth} / interlace {interlace} is not decoded (8-bit, not interlaced only)"
                    ));
                }
                channels = match colour {
                    0 => 1,
                    4 => 2,
                    2 => 3,
                    6 => 4,
                    c => return Err(format!("colour type {c} is not decoded")),
                };
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        i += 12 + len;
    }
    if width == 0 || height == 0 || channels == 0 {
        return Err("no IHDR".into());
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(idat.as_slice())
        .read_to_end(&mut raw)
        .map_err(|e| format!("IDAT does not inflate: {e}"))?;
    let stride = width as usize * channels;
    if raw.len() < (stride + 1) * height as usize {
        return Err("IDAT holds fewer rows than IHDR says".into());
    }
    let mut prev = vec![0u8; stride];
    let mut row = vec![0u8; stride];
    let mut sum = [0f64; 3];
    for y in 0..height as usize {
        let line = &raw[y * (stride + 1)..(y + 1) * (stride + 1)];
        let filter = line[0];
        for x in 0..stride {
            let a = if x >= channels { row[x - channels] } else { 0 };
            let b = prev[x];
            let c = if x >= channels { prev[x - channels] } else { 0 };
            let v = line[x + 1];
            row[x] = match filter {
                0 => v,
                1 => v.wrapping_add(a),
                2 => v.wrapping_add(b),
                3 => v.wrapping_add(((u16::from(a) + u16::from(b)) / 2) as u8),
                4 => v.wrapping_add(paeth(a, b, c)),
                f => return Err(format!("row filter {f} is not a PNG filter")),
            };
        }
        for px in row.chunks(channels) {
            let rgb = if channels < 3 {
                [px[0]; 3]
            } else {
                [px[0], px[1], px[2]]
            };
            for k in 0..3 {
                sum[k] += f64::from(rgb[k]);
            }
        }
        std::mem::swap(&mut prev, &mut row);
    }
    let n = f64::from(width) * f64::from(height);
    Ok(Seen {
        width,
        height,
        mean: sum.map(|s| s / n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_one_pixel_png() {
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
            .unwrap();
        let s = decode(&png).unwrap();
        assert_eq!((s.width, s.height), (1, 1));
        assert!(decode(b"GIF89a").is_err());
    }
}
