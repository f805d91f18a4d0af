//! `cargo xtask docs`: the README and the pages under `docs/` stay true to
//! the tree, checked on every `cargo xtask test`:
//!
//! - every relative link in `README.md`, `ARCHITECTURE.md` and `docs/*.md`
//!   names a file or folder that exists, and its `#fragment` a heading of
//!   the target (GitHub's anchors: see [`slug`]);
//! - the README's first code block holds `cargo xtask lab` and `cargo
//!   xtask test`, and that test command is the one `.ci/run` runs (CI runs
//!   exactly what the README tells a newcomer to run);
//! - every `cargo xtask <command>` the pages name is a command xtask has;
//! - the README stays an entrance: at most [`README_MAX_LINES`] lines.
//!
//! Links inside code (fenced blocks and `inline spans`) are text, not
//! links, and are left alone; so are absolute URLs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The most lines the README may have; the depth belongs in `docs/`.
pub const README_MAX_LINES: usize = 250;

pub fn run() -> Result<()> {
    let root = crate::util::workspace_root();
    let problems = check(&root, &crate::subcommands())?;
    if problems.is_empty() {
        eprintln!(
            "xtask: docs: ok (links resolve, the README's commands are CI's, README <= {README_MAX_LINES} lines)"
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("xtask: docs: {p}");
    }
    bail!("{} documentation problem(s)", problems.len())
}

/// The pages checked: the README, the code map and every page of `docs/`.
pub fn pages(root: &Path) -> Result<Vec<PathBuf>> {
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let docs = root.join("docs");
    let mut more = Vec::new();
    for e in std::fs::read_dir(&docs).with_context(|| format!("listing {}", docs.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "md") {
            more.push(p);
        }
    }
    more.sort();
    pages.extend(more);
    Ok(pages)
}

/// Every problem, one line each.
pub fn check(root: &Path, subcommands: &BTreeSet<String>) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut headings: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for page in pages(root)? {
        let text = std::fs::read_to_string(&page)
            .with_context(|| format!("reading {}", page.display()))?;
        let name = rel(root, &page);
        for link in links(&text) {
            if let Err(why) = resolve(&page, &link, &mut headings) {
                problems.push(format!("{name}: link `{}`: {why}", link.target));
            }
        }
        for cmd in xtask_commands(&text) {
            if !subcommands.contains(&cmd) {
                problems.push(format!(
                    "{name}: `cargo xtask {cmd}` is no xtask command (`cargo xtask --help`)"
                ));
            }
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    let ci = std::fs::read_to_string(root.join(".ci/run")).context("reading .ci/run")?;
    problems.extend(readme_problems(&readme, &ci));
    for lib in LIBS_WITH_A_MODULE_LIST {
        let text =
            std::fs::read_to_string(root.join(lib)).with_context(|| format!("reading {lib}"))?;
        problems.extend(
            unlisted_modules(&text).into_iter().map(|m| {
                format!("{lib}: module `{m}` is missing from the crate doc's module list")
            }),
        );
    }
    Ok(problems)
}

/// Crate roots whose doc comment lists their modules for a newcomer.
const LIBS_WITH_A_MODULE_LIST: &[&str] = &["mycni-agent/src/lib.rs"];

/// The modules a crate root declares (public or not) that its `//!` doc
/// never names in backticks: a list that went stale when one was added.
pub fn unlisted_modules(lib: &str) -> Vec<String> {
    let doc: String = lib
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .filter(|m| !doc.contains(&format!("`{m}`")))
        .collect()
}

/// The README's own rules: its length, and its first code block's test
/// command being the one CI runs.
pub fn readme_problems(readme: &str, ci: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let n = readme.lines().count();
    if n > README_MAX_LINES {
        problems.push(format!(
            "README.md has {n} lines (at most {README_MAX_LINES}): move the depth into docs/"
        ));
    }
    let block = first_code_block(readme);
    let commands: Vec<&str> = block
        .iter()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|c| !c.is_empty())
        .collect();
    if !commands.contains(&"cargo xtask lab") {
        problems.push("README.md: its first code block has no `cargo xtask lab`".into());
    }
    let test = commands.iter().find(|c| c.starts_with("cargo xtask test"));
    match (test, ci_command(ci)) {
        (None, _) => {
            problems.push("README.md: its first code block has no `cargo xtask test`".into())
        }
        (_, None) => problems.push(".ci/run runs no command".into()),
        (Some(t), Some(c)) if *t != c => problems.push(format!(
            "README.md's test command `{t}` is not what .ci/run runs (`{c}`)"
        )),
        _ => {}
    }
    problems
}

/// The command `.ci/run` runs: its last line that is not a comment, a
/// shell option or a change of directory.
fn ci_command(ci: &str) -> Option<String> {
    ci.lines()
        .map(str::trim)
        .rfind(|l| {
            let aside = l.starts_with('#') || l.starts_with("set ") || l.starts_with("cd ");
            !l.is_empty() && !aside
        })
        .map(str::to_string)
}

fn first_code_block(text: &str) -> Vec<&str> {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("```"));
    lines.next();
    lines
        .take_while(|l| !l.trim_start().starts_with("```"))
        .collect()
}

