//! No circle between sibling modules, in every crate under `crates/`.
//!
//! For each module, the edges between its direct children: a reference from anywhere inside
//! child `a` to anywhere inside child `b` is an edge `a -> b` (a deeper module counts as the
//! child of that parent it lies under). A child's reference to its parent (`super::X`) or a
//! parent's to its child is no such edge. A circle among the children means neither can be
//! read, tested or moved without the other: one of them holds what belongs to the other.
//!
//! References are `use` trees and `crate::x` / `super::x` paths in code (comments and strings
//! left out), resolved through the `pub use` re-exports of each module, so that
//! `crate::Limiter` counts as a reference to the module that defines `Limiter`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::root;
use super::sizes::code_only;

/// The module tree of one crate target (a library or a binary).
#[derive(Debug, Default)]
struct Tree {
    /// The code of each module (`""` is the crate root), as `code_only` leaves it.
    modules: BTreeMap<String, String>,
    /// The names each module re-exports with `pub use`, each with the path it stands for.
    exports: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// The source files read.
    files: Vec<PathBuf>,
}

fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_owned()
    } else {
        format!("{parent}::{child}")
    }
}

/// Whether `inner` is `outer` or lies under it (everything lies under the root `""`).
fn within(inner: &str, outer: &str) -> bool {
    outer.is_empty()
        || inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with("::"))
}

/// The `mod name;` declarations of a file, each with its `#[path = ".."]` if it has one.
fn declared_modules(raw: &str, code: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut path = None;
    for (raw_line, line) in raw.lines().zip(code.lines()) {
        let line = line.trim();
        if line.starts_with("#[path") {
            path = raw_line.split('"').nth(1).map(str::to_owned);
            continue;
        }
        if line.starts_with("#[") || line.is_empty() {
            continue;
        }
        let rest = line.strip_prefix("pub").map_or(line, |r| {
            r.trim_start()
                .strip_prefix('(')
                .and_then(|r| r.split_once(')'))
                .map_or(r, |(_, r)| r)
                .trim_start()
        });
        if let Some(name) = rest
            .strip_prefix("mod ")
            .and_then(|r| r.trim().strip_suffix(';'))
        {
            out.push((name.trim().to_owned(), path.take()));
        }
        path = None;
    }
    out
}

/// The module tree that starts at the crate root file `root_file`, following `mod x;`.
fn tree(root_file: &Path) -> Tree {
    let mut tree = Tree::default();
    let mut stack = vec![(String::new(), root_file.to_path_buf(), true)];
    while let Some((module, file, owns_dir)) = stack.pop() {
        let raw =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let code = code_only(&raw);
        let here = file.parent().expect("a file has a directory");
        let dir = if owns_dir {
            here.to_path_buf()
        } else {
            here.join(file.file_stem().expect("a file has a name"))
        };
        for (name, path) in declared_modules(&raw, &code) {
            let (child, owns) = match path {
                Some(p) => (here.join(p), false),
                None if dir.join(format!("{name}.rs")).exists() => {
                    (dir.join(format!("{name}.rs")), false)
                }
                None => (dir.join(&name).join("mod.rs"), true),
            };
            stack.push((join(&module, &name), child, owns));
        }
        tree.files.push(file);
        tree.modules.insert(module, code);
    }
    let names: Vec<String> = tree.modules.keys().cloned().collect();
    for module in names {
        let exports = reexports(&module, &tree.modules[&module], &tree);
        tree.exports.insert(module, exports);
    }
    tree
}

/// Every path of a `use` tree with the name it brings in, `{`-groups expanded
/// (`crate::{a, b::{c as d, self}}` -> `crate::a` as `a`, `crate::b::c` as `d`, `crate::b`
/// as `b`).
fn use_items(tree: &str) -> Vec<(String, String)> {
    // A rename (` as `) is marked before whitespace goes, so that a name containing "as"
    // (`leases`) is not cut there.
    let tree: String = tree
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let Some(open) = tree.find('{') else {
        let (path, alias) = tree.split_once('@').unwrap_or((&tree, ""));
        let path = path.trim_end_matches("::self");
        let name = if alias.is_empty() {
            path.rsplit("::").next().unwrap_or_default()
        } else {
            alias
        };
        return vec![(path.to_owned(), name.to_owned())];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.len().saturating_sub(1).max(open + 1)];
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
        .flat_map(|i| use_items(&format!("{prefix}{i}")))
        .collect()
}

