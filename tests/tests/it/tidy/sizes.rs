//! Sizes a reader can hold in their head: no Rust source file over 800 lines (tests inside a
//! file count), no function over 120 lines.

use std::path::{Path, PathBuf};

use super::root;

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;

/// Every `.rs` file of the repository (`target/` and `.git/` left out).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            let name = entry.file_name();
            if p.is_dir() {
                if name != "target" && name != ".git" {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `text` with comments, string and character literals blanked (newlines kept), so that
/// braces and the word `fn` are seen only where they are code.
pub(super) fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(next, Some(b'"') | Some(b'#')) && !ident_before(b, i) {
            // A raw string: r"..." or r#"..."#, closed by a quote and as many hashes.
            let mut j = i + 1;
            while b.get(j) == Some(&b'#') {
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let closes = |k: usize| {
                b[k] == b'"'
                    && b.len() >= k + 1 + hashes
                    && b[k + 1..k + 1 + hashes].iter().all(|&h| h == b'#')
            };
            let mut k = j + 1;
            while k < b.len() && !closes(k) {
                k += 1;
            }
            let end = (k + 1 + hashes).min(b.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                blank(&mut out, b[i]);
                i += 1;
            }
            if i < b.len() {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{7f}'), not a lifetime ('a).
            let close = if next == Some(b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else {
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match close {
                Some(end) => {
                    for &x in &b[i..=end] {
                        blank(&mut out, x);
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Each function with a body in `code` (as [`code_only`] leaves it): its name, first line
/// (from 1) and length in lines, from the `fn` keyword to the closing brace.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let line_of = |pos: usize| code[..pos].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = code[i..].find("fn ") {
        let at = i + p;
        i = at + 3;
        if ident_before(b, at) {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body starts at the first `{` before any `;` (a declaration has no body).
        let rest = &code[at..];
        let Some(open) = rest.find(['{', ';']) else {
            continue;
        };
        if rest.as_bytes()[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let mut end = None;
        for (k, &ch) in rest.as_bytes()[open..].iter().enumerate() {
            match ch {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(at + open + k);
                        break;
                    }
                }
                _ => {}
            }
        }
        if let Some(end) = end {
            out.push((name, line_of(at), line_of(end) - line_of(at) + 1));
        }
    }
    out
}

#[test]
fn no_rust_file_over_800_lines_and_no_function_over_120() {
    let root = root();
    let mut problems = Vec::new();
    for path in rust_files(&root) {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let rel = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            problems.push(format!("{rel}: {lines} lines (at most {MAX_FILE_LINES})"));
        }
        for (name, line, len) in functions(&code_only(&text)) {
            if len > MAX_FN_LINES {
                problems.push(format!(
                    "{rel}:{line}: fn {name} is {len} lines (at most {MAX_FN_LINES})"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_size_check_sees_functions_through_strings_comments_and_chars() {
    let text = "fn a() {\n    let s = \"}\";\n    // }\n    let c = '}';\n    let r = r#\"}\"#;\n}\nfn b<'x>(v: &'x str) -> &'x str {\n    v\n}\ntrait T { fn d(&self); }\n";
    let found = functions(&code_only(text));
    assert_eq!(
        found,
        vec![("a".to_owned(), 1, 6), ("b".to_owned(), 7, 3)],
        "{}",
        code_only(text)
    );
}
