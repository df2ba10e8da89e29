//! The crate's import graph has no circle: none between its top-level
//! modules, and none between files apart from a module and its own
//! descendants (a file naming one of its ancestors, as `use super::*`
//! does, is left out of the file graph; any other circle counts, one
//! between siblings too).
//!
//! The test reads `src/**/*.rs` (the library; `src/bin` is other crates),
//! builds the module tree from the `mod` declarations (those under
//! `#[cfg(test)]` left out, and so are inline `#[cfg(test)] mod` blocks),
//! and resolves every `crate::`, `super::` and `self::` path, in `use`
//! declarations and in code, to the module that defines the item: a path
//! that names an item re-exported by a `use` is followed to where the item
//! is defined. Comments are not read. It prints the circles it finds.
//!
//! `cargo test --test layout -- --nocapture` shows the graph's circles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles inside `src/actors/` still being taken apart: each entry is the
/// set of files of one circle. A circle found passes if its files are all
/// in one entry, so an entry may shrink as a circle is broken; a new circle
/// fails the test. Remove an entry once its circle is gone.
const ALLOWED_FILE_CIRCLES: &[&[&str]] = &[];

/// Circles between top-level modules allowed for now (same rule).
const ALLOWED_MODULE_CIRCLES: &[&[&str]] = &[];

/// One module of the crate: its file (the file of the nearest module that
/// has one, for inline modules), its children, its imports (name ->
/// absolute path) for following re-exports, and the paths it names.
#[derive(Debug, Default)]
struct Module {
    file: String,
    children: BTreeSet<String>,
    imports: BTreeMap<String, Vec<String>>,
    /// Paths this module refers to, absolute (segments after `crate`).
    refs: Vec<Vec<String>>,
}

type Tree = BTreeMap<Vec<String>, Module>;

#[test]
fn no_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut tree = Tree::new();
    load(&root, &root.join("lib.rs"), Vec::new(), &mut tree);
    assert!(tree.len() > 20, "the module tree was read: {}", tree.len());

    // The module each file is: the shortest path with that file (an inline
    // module shares its parent's).
    let mut owner: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, m) in &tree {
        owner.entry(m.file.clone()).or_insert_with(|| path.clone());
    }

    // Edges between files and between top-level modules.
    let mut files: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut tops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // One path that makes each edge, to show.
    let mut why: BTreeMap<(String, String), String> = BTreeMap::new();
    for (path, m) in &tree {
        for r in &m.refs {
            let target = resolve(&tree, r, 0);
            if target.is_empty() || path.is_empty() {
                continue;
            }
            let to = &tree[&target];
            // A child naming its parent (or an ancestor) is the exemption.
            if to.file != m.file && !path.starts_with(&owner[&to.file]) {
                files
                    .entry(m.file.clone())
                    .or_default()
                    .insert(to.file.clone());
                why.entry((m.file.clone(), to.file.clone()))
                    .or_insert_with(|| r.join("::"));
            }
            if target[0] != path[0] {
                tops.entry(path[0].clone())
                    .or_default()
                    .insert(target[0].clone());
                why.entry((path[0].clone(), target[0].clone()))
                    .or_insert_with(|| format!("{}: {}", m.file, r.join("::")));
            }
        }
    }

    let module_circles = circles(&tops);
    let file_circles = circles(&files);
    let show = |kind: &str, c: &[String], graph: &BTreeMap<String, BTreeSet<String>>| {
        println!("{kind} circle: {}", c.join(", "));
        for a in c {
            for b in graph[a].iter().filter(|b| c.contains(b)) {
                println!("    {a} -> {b} ({})", why[&(a.clone(), b.clone())]);
            }
        }
    };
    for c in &module_circles {
        show("module", c, &tops);
    }
    for c in &file_circles {
        show("file", c, &files);
    }
    let new_modules: Vec<_> = module_circles
        .iter()
        .filter(|c| !allowed(c, ALLOWED_MODULE_CIRCLES))
        .collect();
    let new_files: Vec<_> = file_circles
        .iter()
        .filter(|c| !allowed(c, ALLOWED_FILE_CIRCLES))
        .collect();
    assert!(
        new_modules.is_empty() && new_files.is_empty(),
        "import circles between top-level modules: {new_modules:#?}\n\
         between files (not a module and its descendants): {new_files:#?}"
    );
}

