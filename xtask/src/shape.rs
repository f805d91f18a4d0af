//! `cargo xtask shape`: the codebase's shape rules, checked on every
//! `cargo xtask test` so they stay true after the change that made them
//! true (ARCHITECTURE.md states them; this is what keeps them).
//!
//! - No hand-written `.rs` file over [`MAX_LINES`] lines.
//! - No import cycle between modules: within each parent module, the graph
//!   of which child uses which has no cycle (a use of `a::b::c` from
//!   `a::d::e` is the edge `d -> b` between the children of their common
//!   ancestor `a`). A child using its ancestors is not an edge: the parent
//!   declares the child, the child may use what the parent holds.
//! - Rooms that must stay sinks: a module listed in [`SINKS`] uses no other
//!   top-level module of its crate (metrics are registered into it, it
//!   reads no subsystem).
//! - Floors ([`FLOORS`]): every top-level module of the agent is on the
//!   ground floor, a room, or the top (the loop and the front door). A
//!   room uses only the ground floor; the ground floor uses only itself;
//!   the top uses anything. What rooms share goes down to the ground floor,
//!   so no room reaches into another's insides.
//!
//! The parser reads text, not the syntax tree: `mod x;` declarations from
//! each crate root, and `crate::`, `super::` and `self::` paths (with
//! `use` groups expanded). Test modules (`#[cfg(test)]` to the end of the
//! file, the layout every file here uses) are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The longest a hand-written source file may be.
pub const MAX_LINES: usize = 800;

/// The crates whose module graphs are checked, as their `src/` folders.
const CRATES: &[&str] = &[
    "mycni-common/src",
    "mycni-ebpf/src",
    "mycni-agent/src",
    "mycni-plugin/src",
    "xtask/src",
    "tests/kit/src",
    "tests/apiserver/src",
    "tests/lab/src",
    "tests/e2e/src",
    "fuzz/src",
];

/// (crate `src/`, module) pairs that use no other top-level module of
/// their crate.
const SINKS: &[(&str, &str)] = &[("mycni-agent/src", "metrics")];

/// How one crate's top-level modules stand (`Floors`).
struct Floors {
    krate: &'static str,
    /// What several rooms speak: they use nothing above it.
    ground: &'static [&'static str],
    /// One subsystem each: they use the ground floor only.
    rooms: &'static [&'static str],
    /// The loop and the front door, which start the rooms.
    top: &'static [&'static str],
    /// Edges (from, to) that break the rule today and are being taken out:
    /// tolerated, and each must still exist, so the list only shrinks.
    known: &'static [(&'static str, &'static str)],
}

const FLOORS: &[Floors] = &[Floors {
    krate: "mycni-agent/src",
    ground: &[
        "api", "btf", "caps", "cluster", "epoch", "kernel", "metrics", "nft", "settings",
        "topology", "verdict", "watch",
    ],
    rooms: &["datapath", "flows", "overlay", "policy", "tables"],
    top: &["agent", "kernel_check"],
    // Being taken down to the ground floor (the rooms issue): the pods
    // cache, the HTTP client and a face for explain (flows -> policy), the
    // overlay's peer types.
    known: &[],
}];

/// Folders the line rule skips: generated or vendored text.
const SKIP_DIRS: &[&str] = &["target", ".git", "corpus", "artifacts", "third_party"];

pub fn run() -> Result<()> {
    let root = crate::util::workspace_root();
    let problems = check(&root)?;
    if problems.is_empty() {
        eprintln!(
            "xtask: shape: ok (files <= {MAX_LINES} lines, no module cycle, sinks hold, rooms use only the ground floor)"
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("xtask: shape: {p}");
    }
    bail!(
        "{} shape rule(s) broken (see ARCHITECTURE.md)",
        problems.len()
    )
}

/// Every broken rule, one line each.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    rust_files(root, &mut files)?;
    for f in &files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let n = text.lines().count();
        if n > MAX_LINES {
            problems.push(format!(
                "{} has {n} lines (at most {MAX_LINES}): split it at its seams",
                rel(root, f)
            ));
        }
    }
    for krate in CRATES {
        let src = root.join(krate);
        if !src.is_dir() {
            continue;
        }
        let graph = ModuleGraph::read(&src)?;
        for cycle in graph.cycles() {
            problems.push(format!("{krate}: import cycle {}", cycle.join(" -> ")));
        }
        for f in FLOORS.iter().filter(|f| f.krate == *krate) {
            problems.extend(f.check(&graph));
        }
        for (k, sink) in SINKS.iter().filter(|(k, _)| k == krate) {
            for (from, to) in graph.top_level_uses(sink) {
                problems.push(format!(
                    "{k}: `{from}` uses `{to}`: `{sink}` is a sink and uses no other room"
                ));
            }
        }
    }
    Ok(problems)
}

