//! Parsers of `nvidia-smi -q` output (text) into GPU clock facts.
//!
//! `N/A`, `Not Found` and anything that is not a number of MHz is *unknown*, never zero: a GB10
//! reports several fields as `N/A`, and reading them as 0 would make every comparison lie.

use serde::Serialize;

/// Clock facts of one GPU, in MHz; `None` is unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuClocks {
    /// PCI bus id from the section header.
    pub bus_id: String,
    /// `Max Clocks / Graphics`.
    pub max_graphics: Option<u32>,
    /// `Max Clocks / SM`.
    pub max_sm: Option<u32>,
    /// `Max Clocks / Memory`.
    pub max_memory: Option<u32>,
    /// `Applications Clocks / Graphics`.
    pub app_graphics: Option<u32>,
    /// `Applications Clocks / Memory`.
    pub app_memory: Option<u32>,
    /// A locked graphics clock (`-lgc`) when the driver reports one (`Locked Clocks` sections).
    pub locked_graphics: Option<(u32, u32)>,
}

/// Parses `"1980 MHz"`; anything else (`N/A`, `Not Found`, empty) is unknown.
#[must_use]
pub fn mhz(value: &str) -> Option<u32> {
    value
        .trim()
        .strip_suffix("MHz")
        .and_then(|n| n.trim().parse().ok())
}

/// Parses `nvidia-smi -q -d CLOCK` (or full `-q`) text: one entry per `GPU <bus id>` section.
#[must_use]
pub fn parse_clocks(text: &str) -> Vec<GpuClocks> {
    let mut gpus: Vec<GpuClocks> = Vec::new();
    let mut section = String::new();
    let mut lock_min: Option<u32> = None;
    for line in text.lines() {
        if let Some(id) = line.strip_prefix("GPU ") {
            gpus.push(GpuClocks {
                bus_id: id.trim().to_owned(),
                ..GpuClocks::default()
            });
            section.clear();
            continue;
        }
        let Some(gpu) = gpus.last_mut() else { continue };
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        match trimmed.split_once(':') {
            None if indent == 4 && !trimmed.is_empty() => section = trimmed.to_owned(),
            Some((key, value)) if indent >= 8 => {
                let (key, v) = (key.trim(), mhz(value));
                match (section.as_str(), key) {
                    ("Max Clocks", "Graphics") => gpu.max_graphics = v,
                    ("Max Clocks", "SM") => gpu.max_sm = v,
                    ("Max Clocks", "Memory") => gpu.max_memory = v,
                    ("Applications Clocks", "Graphics") => gpu.app_graphics = v,
                    ("Applications Clocks", "Memory") => gpu.app_memory = v,
                    (s, k) if s.contains("Locked") && k.contains("Min") => lock_min = v,
                    (s, k) if s.contains("Locked") && k.contains("Max") => {
                        gpu.locked_graphics = lock_min.zip(v);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    gpus
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str =
        include_str!("../../../../tests/fixtures/host-facts/h200x2/nvidia-smi-q-clock.txt");

    #[test]
    fn parses_the_real_h200_output() {
        let g = parse_clocks(FIXTURE);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].bus_id, "00000000:00:06.0");
        assert_eq!(g[0].max_graphics, Some(1980));
        assert_eq!(g[0].max_sm, Some(1980));
        assert_eq!(g[0].max_memory, Some(3201));
        assert_eq!(g[0].app_graphics, Some(1980));
        assert_eq!(g[1].app_memory, Some(3201));
        assert_eq!(g[0].locked_graphics, None, "this driver reports no lock");
    }

    #[test]
    fn not_available_is_unknown_not_zero() {
        assert_eq!(mhz(" N/A"), None);
        assert_eq!(mhz("Not Found"), None);
        assert_eq!(mhz("0 MHz"), Some(0));
        let text =
            "GPU 0000000F:01:00.0\n    Max Clocks\n        Graphics : N/A\n        SM : 3003 MHz\n";
        let g = parse_clocks(text);
        assert_eq!(g[0].max_graphics, None);
        assert_eq!(g[0].max_sm, Some(3003));
    }
}
