//! The generated pictures of the image check: a solid colour, rendered text, tall, wide and tiny
//! images, encoded as 8-bit RGB PNGs (zlib via flate2, CRC-32 computed here). Text is drawn with a
//! 5×7 bitmap font scaled up, black on white.

use std::io::Write as _;

/// One picture and what a correct description contains.
#[derive(Debug, Clone)]
pub struct Picture {
    /// Short name (`solid_red`, `text`, ...).
    pub name: &'static str,
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
    /// The PNG file.
    pub png: Vec<u8>,
    /// A word the description must contain (case-insensitive), when the picture has one.
    pub must_mention: Option<&'static str>,
    /// Text in the picture a good transcription contains (reported, not required).
    pub text: Option<&'static str>,
}

/// The text the text picture shows.
pub const SIGN: &str = "OPEN 24 HOURS";

fn glyph(c: char) -> [u8; 7] {
    match c {
        'O' => [0x0e, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'P' => [0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10, 0x10],
        'E' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x1f],
        'N' => [0x11, 0x19, 0x15, 0x13, 0x11, 0x11, 0x11],
        'H' => [0x11, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'R' => [0x1e, 0x11, 0x11, 0x1e, 0x14, 0x12, 0x11],
        'S' => [0x0f, 0x10, 0x10, 0x0e, 0x01, 0x01, 0x1e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        _ => [0; 7],
    }
}

/// An RGB canvas.
struct Canvas {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Canvas {
    fn filled(w: u32, h: u32, rgb: [u8; 3]) -> Self {
        let px = rgb
            .iter()
            .copied()
            .cycle()
            .take(w as usize * h as usize * 3)
            .collect();
        Self { w, h, px }
    }

    fn set(&mut self, x: u32, y: u32, rgb: [u8; 3]) {
        if x < self.w && y < self.h {
            let i = (y as usize * self.w as usize + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&rgb);
        }
    }

    fn text(&mut self, s: &str, x0: u32, y0: u32, scale: u32) {
        for (k, c) in s.chars().enumerate() {
            let g = glyph(c);
            let cx = x0 + k as u32 * 6 * scale;
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5u32 {
                    if bits & (0x10 >> col) != 0 {
                        for dy in 0..scale {
                            for dx in 0..scale {
                                self.set(
                                    cx + col * scale + dx,
                                    y0 + row as u32 * scale + dy,
                                    [0; 3],
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    fn png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity((self.w as usize * 3 + 1) * self.h as usize);
        for row in self.px.chunks(self.w as usize * 3) {
            raw.push(0);
            raw.extend_from_slice(row);
        }
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        // writing to a Vec cannot fail
        let _ = z.write_all(&raw);
        let idat = z.finish().unwrap_or_default();
        let mut ihdr = Vec::with_capacity(13);
        ihdr.extend_from_slice(&self.w.to_be_bytes());
        ihdr.extend_from_slice(&self.h.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [(b"IHDR", ihdr.as_slice()), (b"IDAT", &idat), (b"IEND", &[])] {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let mut chunk = kind.to_vec();
            chunk.extend_from_slice(data);
            out.extend_from_slice(&chunk);
            out.extend_from_slice(&crc32(&chunk).to_be_bytes());
        }
        out
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for b in data {
        c ^= u32::from(*b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// The probe set: solid red 400×300, "OPEN 24 HOURS" 640×240, tall 120×2000, wide 3000×90,
/// tiny 16×16.
#[must_use]
pub fn pictures() -> Vec<Picture> {
    let mut sign = Canvas::filled(640, 240, [255; 3]);
    sign.text(SIGN, 35, 85, 8);
    let mut tall = Canvas::filled(120, 2000, [30, 90, 200]);
    for y in (0..2000).step_by(100) {
        for x in 0..120 {
            tall.set(x, y, [255; 3]);
        }
    }
    let wide = Canvas::filled(3000, 90, [20, 160, 60]);
    let tiny = Canvas::filled(16, 16, [250, 220, 20]);
    let pic = |name, c: &Canvas, must_mention, text| Picture {
        name,
        width: c.w,
        height: c.h,
        png: c.png(),
        must_mention,
        text,
    };
    vec![
        pic(
            "solid_red",
            &Canvas::filled(400, 300, [220, 20, 20]),
            Some("red"),
            None,
        ),
        pic("text", &sign, None, Some(SIGN)),
        pic("tall", &tall, None, None),
        pic("wide", &wide, None, None),
        pic("tiny", &tiny, None, None),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pngs_are_well_formed() {
        // the CRC of "IEND" is fixed by the format
        assert_eq!(crc32(b"IEND"), 0xae42_6082);
        let p = pictures();
        assert_eq!(p.len(), 5);
        for pic in &p {
            assert_eq!(&pic.png[..8], b"\x89PNG\r\n\x1a\n");
            assert_eq!(
                u32::from_be_bytes(pic.png[16..20].try_into().unwrap()),
                pic.width
            );
            assert_eq!(
                u32::from_be_bytes(pic.png[20..24].try_into().unwrap()),
                pic.height
            );
        }
    }
}