fn allowed(circle: &[String], allow: &[&[&str]]) -> bool {
    allow
        .iter()
        .any(|entry| circle.iter().all(|f| entry.contains(&f.as_str())))
}

/// Reads the module at `file` (module path `path`) and its children.
fn load(root: &Path, file: &Path, path: Vec<String>, tree: &mut Tree) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let name = file
        .strip_prefix(root)
        .expect("under src")
        .to_string_lossy()
        .replace('\\', "/");
    // Children of `a.rs` and `a/mod.rs` live in `a/`; of `lib.rs` in `src/`.
    let dir: PathBuf = match file.file_name().and_then(|f| f.to_str()) {
        Some("lib.rs") | Some("mod.rs") => file.parent().expect("dir").to_path_buf(),
        _ => file.with_extension(""),
    };
    let code = strip(&text);
    parse_block(root, &dir, &name, &code, path, tree);
}

/// Parses one module's body: `mod` declarations (files loaded, inline
/// blocks parsed), `use` declarations, and paths in code.
fn parse_block(
    root: &Path,
    dir: &Path,
    file: &str,
    code: &str,
    path: Vec<String>,
    tree: &mut Tree,
) {
    tree.entry(path.clone()).or_default().file = file.to_owned();
    let bytes = code.as_bytes();
    let mut i = 0;
    let mut cfg_test = false;
    let mut rest = String::new();
    while i < code.len() {
        let tail = &code[i..];
        // Keywords only at a word's start.
        let word_start = i == 0 || !ident(code[..i].chars().next_back().as_ref());
        if !word_start {
            let c = tail.chars().next().expect("char");
            rest.push(c);
            i += c.len_utf8();
            continue;
        }
        if tail.starts_with("#[cfg(test)]") {
            cfg_test = true;
            i += "#[cfg(test)]".len();
            continue;
        }
        if let Some((name, after, inline)) = mod_decl(tail) {
            if let Some(body_len) = inline {
                let body = &tail[after..after + body_len];
                if !cfg_test {
                    let mut child = path.clone();
                    child.push(name.clone());
                    tree.entry(path.clone())
                        .or_default()
                        .children
                        .insert(name.clone());
                    parse_block(root, &dir.join(&name), file, body, child, tree);
                }
                i += after + body_len + 1;
            } else {
                if !cfg_test {
                    let mut child = path.clone();
                    child.push(name.clone());
                    tree.entry(path.clone())
                        .or_default()
                        .children
                        .insert(name.clone());
                    let a = dir.join(format!("{name}.rs"));
                    let b = dir.join(&name).join("mod.rs");
                    let f = if a.exists() { a } else { b };
                    load(root, &f, child, tree);
                }
                i += after;
            }
            cfg_test = false;
            continue;
        }
        if let Some(len) = use_decl(tail) {
            let body = tail[..len].trim_end_matches(';');
            let body = body[body.find("use").expect("use") + 3..].trim();
            for p in expand(body) {
                let (p, alias) = match p.split_once(" as ") {
                    Some((p, a)) => (p.trim().to_owned(), Some(a.trim().to_owned())),
                    None => (p, None),
                };
                let segs: Vec<String> = p.split("::").map(|s| s.trim().to_owned()).collect();
                let Some(abs) = absolute(&path, &segs, tree) else {
                    continue;
                };
                let m = tree.entry(path.clone()).or_default();
                if !cfg_test {
                    m.refs.push(abs.clone());
                }
                match segs.last().map(String::as_str) {
                    // A glob is followed no further than its module.
                    Some("*") => {}
                    Some("self") => {
                        let mut g = abs.clone();
                        g.pop();
                        let n = alias.unwrap_or_else(|| g.last().cloned().unwrap_or_default());
                        m.imports.insert(n, g);
                    }
                    Some(last) => {
                        let n = alias.unwrap_or_else(|| last.to_owned());
                        m.imports.insert(n, abs);
                    }
                    None => {}
                }
            }
            i += len;
            cfg_test = false;
            continue;
        }
        // Any other item ends a pending `#[cfg(test)]` at its `;` or block.
        if cfg_test && (bytes[i] == b'{' || bytes[i] == b';') {
            if bytes[i] == b'{' {
                i += matching(&code[i + 1..]) + 2;
            } else {
                i += 1;
            }
            cfg_test = false;
            continue;
        }
        let c = tail.chars().next().expect("char");
        rest.push(c);
        i += c.len_utf8();
    }
    // Paths in code.
    let words: Vec<&str> = rest
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .collect();
    for w in words {
        let w = w.trim_matches(':');
        if !(w.starts_with("crate::") || w.starts_with("super::") || w.starts_with("self::")) {
            continue;
        }
        let segs: Vec<String> = w.split("::").map(str::to_owned).collect();
        if let Some(abs) = absolute(&path, &segs, tree) {
            tree.entry(path.clone()).or_default().refs.push(abs);
        }
    }
}