/// The `use` trees of `code`, each with its position and whether it is a `pub` re-export.
fn use_trees(code: &str) -> Vec<(usize, bool, &str)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("use ") {
        let boundary = at == 0 || !code.as_bytes()[at - 1].is_ascii_alphanumeric();
        let Some(end) = code[at..].find(';') else {
            continue;
        };
        if boundary {
            let line = code[..at].rsplit('\n').next().unwrap_or_default().trim();
            out.push((at, line.starts_with("pub"), &code[at + 4..at + end]));
        }
    }
    out
}

/// `path`, written in module `module`, as segments from the crate root; `None` for a path
/// that starts outside the crate (another crate, `std`, a local name).
fn absolute(module: &str, path: &str, in_inline_tests: bool, tree: &Tree) -> Option<Vec<String>> {
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let own: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let out: Vec<&str> = match segments.first() {
        Some(&"crate") => segments[1..].to_vec(),
        Some(&"super") => {
            let ups = segments.iter().take_while(|s| **s == "super").count();
            // Inside an inline `mod tests { .. }`, the first `super` is the file's module.
            let ups = ups - usize::from(in_inline_tests);
            let keep = own.len().checked_sub(ups)?;
            own[..keep]
                .iter()
                .chain(&segments[ups + usize::from(in_inline_tests)..])
                .copied()
                .collect()
        }
        Some(&"self") => own.iter().chain(&segments[1..]).copied().collect(),
        // A child module of this one (`pub use provider::X` in `gate/mod.rs`).
        Some(first) if tree.modules.contains_key(&join(module, first)) => {
            own.iter().chain(&segments).copied().collect()
        }
        _ => return None,
    };
    Some(out.into_iter().map(str::to_owned).collect())
}

/// The names module `module` re-exports (`pub use a::B;`), each with its absolute path.
fn reexports(module: &str, code: &str, tree: &Tree) -> BTreeMap<String, Vec<String>> {
    let inline_tests = code.find("mod tests {").unwrap_or(code.len());
    use_trees(code)
        .into_iter()
        .filter(|(_, public, _)| *public)
        .flat_map(|(at, _, t)| use_items(t).into_iter().map(move |i| (at, i)))
        .filter(|(_, (_, name))| name != "*" && name != "_")
        .filter_map(|(at, (path, name))| {
            absolute(module, &path, at >= inline_tests, tree).map(|p| (name, p))
        })
        .collect()
}

/// The module an absolute path lands in: the deepest module it names, following re-exports.
fn resolve(path: &[String], tree: &Tree, depth: usize) -> String {
    let mut module = String::new();
    for (i, segment) in path.iter().enumerate() {
        let child = join(&module, segment);
        if tree.modules.contains_key(&child) {
            module = child;
            continue;
        }
        let exported = tree.exports.get(&module).and_then(|e| e.get(segment));
        if let Some(target) = exported.filter(|_| depth < 8) {
            let mut next = target.clone();
            next.extend(path[i + 1..].iter().cloned());
            return resolve(&next, tree, depth + 1);
        }
        break;
    }
    module
}

/// The modules the code of `module` refers to: its `use` trees and every `crate::x` /
/// `super::x` / `self::x` path, each resolved to the module that defines what it names. The
/// crate root, every module's ancestor, is left out.
fn module_refs(module: &str, tree: &Tree) -> BTreeSet<String> {
    let code = &tree.modules[module];
    let inline_tests = code.find("mod tests {").unwrap_or(code.len());
    let mut paths: Vec<(usize, String)> = use_trees(code)
        .into_iter()
        .flat_map(|(at, _, t)| use_items(t).into_iter().map(move |(p, _)| (at, p)))
        .collect();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            let before = at.checked_sub(1).map(|i| code.as_bytes()[i]);
            if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            paths.push((at, path));
        }
    }
    paths
        .into_iter()
        .filter_map(|(at, path)| absolute(module, &path, at >= inline_tests, tree))
        .map(|path| resolve(&path, tree, 0))
        .filter(|target| target != module && !target.is_empty())
        .collect()
}

