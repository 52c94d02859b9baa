//! Printing an error once: the top line and each cause once, as cargo does.
//!
//! Many errors both write their cause into their own message (`"starting rank 1 on worker-1:
//! <cause>"`) and expose it as [`std::error::Error::source`]. Walking the chain naively prints
//! every cause twice; [`causes`] strips from each message the text its cause repeats.

use std::error::Error;

/// The messages of `err` and its sources, top first, each cause's text appearing once.
#[must_use]
pub fn causes(err: &(dyn Error + 'static)) -> Vec<String> {
    let mut levels: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(e) = cur {
        levels.push(e.to_string());
        cur = e.source();
    }
    let mut out: Vec<String> = Vec::new();
    for (i, msg) in levels.iter().enumerate() {
        let mut own = msg.as_str();
        if let Some(next) = levels.get(i + 1) {
            if own == next {
                continue;
            }
            if let Some(stripped) = own.strip_suffix(next.as_str()) {
                own = stripped.trim_end_matches([':', ' ', '(', '\n']);
            }
        }
        // A cause whose text its parent already shows adds nothing.
        if own.is_empty() || out.last().is_some_and(|l| l.contains(own)) {
            continue;
        }
        out.push(own.to_owned());
    }
    out
}

/// [`causes`] joined as one line: `top: cause: cause`.
#[must_use]
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    causes(err).join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}: {source}")]
    struct Read {
        path: String,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("starting rank 1 on worker-1: {0}")]
    struct Start(#[source] Read);

    #[derive(Debug, thiserror::Error)]
    #[error("the launch failed")]
    struct Plain(#[source] std::io::Error);

    #[test]
    fn each_cause_appears_once() {
        let e = Start(Read {
            path: "/x".into(),
            source: std::io::Error::other("denied"),
        });
        assert_eq!(
            causes(&e),
            ["starting rank 1 on worker-1", "reading /x", "denied"]
        );
        assert_eq!(
            one_line(&e),
            "starting rank 1 on worker-1: reading /x: denied"
        );
        let p = Plain(std::io::Error::other("gone"));
        assert_eq!(causes(&p), ["the launch failed", "gone"]);
        // A wrapper that quotes its cause inside its own words keeps them; the cause is not
        // repeated after it.
        #[derive(Debug, thiserror::Error)]
        #[error("request error: {0} (retry later)")]
        struct Quotes(#[source] std::io::Error);
        let q = Quotes(std::io::Error::other("refused"));
        assert_eq!(causes(&q), ["request error: refused (retry later)"]);
    }
}
