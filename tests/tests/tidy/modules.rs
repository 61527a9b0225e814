//! adapter-redis's modules read bottom-up: no module import cycle.

use std::collections::BTreeSet;
use std::path::Path;

use super::{root, sources};

/// The module of a source file of `src` (`gate/provider.rs` -> `gate::provider`,
/// `gate/mod.rs` -> `gate`); `None` for the crate root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    (!parts.is_empty() && parts != ["lib"]).then(|| parts.join("::"))
}

/// Every path of a `use` tree, `{`-groups expanded (`crate::{a, b::{c, self}}` ->
/// `crate::a`, `crate::b::c`, `crate::b`).
fn use_paths(tree: &str) -> Vec<String> {
    // A rename (` as `) is marked before whitespace goes, so that a name containing "as"
    // (`leases`) is not cut there.
    let tree: String = tree
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let Some(open) = tree.find('{') else {
        let path = tree.split('@').next().unwrap_or_default();
        return vec![path.trim_end_matches("::self").to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.len() - 1];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|i| !i.is_empty())
        .flat_map(|i| use_paths(&format!("{prefix}{i}")))
        .collect()
}

/// The modules `text` (the source of module `module`) refers to: its `use` lines and every
/// `crate::x` / `super::x` path in its code, comments left out, each resolved to the longest
/// known module it names. A path through the crate root (`crate::RedisSettings`) is an
/// error: inside the crate, items are imported from their own module.
fn module_refs(module: &str, text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    // Inside an inline `mod tests { .. }`, `super` is the file's module itself.
    let inline_tests = code.find("mod tests {").unwrap_or(code.len());
    let mut paths: Vec<(usize, String)> = Vec::new();
    for (at, _) in code.match_indices("use ") {
        let boundary = at == 0 || !code.as_bytes()[at - 1].is_ascii_alphanumeric();
        let Some(end) = code[at..].find(';') else {
            continue;
        };
        if boundary {
            paths.extend(
                use_paths(&code[at + 4..at + end])
                    .into_iter()
                    .map(|p| (at, p)),
            );
        }
    }
    for root in ["crate::", "super::"] {
        for (at, _) in code.match_indices(root) {
            let boundary = at == 0
                || !(code.as_bytes()[at - 1].is_ascii_alphanumeric()
                    || code.as_bytes()[at - 1] == b'_');
            if boundary {
                let path: String = code[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                paths.push((at, path));
            }
        }
    }
    let mut refs = BTreeSet::new();
    for (at, path) in paths {
        let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let absolute: Vec<&str> = match segments.first() {
            Some(&"crate") => segments[1..].to_vec(),
            Some(&"super") if at >= inline_tests => continue,
            Some(&"super") => parent
                .split("::")
                .filter(|s| !s.is_empty())
                .chain(segments[1..].iter().copied())
                .collect(),
            Some(&"self") => continue,
            // A child module of this one (`pub use provider::X` in `gate/mod.rs`).
            Some(first) if modules.contains(&format!("{module}::{first}")) => {
                module.split("::").chain(segments.iter().copied()).collect()
            }
            _ => continue,
        };
        let target = (1..=absolute.len())
            .rev()
            .map(|n| absolute[..n].join("::"))
            .find(|m| modules.contains(m));
        match target {
            Some(t) if t != module => {
                refs.insert(t);
            }
            Some(_) => {}
            None if absolute.is_empty() => {}
            None => {
                panic!("{module}: `{path}` goes through the crate root; import it from its module")
            }
        }
    }
    refs
}

/// A cycle of `graph` (`a -> b -> ... -> a`), if there is one.
fn find_cycle(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

#[test]
fn adapter_redis_modules_import_each_other_without_a_cycle() {
    let src = root().join("crates/adapter-redis/src");
    let files: Vec<(String, String)> = sources("adapter-redis")
        .into_iter()
        .filter_map(|(path, text)| module_of(&src, &path).map(|m| (m, text)))
        .collect();
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    for (module, text) in &files {
        graph
            .entry(module.clone())
            .or_default()
            .extend(module_refs(module, text, &modules));
    }
    // The layers read bottom-up: the resolution of a path is not vacuous.
    assert!(graph["provider"].contains("pool"), "{graph:?}");
    assert!(graph["gate::provider"].contains("gate::keys"), "{graph:?}");
    assert!(graph["wire::tests"].contains("wire"), "{graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "adapter-redis modules import each other in a cycle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_module_cycle_check_finds_a_planted_cycle() {
    let modules: BTreeSet<String> = ["a", "b", "c", "c::d"].map(str::to_owned).into();
    let refs = |m: &str, text: &str| module_refs(m, text, &modules);
    assert_eq!(
        refs(
            "a",
            "use crate::{b::X, c::{d::{self, Y}}};\nfn f() { crate::b::g() } // crate::a"
        ),
        ["b", "c::d"].map(str::to_owned).into()
    );
    assert_eq!(
        refs("c::d", "use super::Z;"),
        ["c"].map(str::to_owned).into()
    );
    assert!(refs("b", "mod tests {\n use super::*;\n}").is_empty());
    let graph = |edges: &[(&str, &str)]| {
        let mut g = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
        for (from, to) in edges {
            g.entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
        }
        g
    };
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])),
        None
    );
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(["a", "b", "c", "a"].map(str::to_owned).to_vec())
    );
}
