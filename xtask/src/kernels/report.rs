//! What a guest's console says (the MYCNI- markers of its /init and run
//! script, libtest's own lines in between), and the matrix's table.
//!
//! Markers: `MYCNI-BOOT uptime=S` (first line of /init), `MYCNI-READY
//! uptime=S` (chroot up), `MYCNI-START <entry> uptime=S`, `MYCNI-RESULT
//! <entry> rc=N uptime=S`, `MYCNI-RUN-DONE rc=N uptime=S`, `MYCNI-FACT
//! key=value` (anything in the guest may print one: the table shows the
//! keys in [`super::FACT_COLUMNS`]), `MYCNI-ERROR text` (setup failed),
//! `MYCNI-END uptime=S`. They are looked for anywhere in a line: a kernel
//! message on the serial console can land in front of one.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// libtest's counts, summed over the `test result:` lines of an entry.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u32,
    pub failed: u32,
    pub ignored: u32,
}

/// One entry as the guest ran it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct EntryRun {
    pub name: String,
    /// None: no `test result:` line (the binary did not start, or died).
    pub counts: Option<Counts>,
    pub rc: Option<i32>,
    pub start: Option<f64>,
    pub end: Option<f64>,
    /// Each failed test with the first line of what it printed.
    pub failures: Vec<(String, String)>,
}

impl EntryRun {
    /// Ran, and nothing failed or was skipped: a test `#[ignore]`d on a
    /// kernel is one that kernel was never checked by (an entry's filter
    /// leaves out what is not meant to run in a guest).
    pub fn ok(&self) -> bool {
        self.rc == Some(0) && self.counts.is_some_and(|c| c.failed == 0 && c.ignored == 0)
    }
}

/// Everything parsed from one console.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Guest {
    pub boot: Option<f64>,
    pub ready: Option<f64>,
    pub run_done: Option<f64>,
    pub end: Option<f64>,
    pub facts: BTreeMap<String, String>,
    pub entries: Vec<EntryRun>,
    pub errors: Vec<String>,
}

impl Guest {
    /// Guest seconds the run script took (the tests and little else).
    pub fn run_seconds(&self) -> Option<f64> {
        Some(self.run_done? - self.ready?)
    }

    /// Why the guest did not get through its run, if it did not.
    pub fn problem(&self) -> Option<String> {
        if let Some(e) = self.errors.first() {
            return Some(format!("guest setup failed: {e}"));
        }
        if self.boot.is_none() {
            return Some("the guest's /init never ran".into());
        }
        if self.end.is_none() {
            return Some("the guest did not finish its run".into());
        }
        None
    }
}

/// `key=value` pairs after a marker word.
fn field<'a>(rest: &'a str, key: &str) -> Option<&'a str> {
    rest.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn seconds(rest: &str) -> Option<f64> {
    field(rest, "uptime")?.parse().ok()
}

/// libtest's `test result: ok. 3 passed; 1 failed; 2 ignored; ...`.
pub fn summary(line: &str) -> Option<Counts> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_, counts) = rest.split_once(". ")?;
    let mut c = Counts::default();
    for part in counts.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        match what {
            "passed" => c.passed += n,
            "failed" => c.failed += n,
            "ignored" => c.ignored += n,
            _ => {}
        }
    }
    Some(c)
}

/// The line that says why a test failed: anyhow's `Error:` line, a
/// panic's message with where it panicked, else the first line it printed.
fn gist(output: &[String]) -> String {
    let lines: Vec<&str> = output
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    if let Some(l) = lines.iter().find(|l| l.starts_with("Error:")) {
        return l.to_string();
    }
    if let Some(i) = lines.iter().position(|l| l.contains(" panicked at ")) {
        let place = lines[i]
            .split(" panicked at ")
            .nth(1)
            .unwrap_or("")
            .trim_end_matches(':');
        if let Some(message) = lines.get(i + 1) {
            return format!("{message} (panicked at {place})");
        }
        return lines[i].to_string();
    }
    lines.first().map_or_else(String::new, |l| l.to_string())
}

/// A failed test's captured output, as libtest prints it after the run.
type Section = (String, Vec<String>);

/// Enough of a failure's output to find its [`gist`].
const SECTION_LINES: usize = 40;

fn close(e: &mut EntryRun, section: &mut Option<Section>) {
    let Some((name, output)) = section.take() else {
        return;
    };
    let why = gist(&output);
    match e.failures.iter_mut().find(|(n, _)| *n == name) {
        Some((_, first)) => *first = why,
        None => e.failures.push((name, why)),
    }
}

