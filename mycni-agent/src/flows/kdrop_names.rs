//! The names of the kernel's drop reasons (`enum skb_drop_reason`), which
//! the `kfree_skb` tracepoint reports as numbers: `IP_RPFILTER`,
//! `NETFILTER_DROP`, `NEIGH_FAILED`, ...
//!
//! The numbers change between kernels (reasons are inserted in the middle
//! of the enum), so they are read at startup from the running kernel's BTF,
//! `/sys/kernel/btf/vmlinux`, never compiled in. aya's BTF parser keeps enum
//! variants to itself, so this walks the type section: only sizes are
//! needed to step over the other kinds, and only enums are decoded.

use std::collections::BTreeMap;
use std::path::Path;

use mycni_common::flow::KDROP_REASON_SUBSYSTEM;
use thiserror::Error;

/// Where the running kernel publishes its BTF.
pub(crate) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// The enum's name in the kernel's BTF.
const ENUM_NAME: &str = "skb_drop_reason";
/// What every reason's name starts with; stripped (`IP_RPFILTER`). The two
/// that are not drops (`SKB_NOT_DROPPED_YET`, `SKB_CONSUMED`) keep their
/// names less the `SKB_`.
const PREFIX: &str = "SKB_DROP_REASON_";

#[derive(Debug, Error)]
pub enum NamesError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("not BTF: {0}")]
    Format(&'static str),
    #[error("the kernel's BTF has no enum {ENUM_NAME} (a kernel before 5.17)")]
    NoEnum,
}

/// The reasons of one kernel, by number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DropReasons {
    names: BTreeMap<u16, String>,
}

