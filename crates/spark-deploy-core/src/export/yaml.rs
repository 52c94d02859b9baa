//! Typed values to YAML (`serde_norway`, the maintained fork of the archived `serde_yaml`), and
//! the comments that explain an export's choices: a header, and a comment above the first line
//! that starts (after its indentation) with each anchor.

use serde::Serialize;

use super::ExportError;

/// `value` as YAML.
///
/// # Errors
///
/// [`ExportError::Yaml`].
pub(super) fn to_string<T: Serialize>(
    what: &'static str,
    value: &T,
) -> Result<String, ExportError> {
    let text =
        serde_norway::to_string(value).map_err(|source| ExportError::Yaml { what, source })?;
    Ok(text
        .lines()
        .map(quote_yaml11_booleans)
        .fold(String::new(), |mut out, l| {
            out.push_str(&l);
            out.push('\n');
            out
        }))
}

/// YAML 1.1 readers (PyYAML, older tools) take a plain `no`, `yes`, `on`, `off`, `y`, `n` as a
/// boolean; the serializer writes such strings plain (YAML 1.2), so they are quoted here. Real
/// booleans are written `true`/`false` and never match.
fn quote_yaml11_booleans(line: &str) -> String {
    const WORDS: [&str; 22] = [
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
        "OFF", "true", "True", "TRUE", "false", "False", "FALSE",
    ];
    let value_at = line.find(": ").map(|i| i + 2).or_else(|| {
        line.trim_start()
            .starts_with("- ")
            .then(|| line.len() - line.trim_start().len() + 2)
    });
    match value_at {
        Some(i) if WORDS[..16].contains(&&line[i..]) => format!("{}'{}'", &line[..i], &line[i..]),
        _ => line.to_owned(),
    }
}

/// `text` wrapped to comment lines of at most 100 columns at `indent`; a paragraph starting
/// with `$ ` (a command to copy) is kept on one line.
fn comment(text: &str, indent: &str) -> String {
    let mut out = String::new();
    for paragraph in text.split('\n') {
        if let Some(command) = paragraph.strip_prefix("$ ") {
            out.push_str(&format!("{indent}#   {command}\n"));
            continue;
        }
        let mut line = format!("{indent}#");
        for word in paragraph.split_whitespace() {
            if line.len() + 1 + word.len() > 100 && line.trim_start() != "#" {
                out.push_str(&line);
                out.push('\n');
                line = format!("{indent}#");
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `yaml` with `header` on top and each `(anchor, text)` as a comment above the first line
/// whose content starts with `anchor`, at that line's indentation.
pub(super) fn with_comments(yaml: &str, header: &str, anchors: &[(&str, &str)]) -> String {
    let mut pending: Vec<(&str, &str)> = anchors.to_vec();
    let mut out = comment(header, "");
    for line in yaml.lines() {
        let content = line.trim_start();
        let content = content.strip_prefix("- ").unwrap_or(content);
        if let Some(i) = pending.iter().position(|(a, _)| content.starts_with(a)) {
            let (_, text) = pending.remove(i);
            let indent = &line[..line.len() - line.trim_start().len()];
            out.push_str(&comment(text, indent));
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_go_above_the_first_match_at_its_indentation() {
        let y = "a:\n  b: 1\n  c: 2\nd:\n  c: 3\n";
        let out = with_comments(y, "head", &[("c:", "why c"), ("missing:", "never")]);
        assert_eq!(out, "# head\na:\n  b: 1\n  # why c\n  c: 2\nd:\n  c: 3\n");
    }

    #[test]
    fn yaml_1_1_booleans_written_as_strings_are_quoted() {
        #[derive(Serialize)]
        struct T {
            restart: &'static str,
            list: Vec<&'static str>,
            real: bool,
        }
        let t = T {
            restart: "no",
            list: vec!["on", "x"],
            real: false,
        };
        assert_eq!(
            to_string("t", &t).unwrap(),
            "restart: 'no'\nlist:\n- 'on'\n- x\nreal: false\n"
        );
    }

    #[test]
    fn commands_stay_on_one_line() {
        let text = format!("intro\n$ kubectl {}", "x ".repeat(60));
        let out = comment(&text, "");
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(out.lines().nth(1).unwrap().starts_with("#   kubectl x x"));
    }

    #[test]
    fn long_comments_wrap_at_100_columns() {
        let text = "word ".repeat(60);
        for l in comment(&text, "    ").lines() {
            assert!(l.len() <= 100 && l.starts_with("    # "), "{l:?}");
        }
    }
}
