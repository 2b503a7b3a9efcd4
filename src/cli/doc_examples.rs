//! Every `flotilla` command shown in the README and the docs parses with
//! today's flags, so a renamed or removed flag fails CI, not a reader.

use clap::Parser;

use super::args::Cli;

const DOCS: [(&str, &str); 6] = [
    ("README.md", include_str!("../../README.md")),
    ("docs/install.md", include_str!("../../docs/install.md")),
    ("docs/lifecycle.md", include_str!("../../docs/lifecycle.md")),
    ("docs/reference.md", include_str!("../../docs/reference.md")),
    ("docs/runbook.md", include_str!("../../docs/runbook.md")),
    ("docs/api.md", include_str!("../../docs/api.md")),
];

/// The commands in a document's code blocks: continuation lines joined,
/// comments and prompts dropped, `$F` read as `flotilla`.
fn commands(doc: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code {
            continue;
        }
        let text = line.split(" #").next().unwrap_or("").trim();
        let (start, mut so_far) = match pending.take() {
            Some((n, s)) => (n, s + " "),
            None => {
                let text = text.strip_prefix("$ ").unwrap_or(text);
                if !(text.starts_with("flotilla ") || text.starts_with("$F ")) {
                    continue;
                }
                (i + 1, String::new())
            }
        };
        let text = text.strip_prefix("$ ").unwrap_or(text);
        match text.strip_suffix('\\') {
            Some(head) => {
                so_far.push_str(head.trim());
                pending = Some((start, so_far));
            }
            None => {
                so_far.push_str(text);
                out.push((start, so_far));
            }
        }
    }
    out
}

/// Shell words, with variables filled in and optional brackets opened.
fn words(command: &str) -> Vec<String> {
    command
        .replace(['[', ']'], " ")
        .split_whitespace()
        .map(|w| {
            let w = w.trim_matches('"');
            match w {
                "$F" => "flotilla".to_string(),
                v if v.starts_with('$') => "http://127.0.0.1:50051".to_string(),
                v => v.to_string(),
            }
        })
        .collect()
}

#[test]
fn every_documented_command_parses() {
    let mut checked = 0;
    for (doc, text) in DOCS {
        for (line, command) in commands(text) {
            // A synopsis of alternatives is for people, not for the parser.
            if command.contains(" | ") {
                continue;
            }
            if let Err(e) = Cli::try_parse_from(words(&command)) {
                panic!("{doc}:{line}: `{command}` does not parse:\n{e}");
            }
            checked += 1;
        }
    }
    // The README and the runbook alone show more than this many.
    assert!(
        checked >= 12,
        "only {checked} commands found: the extraction broke"
    );
}

#[test]
fn a_drifted_flag_is_caught() {
    let doc = "```sh\nflotilla run --kubeconfig x \\\n  --no-such-flag 1\n```\n";
    let found = commands(doc);
    assert_eq!(found.len(), 1);
    assert!(Cli::try_parse_from(words(&found[0].1)).is_err());
}
