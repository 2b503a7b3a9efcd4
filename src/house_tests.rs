//! The shape of the house (#58), read from the source: no module imports
//! back up a floor (the graph of `src/`'s top-level modules has no cycle),
//! the files of one module import each other in no circle, and no function
//! is longer than 150 lines. Tests and test-only files are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LONGEST: usize = 150;

/// Every `.rs` file under `src/` that is not a test file, with its module path.
fn files() -> BTreeMap<Vec<String>, PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if !name.ends_with(".rs") || name.ends_with("tests.rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).expect("under src/");
            let mut module: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            out.insert(module, path);
        }
    }
    out
}

/// The source without its test module (the rest of a file after
/// `#[cfg(test)]` and `mod …`) and without line comments.
fn code(src: &str) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && is_mod_block(w[1]))
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_mod_block(line: &str) -> bool {
    let l = line.trim();
    let l = l.strip_prefix("pub ").unwrap_or(l);
    l.starts_with("mod ") && l.ends_with('{')
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The path that follows `at` in `s`: `a::b::c`.
fn path_at(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        let id = ident(rest);
        if id.is_empty() {
            break;
        }
        out.push(id.to_string());
        match rest[id.len()..].strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// Every module path a file names: `crate::…`, `super::…` (from
/// `module`), and each first item of a `crate::{…}` group.
fn references(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|item| path_at(item.trim())));
        } else {
            out.push(path_at(rest));
        }
    }
    for (i, _) in code.match_indices("super::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &code[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        let base = &module[..module.len().saturating_sub(ups)];
        let mut path = base.to_vec();
        path.extend(path_at(rest));
        out.push(path);
    }
    out
}

/// The file a path names: the longest module prefix that is a file.
fn resolve<'a>(
    path: &[String],
    modules: &'a BTreeMap<Vec<String>, PathBuf>,
) -> Option<&'a Vec<String>> {
    (1..=path.len())
        .rev()
        .find_map(|k| modules.get_key_value(&path[..k]).map(|(m, _)| m))
}

/// The graph's strongly connected parts of more than one node (Tarjan).
fn circles<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct Walk<'g, N: Ord> {
        graph: &'g BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<&'g N, usize>,
        low: BTreeMap<&'g N, usize>,
        stack: Vec<&'g N>,
        out: Vec<Vec<N>>,
    }
    fn visit<'g, N: Ord + Clone>(w: &mut Walk<'g, N>, v: &'g N) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        for u in w.graph.get(v).into_iter().flatten() {
            if !w.index.contains_key(u) {
                visit(w, u);
                let l = w.low[u].min(w.low[v]);
                w.low.insert(v, l);
            } else if w.stack.contains(&u) {
                let l = w.index[u].min(w.low[v]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let at = w.stack.iter().rposition(|x| *x == v).expect("on the stack");
            let part: Vec<N> = w.stack.drain(at..).cloned().collect();
            if part.len() > 1 {
                w.out.push(part);
            }
        }
    }
    let mut w = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !w.index.contains_key(v) {
            visit(&mut w, v);
        }
    }
    w.out
}

/// Who imports whom: between top-level modules (rooms), and between the
/// files of one room.
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

fn graphs() -> (Graph, Graph) {
    let modules = files();
    let (mut rooms, mut within) = (Graph::new(), Graph::new());
    // The crate's root and the binary wire the rooms; they are no room.
    let rooms_only = |m: &&Vec<String>| !matches!(m.as_slice(), [m] if m == "lib" || m == "main");
    for (module, path) in modules.iter().filter(|(m, _)| rooms_only(m)) {
        let src = std::fs::read_to_string(path).expect("a source file");
        rooms.entry(module[..1].to_vec()).or_default();
        within.entry(module.clone()).or_default();
        for r in references(&code(&src), module) {
            let target = resolve(&r, &modules).filter(|t| *t != module && rooms_only(t));
            let Some(target) = target else {
                continue;
            };
            if target[0] != module[0] {
                rooms
                    .entry(module[..1].to_vec())
                    .or_default()
                    .insert(target[..1].to_vec());
            } else {
                within
                    .entry(module.clone())
                    .or_default()
                    .insert(target.clone());
            }
        }
    }
    (rooms, within)
}

#[test]
fn no_module_imports_back_up_a_floor_and_no_files_import_in_a_circle() {
    let (rooms, within) = graphs();
    assert!(rooms.len() > 10, "the rooms were read: {:?}", rooms.keys());
    assert!(
        rooms.values().map(BTreeSet::len).sum::<usize>() > 20,
        "the imports were read"
    );
    assert_eq!(circles(&rooms), Vec::<Vec<Vec<String>>>::new(), "rooms");
    assert_eq!(circles(&within), Vec::<Vec<Vec<String>>>::new(), "files");
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let graph: BTreeMap<&str, BTreeSet<&str>> = [
        ("a", ["b"].into()),
        ("b", ["c"].into()),
        ("c", ["a"].into()),
        ("d", ["a"].into()),
    ]
    .into();
    let found = circles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].iter().copied().collect::<BTreeSet<_>>(),
        ["a", "b", "c"].into()
    );
    let path = references(
        "use crate::{a::b, c};\nlet x = super::d::e;",
        &["m".into(), "n".into()],
    );
    assert_eq!(
        path,
        vec![
            vec!["a".to_string(), "b".into()],
            vec!["c".into()],
            vec!["m".into(), "d".into(), "e".into()]
        ]
    );
}

/// The name of the function a line starts, if it starts one.
fn starts_fn(line: &str) -> Option<&str> {
    let mut l = line.trim_start();
    if let Some(rest) = l.strip_prefix("pub") {
        l = rest.trim_start();
        if let Some(rest) = l.strip_prefix('(') {
            l = rest[rest.find(')')? + 1..].trim_start();
        }
    }
    for word in ["async ", "const ", "unsafe "] {
        l = l.strip_prefix(word).unwrap_or(l);
    }
    let name = ident(l.strip_prefix("fn ")?);
    (!name.is_empty()).then_some(name)
}

/// Braces of a line, strings and characters left out.
fn braces(line: &str) -> i64 {
    let (mut depth, mut in_str, mut prev) = (0, false, ' ');
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '\'' if !in_str => {
                // A character literal: skip to its closing quote.
                let lit: String = chars.clone().take(4).collect();
                if let Some(end) = lit.find('\'').filter(|e| *e <= 2) {
                    for _ in 0..=end {
                        chars.next();
                    }
                }
            }
            '{' if !in_str => depth += 1,
            '}' if !in_str => depth -= 1,
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    depth
}

/// Functions of at least `least` lines: (lines, file:line, name).
fn long_functions(least: usize) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for path in files().values() {
        let src = std::fs::read_to_string(path).expect("a source file");
        let code = code(&src);
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = starts_fn(line) else {
                continue;
            };
            let (mut depth, mut started) = (0, false);
            for (j, l) in lines[i..].iter().enumerate() {
                let d = braces(l);
                started |= l.contains('{');
                depth += d;
                if !started && l.trim_end().ends_with(';') {
                    break;
                }
                if started && depth <= 0 {
                    if j + 1 >= least {
                        out.push((
                            j + 1,
                            format!("{}:{}", path.display(), i + 1),
                            name.to_string(),
                        ));
                    }
                    break;
                }
            }
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_150_lines() {
    assert!(
        long_functions(40).len() > 10,
        "functions were read: {:?}",
        long_functions(40)
    );
    assert_eq!(long_functions(LONGEST + 1), Vec::new());
}
