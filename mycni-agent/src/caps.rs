//! The capabilities the agent needs, probed at start so a DaemonSet with a
//! missing `capabilities.add` entry fails at once with the name of what is
//! missing, instead of with EPERM from deep inside netlink or bpf(2).

use crate::datapath::Mode;

/// A capability, its bit in `CapEff`, and what the agent uses it for.
pub struct Cap {
    pub name: &'static str,
    pub bit: u32,
    pub why: &'static str,
}

const NET_ADMIN: Cap = Cap {
    name: "CAP_NET_ADMIN",
    bit: 12,
    why: "vxlan.1, routes, neighbours, FDB, nftables masquerade, tc programs",
};
const PERFMON: Cap = Cap {
    name: "CAP_PERFMON",
    bit: 38,
    why: "the verifier's privileged mode, which the fast path's packet parsing needs",
};
const BPF: Cap = Cap {
    name: "CAP_BPF",
    bit: 39,
    why: "loading the fast path's maps and programs (bpf(2))",
};

/// What `mode` needs.
pub fn required(mode: Mode) -> Vec<Cap> {
    match mode {
        Mode::Kernel => vec![NET_ADMIN],
        Mode::Ebpf => vec![NET_ADMIN, BPF, PERFMON],
    }
}

/// The effective capability set of this process, from /proc/self/status.
pub fn effective() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| std::io::Error::other("no CapEff line in /proc/self/status"))
}

/// The capabilities of `required` missing from `effective`, with a message
/// an operator can act on; Ok when none is.
pub fn check(effective: u64, required: &[Cap]) -> Result<(), String> {
    let missing: Vec<&Cap> = required
        .iter()
        .filter(|c| effective & (1u64 << c.bit) == 0)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing
        .iter()
        .map(|c| format!("{} ({})", c.name, c.why))
        .collect();
    Err(format!(
        "missing capabilit{} {}; add {} to the agent container's securityContext.capabilities.add (see deploy/base/daemonset.yaml){}",
        if missing.len() == 1 { "y" } else { "ies" },
        list.join(", "),
        missing
            .iter()
            .map(|c| c.name.trim_start_matches("CAP_"))
            .collect::<Vec<_>>()
            .join(", "),
        if missing.iter().any(|c| c.bit != NET_ADMIN.bit) {
            ", or run with --datapath kernel"
        } else {
            ""
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_exactly_the_missing_ones() {
        let all = (1u64 << 12) | (1 << 38) | (1 << 39);
        assert!(check(all, &required(Mode::Ebpf)).is_ok());
        assert!(check(1 << 12, &required(Mode::Kernel)).is_ok());
        let e = check(all & !(1 << 39), &required(Mode::Ebpf)).unwrap_err();
        assert!(
            e.contains("CAP_BPF") && !e.contains("CAP_PERFMON") && !e.contains("CAP_NET_ADMIN")
        );
        assert!(e.contains("--datapath kernel"));
        let e = check(0, &required(Mode::Kernel)).unwrap_err();
        assert!(e.contains("CAP_NET_ADMIN") && !e.contains("--datapath kernel"));
    }
}