/// `mod name;` or `mod name { ... }` (with any visibility) at the start of
/// `s`: the name, the bytes up to the `;` included or the `{` included,
/// and for an inline module the length of its body.
fn mod_decl(s: &str) -> Option<(String, usize, Option<usize>)> {
    let mut t = s;
    let mut off = 0;
    if t.starts_with("pub") {
        let end = if t[3..].starts_with('(') {
            t.find(')')? + 1
        } else {
            3
        };
        let ws = t[end..].len() - t[end..].trim_start().len();
        if ws == 0 {
            return None;
        }
        off += end + ws;
        t = &s[off..];
    }
    let t2 = t.strip_prefix("mod ")?;
    off += 4;
    let name: String = t2
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if name.is_empty() {
        return None;
    }
    let after_name = &t2[name.len()..];
    let ws = after_name.len() - after_name.trim_start().len();
    let after = off + name.len() + ws;
    match after_name.trim_start().chars().next()? {
        ';' => Some((name, after + 1, None)),
        '{' => Some((name.clone(), after + 1, Some(matching(&s[after + 1..])))),
        _ => None,
    }
}

/// `use ...;` (with any visibility) at the start of `s`: its length.
fn use_decl(s: &str) -> Option<usize> {
    let mut t = s;
    if t.starts_with("pub") {
        let end = if t[3..].starts_with('(') {
            t.find(')')? + 1
        } else {
            3
        };
        t = t[end..].trim_start();
    }
    if !t.starts_with("use ") {
        return None;
    }
    Some(s.find(';')? + 1)
}