/// A link as written: `[text](target)`, `![alt](target)` or a
/// reference definition `[name]: target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub target: String,
}

/// The text of a page outside code: fenced blocks and inline spans become
/// blank, so what they show is never read as a link or a heading.
fn prose(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push(String::new());
            continue;
        }
        if fenced {
            out.push(String::new());
            continue;
        }
        let mut kept = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push(kept);
    }
    out
}

/// Every relative link of a page (absolute URLs and mail are not
/// checked: the tests have no network).
pub fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for line in prose(text) {
        // Reference definitions: `[name]: target`, with at most a quoted
        // title after it; anything else after it makes the line text, as
        // CommonMark renders it.
        if let Some(rest) = line.trim_start().strip_prefix('[')
            && let Some((_, def)) = rest.split_once("]: ")
        {
            let mut words = def.trim().splitn(2, char::is_whitespace);
            let target = words.next().unwrap_or("");
            let title = words.next().map_or("", str::trim);
            if title.is_empty() || title.starts_with(['"', '\'', '(']) {
                push_link(&mut out, target);
                continue;
            }
        }
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            // `[x](<a b>)` and `[x](a "title")`: the target is the first word.
            let target = after[..end]
                .trim()
                .trim_start_matches('<')
                .split(['>', ' '])
                .next()
                .unwrap_or("");
            push_link(&mut out, target);
            rest = &after[end..];
        }
    }
    out
}

fn push_link(out: &mut Vec<Link>, target: &str) {
    let absolute = target.contains("://") || target.starts_with("mailto:");
    if !target.is_empty() && !absolute {
        out.push(Link {
            target: target.to_string(),
        });
    }
}

/// Checks one link of `page`: the file it names, then its fragment.
fn resolve(
    page: &Path,
    link: &Link,
    headings: &mut BTreeMap<PathBuf, BTreeSet<String>>,
) -> std::result::Result<(), String> {
    let (path, fragment) = match link.target.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (link.target.as_str(), None),
    };
    let dir = page.parent().unwrap_or(Path::new("."));
    let target = if path.is_empty() {
        page.to_path_buf()
    } else {
        normalize(&dir.join(path))
    };
    if !target.exists() {
        return Err(format!("{} does not exist", target.display()));
    }
    let Some(fragment) = fragment else {
        return Ok(());
    };
    if target.extension().is_none_or(|x| x != "md") {
        return Err("a fragment into a file that is not markdown".into());
    }
    let anchors = match headings.get(&target) {
        Some(a) => a,
        None => {
            let text = std::fs::read_to_string(&target)
                .map_err(|e| format!("reading {}: {e}", target.display()))?;
            headings.entry(target.clone()).or_insert(anchors(&text))
        }
    };
    if anchors.contains(fragment) {
        Ok(())
    } else {
        Err(format!(
            "no heading with the anchor #{fragment} in {}",
            target.display()
        ))
    }
}

