//! Docs and comments point only at what a reader of the repository can open.

use std::path::{Path, PathBuf};

use super::root;

/// Text files a reader of the repository opens: sources, docs, manifests and scripts
/// (`target/` and `.git/` left out), each with its text.
fn repo_text_files(root: &Path) -> Vec<(PathBuf, String)> {
    const EXTENSIONS: [&str; 6] = ["rs", "md", "toml", "sh", "lua", "py"];
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "target" && name != ".git" {
                    stack.push(p);
                }
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            let known = p
                .extension()
                .is_some_and(|e| EXTENSIONS.iter().any(|x| e == *x));
            // Extensionless scripts (such as `.ci/run`) count too.
            if known || (p.extension().is_none() && text.starts_with("#!")) {
                out.push((p, text));
            }
        }
    }
    out.sort();
    out
}

/// The lines of `text` a reader reads as prose, numbered from 1: every line of a document,
/// manifest or script; only the comments of a Rust source (its string literals are code,
/// such as the patterns of this very check).
fn prose_lines<'a>(path: &Path, text: &'a str) -> Vec<(usize, &'a str)> {
    let rust = path.extension().is_some_and(|e| e == "rs");
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            if !rust || line.trim_start().starts_with("//") {
                return Some((i + 1, line));
            }
            line.find(" // ").map(|at| (i + 1, &line[at..]))
        })
        .collect()
}

/// Characters of a path as docs and comments write one.
fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// Paths below the repository root that `line` mentions (a path starting with one of
/// `ROOTS`), without a trailing `#anchor` or punctuation. A mention that continues with a glob
/// or a placeholder (`lua/rate-*-v1.lua`, `bench/<name>`) names no single file and is left
/// out, as is a path inside a longer one (`adapter-redis/src/...`, a URL).
fn root_path_mentions(line: &str) -> Vec<String> {
    const ROOTS: [&str; 7] = [
        "docs/",
        "lua/",
        "crates/",
        "bench/",
        "examples/",
        "tests/tests/",
        "tests/src/",
    ];
    let mut out = Vec::new();
    for (at, _) in line.char_indices() {
        let rest = &line[at..];
        let Some(prefix) = ROOTS.iter().find(|r| rest.starts_with(*r)) else {
            continue;
        };
        let before = &line[..at];
        let boundary = before.chars().next_back().is_none_or(|c| !is_path_char(c))
            || before.ends_with("$ROOT/");
        if !boundary {
            continue;
        }
        let end = rest.find(|c: char| !is_path_char(c)).unwrap_or(rest.len());
        if rest[end..].starts_with(['*', '<', '{', '$']) {
            continue;
        }
        let path = rest[..end].trim_end_matches(['.', ',', ':', ';']);
        if path.len() > prefix.len() || path == *prefix {
            out.push(path.to_owned());
        }
    }
    out
}

/// Targets of relative markdown links (`[text](path#anchor)`) in `line`, anchors removed.
fn markdown_link_targets(line: &str) -> Vec<String> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap_or_default();
            let external = target.contains("://") || target.starts_with("mailto:");
            (!external && !target.is_empty()).then(|| target.to_owned())
        })
        .collect()
}

/// The path literal of an `include_str!` / `include_bytes!` in `line`.
fn include_target(line: &str) -> Option<&str> {
    let at = line
        .find("include_str!(\"")
        .map(|i| i + "include_str!(\"".len())
        .or_else(|| {
            line.find("include_bytes!(\"")
                .map(|i| i + "include_bytes!(\"".len())
        })?;
    let rest = &line[at..];
    rest.find('"').map(|end| &rest[..end])
}

/// Mentions of what a reader of the repository cannot open: the external interface page,
/// the shared folder beside the repository, numbered seeds and numbered issues.
fn unopenable_mentions(line: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let mut out = Vec::new();
    for fixed in ["interface.md", "../shared", "seeds/"] {
        if lower.contains(fixed) {
            out.push(format!("mentions `{fixed}`"));
        }
    }
    for word in ["seed ", "issue "] {
        for (at, _) in lower.match_indices(word) {
            let rest = lower[at + word.len()..].trim_start_matches('#');
            let starts_word = at == 0 || !lower.as_bytes()[at - 1].is_ascii_alphanumeric();
            if starts_word && rest.starts_with(|c: char| c.is_ascii_digit()) {
                let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
                out.push(format!("mentions `{word}{n}`"));
            }
        }
    }
    out
}

/// Every reference in `line` of `file` that a reader of the repository at `root` cannot
/// follow, described.
fn dangling_references(root: &Path, file: &Path, line: &str) -> Vec<String> {
    let dir = file.parent().unwrap_or(root);
    let mut out = unopenable_mentions(line);
    for path in root_path_mentions(line) {
        if !root.join(&path).exists() {
            out.push(format!("`{path}` is not in the repository"));
        }
    }
    if file.extension().is_some_and(|e| e == "md") {
        for target in markdown_link_targets(line) {
            if !dir.join(&target).exists() {
                out.push(format!(
                    "link to `{target}`, which is not in the repository"
                ));
            }
        }
    }
    if let Some(target) = include_target(line)
        && !dir.join(target).exists()
    {
        out.push(format!(
            "includes `{target}`, which is not in the repository"
        ));
    }
    out
}

/// Docs and comments point only at what a reader of the repository can open: every path
/// they mention, every relative link and every `include_str!` resolves to a file of the
/// repository, and none names the external interface page, a seed or an issue by number.
#[test]
fn docs_and_comments_reference_only_files_in_the_repo() {
    let root = root();
    let mut problems = Vec::new();
    for (path, text) in repo_text_files(&root) {
        let shown = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        for (n, line) in prose_lines(&path, &text) {
            for p in dangling_references(&root, &path, line) {
                problems.push(format!("{shown}:{n}: {p}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} references a reader of the repository cannot follow:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The check above finds what it is meant to find (so that its passing means something).
#[test]
fn the_reference_check_flags_dangling_and_unopenable_references() {
    let root = root();
    let md = root.join("README.md");
    let rs = root.join("tests/tests/it/tidy/references.rs");
    let flagged = |file: &Path, line: &str| dangling_references(&root, file, line).len();
    // Each of these lines holds exactly one problem.
    for line in [
        "see docs/no-such-page.md for more",
        "run `bench/no-such-script.sh 10`",
        "as the [guide](missing.md#top) says",
        "the contract of interface.md",
        "as in ../shared/spec",
        "the fixture of seed 004",
        "asked by issue 3",
        "asked by Issue #12",
    ] {
        assert_eq!(flagged(&md, line), 1, "{line}");
    }
    assert_eq!(
        flagged(&rs, r#"const X: &str = include_str!("../no-such.lua");"#),
        1
    );
    // None of these is a problem.
    for line in [
        "see [the architecture](docs/ARCHITECTURE.md#code-map) and docs/operations.md.",
        "every `lua/rate-*-v1.lua`, `bench/<name>/RESULTS.md`, https://example.com/docs/x.md",
        "crates/adapter-redis/src/ and `examples/local.toml`; cluster seed nodes; the issue's goal",
    ] {
        assert_eq!(flagged(&md, line), 0, "{line}");
    }
}
