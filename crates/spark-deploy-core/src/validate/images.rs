//! The generated pictures of the image check: a solid colour, rendered text, tall, wide and tiny
//! images, as 8-bit RGB PNGs ([`crate::raster`]). Text is drawn with a 5×7 bitmap font scaled up,
//! black on white.

use crate::raster::Canvas;

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

/// The probe set: solid red 400×300, "OPEN 24 HOURS" 640×240, tall 120×2000, wide 3000×90,
/// tiny 16×16.
#[must_use]
pub fn pictures() -> Vec<Picture> {
    let mut sign = Canvas::filled(640, 240, [255; 3]);
    sign.text(SIGN, 35, 85, 8, [0; 3]);
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
        width: c.width(),
        height: c.height(),
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