/// Reads a guest's console.
pub fn parse(lines: &[String]) -> Guest {
    let mut g = Guest::default();
    let mut current: Option<EntryRun> = None;
    let mut section: Option<Section> = None;
    for line in lines {
        if let Some(at) = line.find("MYCNI-") {
            let marker = &line[at + "MYCNI-".len()..];
            let (word, rest) = marker.split_once(' ').unwrap_or((marker, ""));
            if let Some(e) = current.as_mut() {
                close(e, &mut section);
            }
            match word {
                "BOOT" => g.boot = seconds(rest),
                "READY" => g.ready = seconds(rest),
                "RUN-DONE" => g.run_done = seconds(rest),
                "END" => g.end = seconds(rest),
                "ERROR" => g.errors.push(rest.trim().to_string()),
                "FACT" => {
                    if let Some((k, v)) = rest.trim().split_once('=') {
                        g.facts.insert(k.to_string(), v.to_string());
                    }
                }
                "START" => {
                    g.entries.extend(current.take());
                    current = Some(EntryRun {
                        name: rest.split_whitespace().next().unwrap_or("").to_string(),
                        start: seconds(rest),
                        ..EntryRun::default()
                    });
                }
                "RESULT" => {
                    let name = rest.split_whitespace().next().unwrap_or("");
                    let mut e = current
                        .take()
                        .filter(|e| e.name == name)
                        .unwrap_or_else(|| EntryRun {
                            name: name.to_string(),
                            ..EntryRun::default()
                        });
                    e.rc = field(rest, "rc").and_then(|r| r.parse().ok());
                    e.end = seconds(rest);
                    g.entries.push(e);
                }
                _ => {}
            }
            continue;
        }
        let Some(e) = current.as_mut() else { continue };
        if let Some(c) = summary(line) {
            close(e, &mut section);
            let sum = e.counts.get_or_insert_with(Counts::default);
            sum.passed += c.passed;
            sum.failed += c.failed;
            sum.ignored += c.ignored;
        } else if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        {
            close(e, &mut section);
            section = Some((name.to_string(), Vec::new()));
        } else if line == "failures:" {
            close(e, &mut section);
        } else if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... FAILED"))
        {
            e.failures.push((name.to_string(), String::new()));
        } else if let Some((_, output)) = section.as_mut()
            && output.len() < SECTION_LINES
        {
            output.push(line.clone());
        }
    }
    // A START without its RESULT: the guest died in the middle.
    g.entries.extend(current);
    g
}

/// A kernel of the matrix as the run left it.
#[derive(Debug, Default)]
pub struct KernelRun {
    pub key: String,
    pub package: Option<String>,
    /// Set when parsing the console was possible (QEMU started).
    pub guest: Option<Guest>,
    /// Fetching, building or booting failed before or around the guest.
    pub problem: Option<String>,
    pub wall: Option<f64>,
    pub log: Option<String>,
}

impl KernelRun {
    /// The reason this kernel fails the run, if any.
    pub fn failure(&self, entries: &[String]) -> Option<String> {
        if let Some(p) = &self.problem {
            return Some(p.clone());
        }
        let Some(g) = &self.guest else {
            return Some("not run".into());
        };
        if let Some(p) = g.problem() {
            return Some(p);
        }
        let bad: Vec<&str> = entries
            .iter()
            .filter(|n| !g.entries.iter().any(|e| &e.name == *n && e.ok()))
            .map(String::as_str)
            .collect();
        (!bad.is_empty()).then(|| format!("tests failed: {}", bad.join(", ")))
    }
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |s| format!("{s:.1}"))
}

fn cell(g: Option<&Guest>, name: &str) -> String {
    let Some(e) = g.and_then(|g| g.entries.iter().find(|e| e.name == name)) else {
        return "not run".into();
    };
    match (e.counts, e.rc) {
        (Some(c), _) => format!("{} / {} / {}", c.passed, c.failed, c.ignored),
        (None, Some(rc)) => format!("no summary (rc={rc})"),
        (None, None) => "died".into(),
    }
}

