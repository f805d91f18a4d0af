//! The Dockerfile, checked against the builder stage and the DaemonSet.

use super::*;

#[derive(Debug)]
pub(crate) struct Stage {
    pub(crate) base: String,
    pub(crate) name: Option<String>,
    /// (INSTRUCTION, arguments), continuation lines joined, comments dropped.
    pub(crate) instructions: Vec<(String, String)>,
}

/// (global ARGs before the first FROM, stages).
pub(crate) fn parse_dockerfile(text: &str) -> Check<(Vec<String>, Vec<Stage>)> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        return Err("the Dockerfile ends inside a continued line".into());
    }
    let mut global_args = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for l in logical {
        let (keyword, rest) = l
            .split_once(char::is_whitespace)
            .unwrap_or((l.as_str(), ""));
        let keyword = keyword.to_ascii_uppercase();
        let rest = rest.trim().to_string();
        if keyword == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let (base, name) = match words.as_slice() {
                [base] => (*base, None),
                [base, as_, name] if as_.eq_ignore_ascii_case("as") => (*base, Some(*name)),
                _ => return Err(format!("cannot read FROM {rest}")),
            };
            stages.push(Stage {
                base: base.to_string(),
                name: name.map(str::to_string),
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((keyword, rest));
        } else if keyword == "ARG" {
            global_args.push(rest);
        } else {
            return Err(format!("{keyword} before the first FROM"));
        }
    }
    Ok((global_args, stages))
}

/// `NAME=value` among ARG instructions.
pub(crate) fn arg_default<'a>(
    args: impl IntoIterator<Item = &'a String>,
    name: &str,
) -> Option<&'a str> {
    args.into_iter()
        .find_map(|a| a.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .map(|v| v.trim_matches('"'))
}

/// The binaries a workspace package builds: its `[[bin]]` names, or its
/// package name when it has none and a src/main.rs.
pub(crate) fn package_bins(package_dir: &str) -> Vec<String> {
    let manifest = read(&format!("{package_dir}/Cargo.toml"));
    let mut section = String::new();
    let (mut package_name, mut bins) = (None, Vec::new());
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let Some(value) = line
            .strip_prefix("name")
            .map(str::trim_start)
            .and_then(|l| l.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_string())
        else {
            continue;
        };
        match section.as_str() {
            "[package]" => package_name = Some(value),
            "[[bin]]" => bins.push(value),
            _ => {}
        }
    }
    if bins.is_empty() && workspace().join(package_dir).join("src/main.rs").exists() {
        bins.extend(package_name);
    }
    bins
}

/// Workspace package name -> its directory.
pub(crate) const PACKAGE_DIRS: &[(&str, &str)] = &[
    ("mycni-agent", "mycni-agent"),
    ("mycni-plugin", "mycni-plugin"),
];