fn rel(root: &Path, f: &Path) -> String {
    f.strip_prefix(root).unwrap_or(f).display().to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e?;
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if e.file_type()?.is_dir() {
            if !SKIP_DIRS.contains(&name.as_ref()) && !name.starts_with('.') {
                rust_files(&p, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
    out.sort();
    Ok(())
}

/// A module path inside one crate tree: `["agent", "run_loop"]`; the root
/// is empty. Binaries' trees are kept apart by a first segment
/// `bin:<name>`.
type ModPath = Vec<String>;

/// The modules of one crate's `src/` and the paths each one uses.
pub struct ModuleGraph {
    uses: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

impl ModuleGraph {
    pub fn read(src: &Path) -> Result<Self> {
        let mut files: BTreeMap<ModPath, String> = BTreeMap::new();
        let mut roots: Vec<(ModPath, PathBuf)> = Vec::new();
        for r in ["lib.rs", "main.rs"] {
            if src.join(r).is_file() {
                // A crate with both: main.rs uses the library by its name,
                // and its own `mod`s form a tree of their own.
                let base = if r == "main.rs" && src.join("lib.rs").is_file() {
                    vec!["bin:main".to_string()]
                } else {
                    vec![]
                };
                roots.push((base, src.join(r)));
            }
        }
        let bin = src.join("bin");
        if bin.is_dir() {
            for e in std::fs::read_dir(&bin)? {
                let p = e?.path();
                let name = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let file = if p.is_dir() {
                    p.join("main.rs")
                } else {
                    p.clone()
                };
                if file.is_file() && file.extension().is_some_and(|x| x == "rs") {
                    roots.push((vec![format!("bin:{name}")], file));
                }
            }
        }
        for (base, file) in roots {
            collect(&base, &file, true, &mut files)?;
        }
        let known: BTreeSet<ModPath> = files.keys().cloned().collect();
        let mut uses = BTreeMap::new();
        for (m, text) in &files {
            let crate_root: ModPath = m
                .first()
                .filter(|s| s.starts_with("bin:"))
                .map(|s| vec![s.clone()])
                .unwrap_or_default();
            let mut targets = BTreeSet::new();
            for p in paths_used(&without_tests(text)) {
                if let Some(t) = resolve(&p, m, &crate_root, &known) {
                    targets.insert(t);
                }
            }
            uses.insert(m.clone(), targets);
        }
        Ok(Self { uses })
    }

    /// Each cycle among siblings, as module names (the first repeated at
    /// the end), once.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        // parent -> (child -> children it uses)
        let mut sib: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (from, tos) in &self.uses {
            for to in tos {
                let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
                let (Some(a), Some(b)) = (from.get(common), to.get(common)) else {
                    continue; // one is the other's ancestor
                };
                sib.entry(from[..common].to_vec())
                    .or_default()
                    .entry(a.clone())
                    .or_default()
                    .insert(b.clone());
            }
        }
        let mut out = Vec::new();
        for (parent, g) in &sib {
            for c in find_cycles(g) {
                let prefix = if parent.is_empty() {
                    String::new()
                } else {
                    format!("{}::", parent.join("::"))
                };
                out.push(c.iter().map(|n| format!("{prefix}{n}")).collect());
            }
        }
        out
    }

    /// The uses from `sink` (or below it) of another top-level module.
    /// The crate's top-level modules (binaries' trees left out).
    pub fn top_level_modules(&self) -> BTreeSet<String> {
        self.uses
            .keys()
            .filter_map(|m| m.first())
            .filter(|m| !m.starts_with("bin:"))
            .cloned()
            .collect()
    }

    /// Each use between two top-level modules, (from, to), with the first
    /// module (`a::b`) that makes it.
    pub fn top_level_edges(&self) -> BTreeMap<(String, String), String> {
        let mut out = BTreeMap::new();
        for (from, tos) in &self.uses {
            let Some(a) = from.first().filter(|a| !a.starts_with("bin:")) else {
                continue;
            };
            for b in tos.iter().filter_map(|to| to.first()).filter(|b| *b != a) {
                out.entry((a.clone(), b.clone()))
                    .or_insert_with(|| from.join("::"));
            }
        }
        out
    }

    pub fn top_level_uses(&self, sink: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (from, tos) in &self.uses {
            if from.first().map(String::as_str) != Some(sink) {
                continue;
            }
            for to in tos {
                if let Some(top) = to.first().filter(|t| t.as_str() != sink) {
                    out.push((from.join("::"), top.clone()));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

impl Floors {
    /// Every module out of place and every edge against the floors, one
    /// line each.
    fn check(&self, graph: &ModuleGraph) -> Vec<String> {
        let k = self.krate;
        let mut problems = Vec::new();
        let floor = |m: &str| {
            [
                ("ground", self.ground),
                ("room", self.rooms),
                ("top", self.top),
            ]
            .into_iter()
            .find(|(_, ms)| ms.contains(&m))
            .map(|(f, _)| f)
        };
        let tops = graph.top_level_modules();
        for m in &tops {
            if floor(m).is_none() {
                problems.push(format!(
                    "{k}: `{m}` is on no floor: list it in FLOORS (xtask/src/shape.rs) as ground, room or top"
                ));
            }
        }
        for m in self.ground.iter().chain(self.rooms).chain(self.top) {
            if !tops.contains(*m) {
                problems.push(format!("{k}: FLOORS lists `{m}`, which is no module"));
            }
        }
        let edges = graph.top_level_edges();
        for ((from, to), at) in &edges {
            let allowed = match (floor(from), floor(to)) {
                (Some("top") | None, _) | (_, None) => true,
                (Some("room"), Some(t)) => t == "ground",
                (Some(_), Some(t)) => t == "ground",
            };
            if allowed || self.known.contains(&(from.as_str(), to.as_str())) {
                continue;
            }
            let why = if floor(from) == Some("room") {
                "a room uses only the ground floor"
            } else {
                "the ground floor uses no room"
            };
            problems.push(format!(
                "{k}: `{at}` uses `{to}`: {why} (move what both need down to it)"
            ));
        }
        for (from, to) in self.known {
            if !edges.contains_key(&(from.to_string(), to.to_string())) {
                problems.push(format!(
                    "{k}: `{from}` no longer uses `{to}`: take the edge out of FLOORS' known list"
                ));
            }
        }
        problems
    }
}

/// Reads `file` as module `m` and every `mod x;` it declares, recursively.
/// `is_root`: lib.rs, main.rs and mod.rs files keep their children beside
/// them; `a.rs` keeps them in `a/`.
fn collect(
    m: &ModPath,
    file: &Path,
    is_root: bool,
    out: &mut BTreeMap<ModPath, String>,
) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let dir = match (is_root, file.parent()) {
        (true, Some(d)) => d.to_path_buf(),
        (false, Some(d)) => d.join(file.file_stem().unwrap_or_default()),
        (_, None) => PathBuf::new(),
    };
    let children = declared_mods(&text);
    out.insert(m.clone(), text);
    for c in children {
        let mut cm = m.clone();
        cm.push(c.clone());
        let flat = dir.join(format!("{c}.rs"));
        let nested = dir.join(&c).join("mod.rs");
        if flat.is_file() {
            collect(&cm, &flat, false, out)?;
        } else if nested.is_file() {
            collect(&cm, &nested, true, out)?;
        }
    }
    Ok(())
}

/// `mod x;` (any visibility) outside test code; inline `mod x { .. }` and
/// `#[path]` modules are not files of the tree.
fn declared_mods(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut path_attr = false;
    for line in without_tests(text).lines() {
        let l = line.trim();
        if l.starts_with("#[path") {
            path_attr = true;
            continue;
        }
        let rest = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub(super) "))
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        if let Some(name) = rest.strip_prefix("mod ").and_then(|r| r.strip_suffix(';'))
            && !path_attr
        {
            out.push(name.trim().to_string());
        }
        if !l.starts_with("#[") {
            path_attr = false;
        }
    }
    out
}

/// The text before the file's `#[cfg(test)]` module.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.trim_end().ends_with('{'))
        {
            break;
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// Every `crate::`, `super::` and `self::` path in `text` (comments
/// removed, `use` groups expanded), as segments.
fn paths_used(text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]);
        let kw = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|k| bytes[i..].starts_with(k.as_bytes()));
        match kw {
            Some(_) if starts_word => {
                let (tree, len) = use_tree(&bytes[i..]);
                out.extend(tree);
                i += len.max(1);
            }
            _ => i += 1,
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Expands the path (or use tree) at the start of `s`: `a::{b, c::d}` gives
/// `a::b` and `a::c::d`. Returns the paths and the bytes read.
fn use_tree(b: &[u8]) -> (Vec<Vec<String>>, usize) {
    let mut segs: Vec<String> = Vec::new();
    let mut i = 0;
    loop {
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if i > start {
            segs.push(String::from_utf8_lossy(&b[start..i]).into_owned());
        }
        if b[i..].starts_with(b"::") {
            i += 2;
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < b.len() && b[i] == b'{' {
                i += 1;
                let mut out = Vec::new();
                loop {
                    while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                        i += 1;
                    }
                    if i >= b.len() || b[i] == b'}' {
                        i += 1;
                        break;
                    }
                    let (inner, len) = use_tree(&b[i..]);
                    for p in inner {
                        let mut full = segs.clone();
                        full.extend(p.into_iter().filter(|x| x != "self"));
                        out.push(full);
                    }
                    i += len.max(1);
                }
                return (out, i);
            }
            continue;
        }
        return (vec![segs], i);
    }
}

/// The deepest known module a path names, from module `m`.
fn resolve(
    p: &[String],
    m: &ModPath,
    crate_root: &ModPath,
    known: &BTreeSet<ModPath>,
) -> Option<ModPath> {
    let (mut base, rest) = match p.first().map(String::as_str) {
        Some("crate") => (crate_root.clone(), &p[1..]),
        Some("self") => (m.clone(), &p[1..]),
        Some("super") => {
            let mut b = m.clone();
            let mut k = 0;
            while p.get(k).map(String::as_str) == Some("super") {
                b.pop();
                k += 1;
            }
            (b, &p[k..])
        }
        _ => return None,
    };
    for s in rest {
        let mut next = base.clone();
        next.push(s.clone());
        if !known.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// The cycles of a small directed graph, each once, as the nodes of one
/// strongly connected component with more than one node, closed.
fn find_cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = g.keys().chain(g.values().flatten()).collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for t in g.get(&n).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reaches[n].contains(*n) {
            continue;
        }
        let scc: Vec<String> = nodes
            .iter()
            .filter(|o| reaches[n].contains(**o) && reaches[*o].contains(*n))
            .map(|o| (*o).clone())
            .collect();
        done.extend(scc.iter().cloned());
        let mut c = scc.clone();
        c.push(scc[0].clone());
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn use_groups_expand() {
        let p = paths_used("use crate::{a::B, c::{d, e::F}, self};\nlet x = super::g::h();\n");
        assert!(p.contains(&s(&["crate", "a", "B"])));
        assert!(p.contains(&s(&["crate", "c", "d"])));
        assert!(p.contains(&s(&["crate", "c", "e", "F"])));
        assert!(p.contains(&s(&["super", "g", "h"])));
        assert!(
            !paths_used("// crate::x\nlet y = 1;")
                .iter()
                .any(|v| v.contains(&"x".to_string()))
        );
    }

    #[test]
    fn cycles_are_found_between_siblings_only() {
        let mut uses = BTreeMap::new();
        uses.insert(s(&["a"]), BTreeSet::from([s(&["b"])]));
        uses.insert(s(&["b", "x"]), BTreeSet::from([s(&["a"])]));
        uses.insert(s(&["c"]), BTreeSet::from([s(&["c", "y"])]));
        uses.insert(s(&["c", "y"]), BTreeSet::from([s(&["c"])]));
        let g = ModuleGraph { uses };
        assert_eq!(g.cycles(), vec![s(&["a", "b", "a"])]);
    }

    #[test]
    fn a_planted_edge_between_rooms_or_from_the_ground_fails() {
        let floors = Floors {
            krate: "k",
            ground: &["g"],
            rooms: &["r1", "r2"],
            top: &["t"],
            known: &[("r2", "g2")],
        };
        let graph = |edges: &[(&[&str], &str)]| {
            let mut uses: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
            for m in ["g", "r1", "r2", "t"] {
                uses.insert(s(&[m]), BTreeSet::new());
            }
            for (from, to) in edges {
                uses.entry(s(from)).or_default().insert(s(&[to]));
            }
            ModuleGraph { uses }
        };
        let fine = graph(&[(&["r1", "x"], "g"), (&["t"], "r1"), (&["t"], "r2")]);
        // The known edge is gone: the allowance must go too.
        let stale = floors.check(&fine);
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert!(stale[0].contains("no longer uses"), "{stale:?}");
        let floors = Floors {
            known: &[],
            ..floors
        };
        assert!(floors.check(&fine).is_empty());
        for (from, to) in [
            ("r1", "r2"),
            ("r2", "r1"),
            ("r1", "t"),
            ("g", "r1"),
            ("g", "t"),
        ] {
            let p = floors.check(&graph(&[(&[from, "inner"], to)]));
            assert_eq!(p.len(), 1, "{from} -> {to}: {p:?}");
            assert!(
                p[0].contains(&format!("`{from}::inner` uses `{to}`")),
                "{p:?}"
            );
        }
        let mut unlisted = graph(&[]);
        unlisted.uses.insert(s(&["new_room"]), BTreeSet::new());
        assert!(floors.check(&unlisted)[0].contains("`new_room` is on no floor"));
    }

    #[test]
    fn tests_and_path_modules_are_not_the_tree() {
        let text = "mod a;\n#[path = \"x.rs\"]\nmod b;\npub(crate) mod c;\n#[cfg(test)]\nmod tests {\nuse crate::z;\n}\n";
        assert_eq!(declared_mods(text), s(&["a", "c"]));
        assert!(!without_tests(text).contains("crate::z"));
    }
}