/// `a/b/../c` -> `a/c`, so a link's file is named as it is on disk.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Every anchor GitHub gives the page's headings, the repeated ones with
/// their `-1`, `-2` suffixes.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// GitHub's anchor for a heading: the rendered text (links become their
/// text, code and emphasis marks go), lower-cased; letters, digits, `-`
/// and `_` kept, each space a `-`, everything else dropped.
pub fn slug(heading: &str) -> String {
    let text = heading.trim().trim_end_matches('#').trim();
    let mut rendered = String::new();
    let mut rest = text;
    // `[text](url)` -> `text`.
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        rendered.push_str(&rest[..open]);
        rendered.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    rendered.push_str(rest);
    rendered
        .chars()
        .filter(|&c| c != '`' && c != '*')
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The xtask commands a page names: `cargo xtask <word>` anywhere, code
/// included (that is where commands are written).
pub fn xtask_commands(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("cargo xtask") {
        rest = &rest[i + "cargo xtask".len()..];
        // Across a line break in prose, as in "`cargo xtask\nlab`".
        let word: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        // A bare mention ("`cargo xtask` sets ...") or a flag is no command.
        let starts_word = rest.starts_with(|c: char| c.is_whitespace());
        if starts_word && !word.is_empty() && !word.starts_with('-') {
            out.insert(word);
        }
    }
    out
}

fn rel(root: &Path, f: &Path) -> String {
    f.strip_prefix(root).unwrap_or(f).display().to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_module_missing_from_the_crate_doc_is_named() {
        let lib =
            "//! Rooms: `overlay`, `flows`.\n\npub mod overlay;\nmod flows;\npub mod services;\n";
        assert_eq!(super::unlisted_modules(lib), ["services"]);
    }

    use super::*;

    #[test]
    fn slugs_follow_github() {
        assert_eq!(
            slug("The fast path (`mycni-ebpf`)"),
            "the-fast-path-mycni-ebpf"
        );
        assert_eq!(slug("Seccomp and AppArmor"), "seccomp-and-apparmor");
        assert_eq!(
            slug("`tests/`: four crates, by role"),
            "tests-four-crates-by-role"
        );
        assert_eq!(slug("What it promises"), "what-it-promises");
        assert_eq!(slug("Deploy in [five](x.md) lines"), "deploy-in-five-lines");
        assert_eq!(slug("IPv6 / dual-stack"), "ipv6--dual-stack");
        assert_eq!(slug("**Bold** and snake_case"), "bold-and-snake_case");
    }

    #[test]
    fn repeated_headings_get_suffixes_and_code_is_no_heading() {
        let a = anchors("# A\n## A\n```\n# Not\n```\n### B #\n");
        let want: BTreeSet<String> = ["a", "a-1", "b"].map(String::from).into();
        assert_eq!(a, want);
    }

    #[test]
    fn links_outside_code_only_and_no_urls() {
        let text = "see [a](a.md#x) and ![c](img/c.svg \"t\")\n\
                    `[not](code.md)` and [web](https://example.com)\n\
                    ```\n[in](block.md)\n```\n[ref]: docs/ref.md\n\
                    [note]: not a link, a sentence\n";
        let got: Vec<String> = links(text).into_iter().map(|l| l.target).collect();
        assert_eq!(got, ["a.md#x", "img/c.svg", "docs/ref.md"]);
    }

    #[test]
    fn the_readme_test_command_must_be_ci_s() {
        let ci = "#!/bin/sh\n# CI\nset -eu\ncd \"$(dirname \"$0\")/..\"\ncargo xtask test\n";
        let good = "# x\n\n```sh\ncargo xtask lab   # a\ncargo xtask test  # b\n```\n";
        assert!(readme_problems(good, ci).is_empty());
        let other = good.replace("cargo xtask test  #", "cargo xtask test --quick #");
        assert_eq!(readme_problems(&other, ci).len(), 1);
        let long = format!("{good}{}", "line\n".repeat(README_MAX_LINES));
        assert_eq!(readme_problems(&long, ci).len(), 1);
        assert_eq!(readme_problems("no block\n", ci).len(), 2);
    }

    #[test]
    fn commands_named_in_prose_and_code() {
        let got = xtask_commands(
            "run `cargo xtask lab bench`, `cargo\nxtask soak`, `cargo xtask\ntest`; `cargo xtask` alone; `cargo xtask --help`",
        );
        let want: BTreeSet<String> = ["lab", "test"].map(String::from).into();
        assert_eq!(got, want);
    }

    /// The repository's own pages, as `cargo xtask docs` checks them.
    #[test]
    fn this_repository_s_pages_hold() {
        let root = crate::util::workspace_root();
        match check(&root, &crate::subcommands()) {
            Ok(problems) => assert!(problems.is_empty(), "{}", problems.join("\n")),
            Err(e) => panic!("{e:#}"),
        }
    }
}