/// The matrix as a Markdown table: one row per kernel, a column per entry
/// (passed / failed / ignored) and per fact in `facts` (header, key).
pub fn table(runs: &[KernelRun], entries: &[String], facts: &[(&str, &str)]) -> String {
    let mut header = vec![
        "kernel package".to_string(),
        "`uname -r`".into(),
        "boot s".into(),
        "run s".into(),
        "wall s".into(),
    ];
    header.extend(entries.iter().map(|e| format!("{e} (pass / fail / ign)")));
    header.extend(facts.iter().map(|(h, _)| h.to_string()));
    header.push("result".into());
    let mut rows = vec![header];
    for r in runs {
        let g = r.guest.as_ref();
        let mut row = vec![
            r.package.clone().unwrap_or_else(|| format!("({})", r.key)),
            g.and_then(|g| g.facts.get("uname").cloned())
                .unwrap_or_else(|| "–".into()),
            secs(g.and_then(|g| g.boot)),
            secs(g.and_then(Guest::run_seconds)),
            secs(r.wall),
        ];
        row.extend(entries.iter().map(|e| cell(g, e)));
        row.extend(facts.iter().map(|(_, key)| {
            g.and_then(|g| g.facts.get(*key).cloned())
                .unwrap_or_else(|| "–".into())
        }));
        row.push(match r.failure(entries) {
            None => "ok".into(),
            Some(why) => format!("FAILED: {why}"),
        });
        rows.push(row);
    }
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
        if i == 0 {
            let _ = writeln!(out, "|{}", "---|".repeat(row.len()));
        }
    }
    out
}

