//! The head's NFS exports as `/etc/exports` and `/etc/exports.d/*.exports` write them: whether
//! a path is exported read-only to a worker's address. Preflight decides on it before anything
//! is downloaded; ConfigureWorkerStorage checks it again before it creates the worker's volume.

use std::net::Ipv4Addr;

/// The command that prints every exports file of the head (nothing when there is none).
pub const EXPORTS_SCRIPT: &str = "cat /etc/exports /etc/exports.d/*.exports 2>/dev/null; true";

/// Whether `exports` (the text of `/etc/exports` and `/etc/exports.d/*`) export `path` (or a
/// parent of it) read-only to `client` (by address, a CIDR containing it, or `*`).
///
/// # Errors
///
/// What the exports say instead (no entry, or only a read-write one).
pub fn check_exports(exports: &str, path: &str, client: Ipv4Addr) -> Result<(), String> {
    let joined = exports.replace("\\\n", " ");
    let mut rw = false;
    for line in joined.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        let Some(export) = words.next() else { continue };
        let export = export.trim_matches('"').trim_end_matches('/');
        let covers = path == export || path.starts_with(&format!("{export}/")) || export.is_empty();
        if !covers {
            continue;
        }
        for entry in words {
            let (host, opts) = entry
                .split_once('(')
                .map_or((entry, ""), |(h, o)| (h, o.trim_end_matches(')')));
            if !host_matches(host, client) {
                continue;
            }
            if opts.split(',').any(|o| o == "rw") {
                rw = true;
            } else {
                return Ok(());
            }
        }
    }
    Err(if rw {
        "it is exported read-write; make it `ro`".to_owned()
    } else {
        format!("no export of {path} or a parent to {client}")
    })
}

fn host_matches(host: &str, client: Ipv4Addr) -> bool {
    if host == "*" || host.is_empty() {
        return true;
    }
    if let Ok(a) = host.parse::<Ipv4Addr>() {
        return a == client;
    }
    if let Some((net, bits)) = host.split_once('/')
        && let (Ok(net), Ok(bits)) = (net.parse::<Ipv4Addr>(), bits.parse::<u32>())
        && bits <= 32
    {
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        return u32::from(net) & mask == u32::from(client) & mask;
    }
    false
}