impl DropReasons {
    /// The running kernel's reasons.
    pub fn from_kernel() -> Result<Self, NamesError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    pub(crate) fn from_file(path: &Path) -> Result<Self, NamesError> {
        let data = std::fs::read(path).map_err(|source| NamesError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_btf(&data)
    }

    /// The reasons from raw BTF (a `vmlinux` blob).
    pub(crate) fn from_btf(data: &[u8]) -> Result<Self, NamesError> {
        let variants = enum_variants(data, ENUM_NAME)?.ok_or(NamesError::NoEnum)?;
        let names = variants
            .into_iter()
            .filter_map(|(name, value)| {
                let n = u16::try_from(value).ok()?;
                let short = name
                    .strip_prefix(PREFIX)
                    .or_else(|| name.strip_prefix("SKB_"))
                    .unwrap_or(&name);
                // SKB_DROP_REASON_MAX and the subsystem mask are bounds,
                // not reasons.
                (short != "MAX" && short != "SUBSYS_MASK").then(|| (n, short.to_owned()))
            })
            .collect();
        Ok(Self { names })
    }

    /// The reason's name, or its number when this kernel has no such
    /// reason (or names were unavailable).
    pub fn name(&self, reason: u16) -> String {
        match self.names.get(&reason) {
            Some(n) => n.clone(),
            None if reason == KDROP_REASON_SUBSYSTEM => "SUBSYSTEM".to_owned(),
            None => reason.to_string(),
        }
    }

    /// The number of a reason by name (without the prefix), e.g. for a
    /// filter given by a person.
    pub fn number(&self, name: &str) -> Option<u16> {
        let name = name.strip_prefix(PREFIX).unwrap_or(name);
        self.names
            .iter()
            .find_map(|(n, s)| s.eq_ignore_ascii_case(name).then_some(*n))
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

use crate::btf::{KIND_ENUM, KIND_ENUM64, KIND_MAX, trailer};

/// The variants (name, value) of the first enum or enum64 named `want`.
fn enum_variants(data: &[u8], want: &str) -> Result<Option<Vec<(String, u64)>>, NamesError> {
    let u16_at = |o: usize| -> Option<u16> {
        Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?))
    };
    let u32_at = |o: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?))
    };
    // struct btf_header: magic, version, flags, hdr_len, then offsets
    // (from the header's end) and lengths of the type and string sections.
    // Little endian only: the machines this agent runs on.
    if u16_at(0) != Some(0xeb9f) {
        return Err(NamesError::Format("bad magic (or a big-endian kernel)"));
    }
    let field = |i: usize| u32_at(4 + 4 * i).map(|v| v as usize);
    let (Some(hdr_len), Some(type_off), Some(type_len), Some(str_off), Some(str_len)) =
        (field(0), field(1), field(2), field(3), field(4))
    else {
        return Err(NamesError::Format("short header"));
    };
    let types = hdr_len + type_off..hdr_len + type_off + type_len;
    let strings = hdr_len + str_off..hdr_len + str_off + str_len;
    if types.end > data.len() || strings.end > data.len() {
        return Err(NamesError::Format("sections past the end"));
    }
    let name_at = |off: u32| -> Option<&str> {
        let s = data.get(strings.start + off as usize..strings.end)?;
        let end = s.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&s[..end]).ok()
    };
    let mut at = types.start;
    while at + 12 <= types.end {
        let (Some(name_off), Some(info)) = (u32_at(at), u32_at(at + 4)) else {
            break;
        };
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        if kind == 0 || kind > KIND_MAX {
            return Err(NamesError::Format("unknown type kind"));
        }
        let body = at + 12;
        if (kind == KIND_ENUM || kind == KIND_ENUM64) && name_at(name_off) == Some(want) {
            let step = if kind == KIND_ENUM { 8 } else { 12 };
            let mut out = Vec::with_capacity(vlen);
            for i in 0..vlen {
                let v = body + i * step;
                let (Some(n), Some(lo)) = (u32_at(v), u32_at(v + 4)) else {
                    return Err(NamesError::Format("enum past the end"));
                };
                let hi = if kind == KIND_ENUM64 {
                    u32_at(v + 8).unwrap_or(0)
                } else {
                    0
                };
                let name = name_at(n).ok_or(NamesError::Format("bad string offset"))?;
                out.push((name.to_owned(), (u64::from(hi) << 32) | u64::from(lo)));
            }
            return Ok(Some(out));
        }
        at = body + trailer(kind, vlen);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btf::{KIND_INT, KIND_STRUCT};

    /// A BTF blob with an int, a struct and then `enums` (name, variants).
    fn btf(enums: &[(&str, &[(&str, u32)])]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut add = |s: &str| {
            let off = strings.len() as u32;
            strings.extend_from_slice(s.as_bytes());
            strings.push(0);
            off
        };
        let mut types = Vec::new();
        let ty = |name: u32, kind: u32, vlen: u32, size: u32| {
            let mut t = Vec::new();
            for w in [name, (kind << 24) | vlen, size] {
                t.extend_from_slice(&w.to_le_bytes());
            }
            t
        };
        // int: one trailing word.
        types.extend(ty(add("int"), KIND_INT, 0, 4));
        types.extend(32u32.to_le_bytes());
        // struct with two members (12 bytes each).
        types.extend(ty(add("sk_buff"), KIND_STRUCT, 2, 8));
        types.extend([0u8; 24]);
        for (name, variants) in enums {
            types.extend(ty(add(name), KIND_ENUM, variants.len() as u32, 4));
            for (v, val) in *variants {
                types.extend(add(v).to_le_bytes());
                types.extend(val.to_le_bytes());
            }
        }
        let mut out = Vec::new();
        out.extend(0xeb9fu16.to_le_bytes());
        out.extend([1u8, 0]);
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(w.to_le_bytes());
        }
        out.extend(types);
        out.extend(strings);
        out
    }

    #[test]
    fn names_come_from_the_kernels_enum_without_the_prefix() {
        let blob = btf(&[
            ("other", &[("SKB_DROP_REASON_IP_RPFILTER", 99)]),
            (
                "skb_drop_reason",
                &[
                    ("SKB_NOT_DROPPED_YET", 0),
                    ("SKB_CONSUMED", 1),
                    ("SKB_DROP_REASON_NOT_SPECIFIED", 2),
                    ("SKB_DROP_REASON_IP_RPFILTER", 16),
                    ("SKB_DROP_REASON_MAX", 128),
                    ("SKB_DROP_REASON_SUBSYS_MASK", 0xffff_0000),
                ],
            ),
        ]);
        let r = DropReasons::from_btf(&blob).expect("parses");
        assert_eq!(r.name(16), "IP_RPFILTER");
        assert_eq!(r.name(2), "NOT_SPECIFIED");
        assert_eq!(r.name(1), "CONSUMED");
        // Bounds are not reasons; unknown numbers stay numbers.
        assert_eq!(r.name(128), "128");
        assert_eq!(r.name(77), "77");
        assert_eq!(r.name(KDROP_REASON_SUBSYSTEM), "SUBSYSTEM");
        assert_eq!(r.number("ip_rpfilter"), Some(16));
        assert_eq!(r.number("SKB_DROP_REASON_IP_RPFILTER"), Some(16));
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn a_kernel_without_the_enum_or_not_btf_is_an_error() {
        let blob = btf(&[("other", &[("A", 1)])]);
        assert!(matches!(
            DropReasons::from_btf(&blob),
            Err(NamesError::NoEnum)
        ));
        assert!(matches!(
            DropReasons::from_btf(b"not btf at all, not at all"),
            Err(NamesError::Format(_))
        ));
        let mut cut = btf(&[("skb_drop_reason", &[("SKB_CONSUMED", 1)])]);
        cut.truncate(cut.len() - 10);
        assert!(DropReasons::from_btf(&cut).is_err());
    }

    /// The running kernel's names, where it publishes BTF (not root-only).
    #[test]
    fn the_running_kernel_names_its_reasons() {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("no {VMLINUX_BTF}: skipped");
            return;
        }
        let r = DropReasons::from_kernel().expect("the kernel's BTF parses");
        for name in [
            "NOT_SPECIFIED",
            "IP_RPFILTER",
            "NETFILTER_DROP",
            "NO_SOCKET",
        ] {
            let n = r
                .number(name)
                .unwrap_or_else(|| panic!("no {name} in {r:?}"));
            assert_eq!(r.name(n), name);
        }
    }
}