/// The length of a block body up to its closing brace (not included).
fn matching(s: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

/// The paths of a use tree: `a::{b, c::{d, e}}` -> `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim().trim_start_matches("::");
    match tree.find('{') {
        None => vec![tree.to_owned()],
        Some(open) => {
            let prefix = &tree[..open];
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut out = Vec::new();
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        part(prefix, &inner[start..i], &mut out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            part(prefix, &inner[start..], &mut out);
            out
        }
    }
}

fn part(prefix: &str, item: &str, out: &mut Vec<String>) {
    let item = item.trim();
    if item.is_empty() {
        return;
    }
    for p in expand(item) {
        out.push(format!("{prefix}{p}"));
    }
}

/// `segs` (as written in module `here`) as a path from the crate root, or
/// `None` for a path into another crate.
fn absolute(here: &[String], segs: &[String], tree: &Tree) -> Option<Vec<String>> {
    let mut base: Vec<String> = here.to_vec();
    let mut rest = segs;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A child module of this one (`use child::Item`), else another crate.
            let known = tree.get(here).is_some_and(|m| m.children.contains(first));
            if !known {
                return None;
            }
        }
        None => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The module that defines what `path` names: the longest prefix that is a
/// module, then, if the next segment is a name that module imports, where
/// that import leads.
fn resolve(tree: &Tree, path: &[String], depth: usize) -> Vec<String> {
    let mut n = path.len();
    while n > 0 && !tree.contains_key(&path[..n]) {
        n -= 1;
    }
    let module = path[..n].to_vec();
    if depth > 8 || n == path.len() {
        return module;
    }
    let m = &tree[&module];
    if let Some(target) = m.imports.get(&path[n]) {
        if target.as_slice() != path {
            let mut next = target.clone();
            next.extend(path[n + 1..].iter().cloned());
            return resolve(tree, &next, depth + 1);
        }
    }
    module
}

/// The strongly connected components of more than one node (Tarjan),
/// each sorted, in a stable order.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        if let Some(next) = s.graph.get(v) {
            for w in next {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let l = s.low[w].min(s.low[v]);
                    s.low.insert(v, l);
                } else if s.on.contains(w) {
                    let l = s.index[w].min(s.low[v]);
                    s.low.insert(v, l);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut c = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                c.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                s.out.push(c);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// The code without comments, string and char literals (their text could
/// look like paths or braces).
fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !ident(b.get(i.wrapping_sub(1)))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            'raw: while j < b.len() {
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// Lines of code in `text`: not blank, not a comment, and before the
/// file's `#[cfg(test)]` module.
fn code_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .filter(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with("//")
        })
        .count()
}

/// The house's bounds: a README a user reads through (at most 600 lines;
/// the reference is in rustdoc, figures in `bench/`), no source file of the
/// library over 600 lines of code (tests aside: past that a file is two
/// concerns), and every actor message derived in `src/actors/protocol.rs`.
#[test]
fn the_house_keeps_its_bounds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 600, "README.md has {lines} lines (at most 600)");

    let mut big = Vec::new();
    // Every message between the actors is in one file, one form each.
    let mut messages = Vec::new();
    let mut stack = vec![root.join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if name != "tests" {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" {
                let text = std::fs::read_to_string(&path).expect("a source file");
                let protocol = path.ends_with("actors/protocol.rs");
                if !protocol && text.contains("derive(Message") {
                    messages.push(path.display().to_string());
                }
                let n = code_lines(&text);
                if n > 600 {
                    big.push(format!("{} ({n})", path.display()));
                }
            }
        }
    }
    assert!(big.is_empty(), "files over 600 lines of code: {big:?}");
    assert!(
        messages.is_empty(),
        "derive(Message) outside src/actors/protocol.rs: {messages:?}"
    );
}

/// The lines under `src/actors/` that may use `saturating_sub`: each
/// computes a room or a remainder for one decision and stores nothing
/// (file, the line's code, why). A count the actors keep is never
/// written with it: a count that could go below zero hides a release
/// made twice, so each is owned by a type whose arithmetic cannot (a
/// guard given back once on drop, a sum that subtracts exactly what it
/// added, a hand-out that stops at zero).
const ALLOWED_SATURATING_SUB: &[(&str, &str, &str)] = &[
    (
        "src/actors/view.rs",
        "let below = room.min(self.free_limit().saturating_sub(self.in_flight) as usize);",
        "free room under the free limit (in flight may pass it: headroom)",
    ),
    (
        "src/actors/view.rs",
        "let mut free = self.limit().saturating_sub(self.in_flight) as usize;",
        "free slots (a learned limit may fall below what is in flight)",
    ),
    (
        "src/actors/balancer/core/room.rs",
        ".saturating_sub(self.nodes.capacity_below()))",
        "the headroom part of the room: all room less the room below the free limits",
    ),
    (
        "src/actors/balancer/core/completions.rs",
        "let freed = (done.len().saturating_sub(heads) + refused.len()) as u32 + streams_ended;",
        "slots one report frees: its answers less the heads that keep theirs",
    ),
    (
        "src/actors/queue/core/intake.rs",
        "let ahead = (c.ready_from(class) - c.ready_in[class.index()] + own).saturating_sub(credit);",
        "tasks left ahead once the credit in hand is sent (it may cover them all)",
    ),
    (
        "src/actors/queue/core/intake.rs",
        "let of_class = own.saturating_sub(credit);",
        "the same, of the task's own class",
    ),
    (
        "src/actors/queue/core/deadlines.rs",
        "let ahead = ahead.saturating_sub(self.credit.in_hand());",
        "the same, for the deadline control",
    ),
];