/// Checks the builder/runtime split and returns the runtime stage's
/// `COPY --from=builder` destinations: (source, destination).
pub(crate) fn check_dockerfile(text: &str) -> Check<Vec<(String, String)>> {
    let (_, stages) = parse_dockerfile(text)?;
    let [builder, runtime] = stages.as_slice() else {
        return Err(format!(
            "expected two stages (builder, runtime), found {}",
            stages.len()
        ));
    };
    if builder.name.as_deref() != Some("builder")
        || !builder.base.contains("rust:")
        || !builder.base.ends_with("-bookworm")
    {
        return Err(format!(
            "the first stage must be `rust:<version>-bookworm AS builder`, is {} AS {:?}",
            builder.base, builder.name
        ));
    }
    if !runtime.base.ends_with("debian:bookworm-slim") {
        return Err(format!(
            "the runtime stage must be debian:bookworm-slim, is {}",
            runtime.base
        ));
    }

    // What the builder produces.
    let mut workdir = String::from("/");
    let mut produced = BTreeSet::new();
    let mut ebpf_built = false;
    for (keyword, args) in &builder.instructions {
        match keyword.as_str() {
            "WORKDIR" => workdir = args.trim_end_matches('/').to_string(),
            "ENV" if args.contains("CARGO_TARGET_DIR") => {
                return Err("CARGO_TARGET_DIR moves the build outputs".into());
            }
            "RUN" => {
                for command in args.split("&&") {
                    let words: Vec<&str> = command.split_whitespace().collect();
                    if words.starts_with(&["cargo", "xtask", "build-ebpf"]) {
                        if !words.contains(&"--release") {
                            return Err(
                                "build-ebpf must be --release: the agent embeds that object".into(),
                            );
                        }
                        ebpf_built = true;
                        produced.insert(format!("{workdir}/{EBPF_OBJECT}"));
                    }
                    if words.starts_with(&["cargo", "xtask", "build-plugin"]) {
                        produced.insert(format!("{workdir}/{PLUGIN_BINARY}"));
                    }
                    if words.starts_with(&["cargo", "build"]) {
                        if !words.contains(&"--release") || words.contains(&"--target-dir") {
                            return Err(format!(
                                "`{}` must be a plain --release build",
                                command.trim()
                            ));
                        }
                        if !ebpf_built {
                            return Err(
                                "cargo build runs before `cargo xtask build-ebpf --release`: \
                                        the agent would embed no eBPF object"
                                    .into(),
                            );
                        }
                        for (i, w) in words.iter().enumerate() {
                            if *w != "-p" && *w != "--package" {
                                continue;
                            }
                            let package = words.get(i + 1).copied().unwrap_or_default();
                            let (_, dir) = PACKAGE_DIRS
                                .iter()
                                .find(|(p, _)| *p == package)
                                .ok_or_else(|| format!("unknown package {package:?}"))?;
                            for bin in package_bins(dir) {
                                produced.insert(format!("{workdir}/target/release/{bin}"));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }

    let installs = |stage: &Stage, package: &str| {
        stage.instructions.iter().any(|(k, a)| {
            k == "RUN"
                && a.contains("apt-get install")
                && a.split_whitespace().any(|w| w == package)
        })
    };
    for package in BUILD_PACKAGES {
        if !installs(builder, package) {
            return Err(format!("the builder stage does not install {package}"));
        }
    }
    for package in RUNTIME_PACKAGES {
        if !installs(runtime, package) {
            return Err(format!("the runtime stage does not install {package}"));
        }
    }

    let mut copies = Vec::new();
    for (stage, is_runtime) in [(builder, false), (runtime, true)] {
        for (keyword, args) in &stage.instructions {
            if keyword != "COPY" || !args.starts_with("--from") {
                continue;
            }
            let words: Vec<&str> = args.split_whitespace().collect();
            let [from, src, dst] = words.as_slice() else {
                return Err(format!(
                    "COPY {args}: expected one source and one destination"
                ));
            };
            if !is_runtime || *from != "--from=builder" {
                return Err(format!(
                    "COPY {args}: only the runtime stage copies, from builder"
                ));
            }
            if !produced.contains(*src) {
                return Err(format!(
                    "COPY {args}: the builder does not produce {src} (it produces {produced:?})"
                ));
            }
            let base = |p: &str| p.rsplit('/').next().unwrap_or_default().to_string();
            if base(src) != base(dst) {
                return Err(format!("COPY {args}: copies {src} under another name"));
            }
            copies.push((src.to_string(), dst.to_string()));
        }
    }
    Ok(copies)
}

/// The Dockerfile's toolchain pins are xtask's.
pub(crate) fn check_dockerfile_pins(
    dockerfile: &str,
    xtask_main: &str,
    xtask_setup: &str,
) -> Check<()> {
    let constant = |source: &str, name: &str| -> Check<String> {
        let start = source
            .find(&format!("const {name}: &str = \""))
            .ok_or_else(|| format!("xtask has no const {name}"))?;
        let value = &source[start..];
        value
            .split('"')
            .nth(1)
            .map(str::to_string)
            .ok_or_else(|| format!("cannot read xtask's {name}"))
    };
    let (global, stages) = parse_dockerfile(dockerfile)?;
    let stage_args: Vec<&String> = stages
        .iter()
        .flat_map(|s| &s.instructions)
        .filter(|(k, _)| k == "ARG")
        .map(|(_, a)| a)
        .chain(&global)
        .collect();
    for (arg, source, name) in [
        ("RUST_VERSION", xtask_main, "HOST_TOOLCHAIN"),
        ("EBPF_TOOLCHAIN", xtask_main, "EBPF_TOOLCHAIN"),
        ("BPF_LINKER_VERSION", xtask_setup, "BPF_LINKER_VERSION"),
    ] {
        let pinned = constant(source, name)?;
        let ours = arg_default(stage_args.iter().copied(), arg);
        if ours != Some(pinned.as_str()) {
            return Err(format!(
                "ARG {arg} is {ours:?} but xtask pins {name} = {pinned:?}"
            ));
        }
    }
    for package in BUILD_PACKAGES {
        if !xtask_setup.contains(&format!("(\"{package}\""))
            && !xtask_setup.contains(&format!("\"{package}\","))
        {
            return Err(format!(
                "{package} is not in `cargo xtask setup`'s package list any more"
            ));
        }
    }
    Ok(())
}