/// The edges between sibling modules, by parent: `a -> b` under `p` when something inside
/// `p::a` refers to something inside `p::b`.
fn sibling_edges(tree: &Tree) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut out = BTreeMap::<String, BTreeMap<String, BTreeSet<String>>>::new();
    for from in tree.modules.keys() {
        for to in module_refs(from, tree) {
            if within(from, &to) || within(&to, from) {
                continue;
            }
            let a: Vec<&str> = from.split("::").collect();
            let b: Vec<&str> = to.split("::").collect();
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let parent = a[..common].join("::");
            out.entry(parent.clone())
                .or_default()
                .entry(join(&parent, a[common]))
                .or_default()
                .insert(join(&parent, b[common]));
        }
    }
    out
}

/// A cycle of `graph` (`a -> b -> ... -> a`) through `start`, if there is one.
fn cycle_through(start: &str, graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // Breadth first, so that the cycle reported is a shortest one.
    let mut came_from = BTreeMap::<&str, &str>::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flatten() {
            if next == start {
                let mut cycle = vec![node.to_owned()];
                let mut at = node;
                while at != start {
                    at = came_from[at];
                    cycle.push(at.to_owned());
                }
                cycle.reverse();
                cycle.push(start.to_owned());
                return Some(cycle);
            }
            if !came_from.contains_key(next.as_str()) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    None
}

/// One cycle per group of modules that reach each other in `graph`.
fn find_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut covered = BTreeSet::new();
    let mut out = Vec::new();
    for node in graph.keys() {
        if covered.contains(node) {
            continue;
        }
        if let Some(cycle) = cycle_through(node, graph) {
            covered.extend(cycle.iter().cloned());
            out.push(cycle);
        }
    }
    out
}

/// The crate targets of `crates/<name>`: the library and the binaries, by root file.
fn targets(name: &str) -> Vec<(String, PathBuf)> {
    let src = root().join("crates").join(name).join("src");
    let mut out: Vec<(String, PathBuf)> = ["lib", "main"]
        .into_iter()
        .map(|t| (t.to_owned(), src.join(format!("{t}.rs"))))
        .collect();
    for entry in std::fs::read_dir(src.join("bin"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = entry.path();
        let stem = p.file_stem().unwrap_or_default().to_string_lossy();
        let file = if p.is_dir() {
            p.join("main.rs")
        } else {
            p.clone()
        };
        out.push((format!("bin {stem}"), file));
    }
    out.retain(|(_, file)| file.exists());
    out
}

/// The circles of every target of `crates/<name>`, each as `crate (target), in module:
/// a -> b -> a`.
fn crate_circles(name: &str) -> Vec<String> {
    let mut reached = BTreeSet::new();
    let mut out = Vec::new();
    for (target, file) in targets(name) {
        let tree = tree(&file);
        reached.extend(tree.files.iter().cloned());
        for (parent, graph) in sibling_edges(&tree) {
            for cycle in find_cycles(&graph) {
                let parent = if parent.is_empty() {
                    "the crate root"
                } else {
                    &parent
                };
                out.push(format!(
                    "{name} ({target}), in {parent}: {}",
                    cycle.join(" -> ")
                ));
            }
        }
    }
    // Every source file is part of a checked module tree: none is left out unseen.
    for (file, _) in super::sources(name) {
        assert!(
            reached.contains(&file),
            "{}: in no module tree of {name}",
            file.display()
        );
    }
    out
}

fn checked_crates() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join("crates"))
        .expect("crates/ is readable")
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