/// Files under `dir`, recursively (sorted).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The lines before a file's test module (a `#[cfg(test)]` item that is
/// not a module is read).
fn before_test_module(lines: &[&str]) -> usize {
    (0..lines.len())
        .find(|&k| {
            lines[k] == "#[cfg(test)]"
                && lines[k + 1..]
                    .iter()
                    .find(|l| !l.is_empty())
                    .is_some_and(|l| l.split_whitespace().any(|w| w == "mod"))
        })
        .unwrap_or(lines.len())
}

/// Library files under `src/actors/` (test files aside), with their path
/// from the crate's root and their code's lines up to the test module,
/// comments and literals stripped.
fn actor_files(root: &Path) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for path in rust_files(&root.join("src/actors")) {
        let rel = path.strip_prefix(root).expect("under the root");
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel.ends_with("/tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        let code = strip(&text);
        let trimmed: Vec<&str> = code.lines().map(str::trim).collect();
        let end = before_test_module(&trimmed);
        out.push((rel, code.lines().take(end).map(str::to_string).collect()));
    }
    out
}

/// Every name a file under `src/actors/` takes from another module of the
/// crate is imported by name: no module-level glob of the crate's own
/// modules (`use super::*`, `use super::protocol::*`, `use crate::..::*`)
/// outside test modules, so a reader sees where each name comes from. (A
/// function may still bring an enum's variants in with a glob.)
#[test]
fn no_glob_import_of_the_crate_under_the_actors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let globs: Vec<String> = actor_files(root)
        .into_iter()
        .flat_map(|(rel, lines)| {
            lines
                .into_iter()
                .filter(|l| {
                    let own = ["use super::", "use self::", "use crate::"];
                    own.iter().any(|p| l.starts_with(p)) && l.trim_end().ends_with("*;")
                })
                .map(move |l| format!("{rel}: {l}"))
        })
        .collect();
    assert!(
        globs.is_empty(),
        "glob imports of the crate's modules: {globs:#?}"
    );
}

/// No count under the actors is written with `saturating_sub`: only the
/// lines of [`ALLOWED_SATURATING_SUB`] use it (comments and test modules
/// aside), and each of those is still there.
#[test]
fn no_saturating_sub_on_a_count_under_the_actors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut used = BTreeSet::new();
    for (rel, lines) in actor_files(root) {
        for line in lines
            .iter()
            .map(|l| l.trim())
            .filter(|l| l.contains("saturating_sub"))
        {
            match ALLOWED_SATURATING_SUB
                .iter()
                .position(|(f, l, _)| *f == rel && *l == line)
            {
                Some(k) => {
                    used.insert(k);
                }
                None => found.push(format!("{rel}: {line}")),
            }
        }
    }
    assert!(
        found.is_empty(),
        "saturating_sub under src/actors/ outside the allowed lines \
         (a count is owned by a type that cannot go below zero; a room \
         computed for one decision goes in ALLOWED_SATURATING_SUB with \
         its reason): {found:#?}"
    );
    let stale: Vec<_> = (0..ALLOWED_SATURATING_SUB.len())
        .filter(|k| !used.contains(k))
        .map(|k| ALLOWED_SATURATING_SUB[k].1)
        .collect();
    assert!(
        stale.is_empty(),
        "allowed lines no longer in the code: {stale:#?}"
    );
}
