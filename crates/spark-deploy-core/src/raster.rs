//! A small RGB canvas encoded as PNG (zlib via flate2, CRC-32 computed here), with lines, boxes
//! and text in a 5×7 bitmap font (digits, letters shown upper-case, a little punctuation). Used
//! for the pictures `validate` sends and the charts `bench` writes.

use std::io::Write as _;

/// The 5×7 glyph of `c` (rows top to bottom, bit 4 = leftmost column); blank when unknown.
#[must_use]
pub fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        'A' => [0x0e, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'B' => [0x1e, 0x11, 0x11, 0x1e, 0x11, 0x11, 0x1e],
        'C' => [0x0e, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0e],
        'D' => [0x1c, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1c],
        'E' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x1f],
        'F' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x10],
        'G' => [0x0e, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0f],
        'H' => [0x11, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'I' => [0x0e, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0c],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1f],
        'M' => [0x11, 0x1b, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x19, 0x15, 0x13, 0x11, 0x11, 0x11],
        'O' => [0x0e, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'P' => [0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10, 0x10],
        'Q' => [0x0e, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0d],
        'R' => [0x1e, 0x11, 0x11, 0x1e, 0x14, 0x12, 0x11],
        'S' => [0x0f, 0x10, 0x10, 0x0e, 0x01, 0x01, 0x1e],
        'T' => [0x1f, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0a, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0a],
        'X' => [0x11, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0a, 0x04, 0x04, 0x04],
        'Z' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1f],
        '.' => [0, 0, 0, 0, 0, 0x0c, 0x0c],
        ',' => [0, 0, 0, 0, 0x0c, 0x04, 0x08],
        ':' => [0, 0x0c, 0x0c, 0, 0x0c, 0x0c, 0],
        '/' => [0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10],
        '-' => [0, 0, 0, 0x1f, 0, 0, 0],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '×' => [0, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0],
        _ => [0; 7],
    }
}

/// An RGB canvas.
#[derive(Debug, Clone)]
pub struct Canvas {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Canvas {
    /// A `w`×`h` canvas of one colour.
    #[must_use]
    pub fn filled(w: u32, h: u32, rgb: [u8; 3]) -> Self {
        let px = rgb
            .iter()
            .copied()
            .cycle()
            .take(w as usize * h as usize * 3)
            .collect();
        Self { w, h, px }
    }

    /// Width.
    #[must_use]
    pub fn width(&self) -> u32 {
        self.w
    }

    /// Height.
    #[must_use]
    pub fn height(&self) -> u32 {
        self.h
    }

    /// One pixel (outside the canvas: white).
    #[must_use]
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        if x < self.w && y < self.h {
            let i = (y as usize * self.w as usize + x as usize) * 3;
            [self.px[i], self.px[i + 1], self.px[i + 2]]
        } else {
            [255; 3]
        }
    }

    /// Sets one pixel (outside the canvas: nothing).
    pub fn set(&mut self, x: u32, y: u32, rgb: [u8; 3]) {
        if x < self.w && y < self.h {
            let i = (y as usize * self.w as usize + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&rgb);
        }
    }

    /// A filled rectangle.
    pub fn rect(&mut self, x: u32, y: u32, w: u32, h: u32, rgb: [u8; 3]) {
        for yy in y..y.saturating_add(h) {
            for xx in x..x.saturating_add(w) {
                self.set(xx, yy, rgb);
            }
        }
    }

    /// A line `width` pixels thick.
    pub fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), width: u32, rgb: [u8; 3]) {
        let n = (x1 - x0).abs().max((y1 - y0).abs()).ceil().max(1.0) as u32;
        let half = f64::from(width) / 2.0;
        for i in 0..=n {
            let t = f64::from(i) / f64::from(n);
            let (x, y) = (x0 + (x1 - x0) * t - half, y0 + (y1 - y0) * t - half);
            if x >= 0.0 && y >= 0.0 {
                self.rect(x as u32, y as u32, width, width, rgb);
            }
        }
    }

    /// Text with its top-left corner at (`x0`, `y0`), each font pixel `scale`×`scale`.
    pub fn text(&mut self, s: &str, x0: u32, y0: u32, scale: u32, rgb: [u8; 3]) {
        for (k, c) in s.chars().enumerate() {
            let g = glyph(c);
            let cx = x0 + k as u32 * 6 * scale;
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5u32 {
                    if bits & (0x10 >> col) != 0 {
                        self.rect(cx + col * scale, y0 + row as u32 * scale, scale, scale, rgb);
                    }
                }
            }
        }
    }

    /// Width in pixels of `s` at `scale`.
    #[must_use]
    pub fn text_width(s: &str, scale: u32) -> u32 {
        s.chars().count() as u32 * 6 * scale
    }

    /// The canvas as an 8-bit RGB PNG.
    #[must_use]
    pub fn png(&self) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_and_png_header() {
        // the CRC of "IEND" is fixed by the format
        assert_eq!(crc32(b"IEND"), 0xae42_6082);
        let mut c = Canvas::filled(20, 10, [255; 3]);
        c.text("A1", 0, 0, 1, [0; 3]);
        c.line((0.0, 9.0), (19.0, 0.0), 1, [255, 0, 0]);
        let png = c.png();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 20);
        assert_ne!(glyph('q'), [0; 7]);
    }
}