#[test]
fn no_crate_has_a_circle_between_sibling_modules() {
    let crates = checked_crates();
    assert!(crates.len() >= 8, "{crates:?}");
    let circles: Vec<String> = crates.iter().flat_map(|c| crate_circles(c)).collect();
    assert!(
        circles.is_empty(),
        "circles between sibling modules (move what one module needs of the other into \
         one place):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_module_references_of_adapter_redis_resolve() {
    // The resolution is not vacuous: known references are seen, through re-exports too.
    let tree = tree(&root().join("crates/adapter-redis/src/lib.rs"));
    let refs = |m: &str| module_refs(m, &tree);
    assert!(refs("provider").contains("pool"), "{:?}", refs("provider"));
    assert!(refs("gate::provider").contains("gate::keys"));
    assert!(refs("wire::tests").contains("wire"));
    assert!(tree.modules.contains_key("deny_cache::tests"));
    // `crate::Error` is the root's re-export of `error::Error`.
    assert_eq!(
        resolve(&["Error".to_owned()], &tree, 0),
        "error",
        "{:?}",
        tree.exports.get("")
    );
    let edges = sibling_edges(&tree);
    assert!(edges[""]["provider"].contains("pool"), "{edges:?}");
    assert!(edges["gate"]["gate::provider"].contains("gate::keys"));
}

/// A tree of the given modules and code, as `tree` would read it.
fn planted(modules: &[(&str, &str)]) -> Tree {
    let mut tree = Tree::default();
    for (m, code) in modules {
        tree.modules.insert((*m).to_owned(), code_only(code));
    }
    let names: Vec<String> = tree.modules.keys().cloned().collect();
    for m in names {
        let exports = reexports(&m, &tree.modules[&m], &tree);
        tree.exports.insert(m, exports);
    }
    tree
}

#[test]
fn the_module_references_resolve_paths_groups_and_reexports() {
    let tree = planted(&[
        ("", "pub use b::X;"),
        (
            "a",
            "use crate::{b::X, c::{d::{self, Y}}};\nfn f() { crate::b::g() } // crate::e",
        ),
        ("b", "use crate::X; mod tests {\n use super::*;\n}"),
        ("c", "pub use d::Z as W;"),
        ("c::d", "use super::Z;"),
        ("e", "fn f() -> crate::X { \"crate::c\"; crate::c::W }"),
    ]);
    let refs = |m: &str| -> Vec<String> { module_refs(m, &tree).into_iter().collect() };
    assert_eq!(refs("a"), ["b", "c::d"]);
    assert_eq!(refs("c::d"), ["c"]);
    assert!(refs("b").is_empty(), "{:?}", refs("b"));
    // Through the root's and `c`'s re-exports; the string is no reference.
    assert_eq!(refs("e"), ["b", "c::d"]);
}

#[test]
fn the_check_finds_a_planted_sibling_circle_and_passes_parent_and_child_references() {
    // Parent and child referring to each other, at any depth, is no circle.
    let fine = planted(&[
        ("", "use a::X;"),
        ("a", "use crate::Y; use b::c::Z;"),
        ("a::b", "use super::X;"),
        ("a::b::c", "use crate::a::X; use super::super::W;"),
        ("d", "use crate::a::b::Z;"),
    ]);
    assert_eq!(
        sibling_edges(&fine).values().flat_map(find_cycles).count(),
        0,
        "{:?}",
        sibling_edges(&fine)
    );
    // `a::b::c -> d` counts as `a -> d`, and `d -> a::x` as `d -> a`: a circle at the root.
    let circle = planted(&[
        ("a", ""),
        ("a::b", ""),
        ("a::b::c", "use crate::d::Y;"),
        ("d", "fn f() { crate::a::x() }"),
        ("e", "use crate::a;"),
    ]);
    let edges = sibling_edges(&circle);
    let found: Vec<_> = edges
        .iter()
        .map(|(p, g)| (p.clone(), find_cycles(g)))
        .collect();
    assert_eq!(
        found,
        [(
            String::new(),
            vec![["a", "d", "a"].map(str::to_owned).to_vec()]
        )]
    );
    // A circle among the children of `a` is found under `a`, with its chain.
    let deeper = planted(&[
        ("a", ""),
        ("a::b", "use super::c::X;"),
        ("a::c", "use crate::a::d::Y;"),
        ("a::d", "use super::b::Z;"),
    ]);
    let cycles = find_cycles(&sibling_edges(&deeper)["a"]);
    assert_eq!(
        cycles,
        [["a::b", "a::c", "a::d", "a::b"].map(str::to_owned).to_vec()]
    );
}