/// Each failed test of each kernel with the first line it printed, and
/// where the full console is.
pub fn failures(runs: &[KernelRun]) -> String {
    let mut out = String::new();
    for r in runs {
        let name = r.package.as_deref().unwrap_or(&r.key);
        for e in r.guest.iter().flat_map(|g| &g.entries) {
            for (test, first) in &e.failures {
                let _ = writeln!(out, "- {name}: {}: `{test}`: {first}", e.name);
            }
        }
        if let Some(log) = &r.log {
            let _ = writeln!(out, "- {name}: console log {log}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(String::from).collect()
    }

    const CONSOLE: &str = "\
Booting from ROM..\x1b[2JMYCNI-BOOT uptime=2.25
MYCNI-FACT uname=6.1.0-57-amd64
MYCNI-FACT btf_vmlinux=yes
MYCNI-READY uptime=3.15
MYCNI-START ebpf_prog uptime=3.31
test encap::decap_only_from_peers ... FAILED
test fast_path::ok_one ... ok
test flow_cost::cost ... ignored

failures:

---- encap::decap_only_from_peers stdout ----
Error: loading the eBPF object failed: kernel function 'bpf_skb_ct_lookup' not found in kernel BTF

Caused by:

failures:
    encap::decap_only_from_peers

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 69.12s
MYCNI-RESULT ebpf_prog rc=101 uptime=72.93
MYCNI-RUN-DONE rc=0 uptime=73.70
[   74.1] some kernel line MYCNI-FACT autoload=conntrack=yes,vxlan=yes
MYCNI-END uptime=74.18
";

    #[test]
    fn libtest_summaries() {
        assert_eq!(
            summary(
                "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 5 filtered out; finished in 1.02s"
            ),
            Some(Counts {
                passed: 12,
                failed: 0,
                ignored: 3
            })
        );
        assert_eq!(
            summary(
                "test result: FAILED. 0 passed; 24 failed; 4 ignored; 0 measured; 0 filtered out; finished in 69.12s"
            ),
            Some(Counts {
                passed: 0,
                failed: 24,
                ignored: 4
            })
        );
        assert_eq!(summary("test encap::x ... ok"), None);
        assert_eq!(summary("running 28 tests"), None);
    }

    #[test]
    fn a_console_with_a_failure() {
        let g = parse(&lines(CONSOLE));
        assert_eq!(g.boot, Some(2.25));
        assert_eq!(g.facts["uname"], "6.1.0-57-amd64");
        assert_eq!(g.facts["autoload"], "conntrack=yes,vxlan=yes");
        assert_eq!(g.problem(), None);
        assert!((g.run_seconds().unwrap() - 70.55).abs() < 1e-9);
        let [e] = g.entries.as_slice() else {
            panic!("{:?}", g.entries)
        };
        assert_eq!(e.name, "ebpf_prog");
        assert_eq!(e.rc, Some(101));
        assert_eq!(
            e.counts,
            Some(Counts {
                passed: 1,
                failed: 1,
                ignored: 1
            })
        );
        assert!(!e.ok());
        assert_eq!(
            e.failures,
            [(
                "encap::decap_only_from_peers".to_string(),
                "Error: loading the eBPF object failed: kernel function 'bpf_skb_ct_lookup' not found in kernel BTF".to_string()
            )]
        );
    }

    #[test]
    fn the_gist_of_a_failure() {
        let out = lines(
            "seed 1203 (set EBPF_PROG_SEED to replay another)\n\
             Error: loading the eBPF object failed: kernel function 'bpf_ct_release' not found\n\
             \n\
             Caused by:\n",
        );
        assert_eq!(
            gist(&out),
            "Error: loading the eBPF object failed: kernel function 'bpf_ct_release' not found"
        );
        let out = lines(
            "seed 1\nthread 'fast_path::x' panicked at mycni-agent/tests/datapath/ebpf_prog/fast_path.rs:12:5:\n\
             assertion `left == right` failed\n  left: 1\n",
        );
        assert_eq!(
            gist(&out),
            "assertion `left == right` failed (panicked at mycni-agent/tests/datapath/ebpf_prog/fast_path.rs:12:5)"
        );
        assert_eq!(gist(&lines("\n  just this\nand this\n")), "just this");
        assert_eq!(gist(&[]), "");
    }

    #[test]
    fn a_guest_that_died_mid_run() {
        let cut: Vec<String> = lines(CONSOLE).into_iter().take(7).collect();
        let g = parse(&cut);
        assert_eq!(
            g.problem().as_deref(),
            Some("the guest did not finish its run")
        );
        assert_eq!(g.entries.len(), 1);
        assert_eq!(g.entries[0].rc, None);
        let g = parse(&lines("MYCNI-BOOT uptime=1\nMYCNI-ERROR 9p usr\n"));
        assert_eq!(g.problem().as_deref(), Some("guest setup failed: 9p usr"));
        assert!(parse(&[]).problem().is_some());
    }

    #[test]
    fn the_table() {
        let entries = vec!["ebpf_prog".to_string()];
        let facts = [("BTF", "btf_vmlinux"), ("tcx", "tcx_config")];
        let ok = "MYCNI-BOOT uptime=3.30\nMYCNI-FACT uname=6.12.118+deb12-amd64\n\
                  MYCNI-FACT btf_vmlinux=yes\nMYCNI-READY uptime=4\nMYCNI-START ebpf_prog uptime=4\n\
                  test result: ok. 24 passed; 0 failed; 0 ignored; 0 measured; 4 filtered out; finished in 9s\n\
                  MYCNI-RESULT ebpf_prog rc=0 uptime=14\nMYCNI-RUN-DONE rc=0 uptime=14.25\nMYCNI-END uptime=15\n";
        let runs = [
            KernelRun {
                key: "6.12".into(),
                package: Some("linux-image-6.12.118+deb12-amd64-unsigned".into()),
                guest: Some(parse(&lines(ok))),
                wall: Some(21.04),
                ..KernelRun::default()
            },
            KernelRun {
                key: "6.1".into(),
                package: Some("linux-image-6.1.0-57-amd64-unsigned".into()),
                guest: Some(parse(&lines(CONSOLE))),
                wall: Some(80.0),
                ..KernelRun::default()
            },
            KernelRun {
                key: "5.10".into(),
                problem: Some("downloading: 404 | gone".into()),
                ..KernelRun::default()
            },
        ];
        assert_eq!(runs[0].failure(&entries), None);
        let skipped = KernelRun {
            guest: Some(parse(&lines(&ok.replace("0 ignored", "1 ignored")))),
            ..KernelRun::default()
        };
        assert_eq!(
            skipped.failure(&entries).as_deref(),
            Some("tests failed: ebpf_prog")
        );
        assert_eq!(
            table(&runs, &entries, &facts),
            "\
| kernel package | `uname -r` | boot s | run s | wall s | ebpf_prog (pass / fail / ign) | BTF | tcx | result |
|---|---|---|---|---|---|---|---|---|
| linux-image-6.12.118+deb12-amd64-unsigned | 6.12.118+deb12-amd64 | 3.3 | 10.2 | 21.0 | 24 / 0 / 0 | yes | – | ok |
| linux-image-6.1.0-57-amd64-unsigned | 6.1.0-57-amd64 | 2.2 | 70.5 | 80.0 | 1 / 1 / 1 | yes | – | FAILED: tests failed: ebpf_prog |
| (5.10) | – | – | – | – | not run | – | – | FAILED: downloading: 404 \\| gone |
"
        );
        let f = failures(&runs);
        assert!(f.contains(
            "- linux-image-6.1.0-57-amd64-unsigned: ebpf_prog: `encap::decap_only_from_peers`: Error: loading"
        ));
    }
}
