//! Where the running kernel keeps the conntrack kfuncs the programs call,
//! and what the loader needs to reach them.
//!
//! Built into the kernel (`NF_CONNTRACK=y`, this project's development
//! kernel) they are in vmlinux's BTF, which aya searches by itself. Every
//! distribution builds `nf_conntrack` as a module, whose BTF is split BTF
//! on top of vmlinux's: its types are numbered after vmlinux's and its
//! strings offset after vmlinux's, so the two concatenated are one valid
//! BTF in which the module's types keep their ids. The loader resolves the
//! kfuncs and the gate's CO-RE field relocations (`struct nf_conn`, which
//! a distribution's vmlinux may describe incompletely or not at all)
//! against that, and passes the module's kernel BTF object in the program
//! load's `fd_array` (aya 0.16 cannot: third_party/aya/MYCNI-PATCH.md).
//!
//! `MYCNI_KFUNC_PROBE` (tests only) overrides what the probe finds:
//! `vmlinux` searches vmlinux alone, as aya without the patch would, and
//! `absent:NAME` reports the kfunc NAME missing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use aya::Btf;
use aya_obj::btf::BtfKind;

/// The kfuncs `c/ct_gate.c` calls, and the kernel each arrived in.
pub(crate) const REQUIRED: &[(&str, &str)] = &[
    ("bpf_skb_ct_lookup", "5.18"),
    ("bpf_ct_release", "5.18"),
    ("bpf_ct_change_timeout", "6.0"),
];

/// The module that registers them where conntrack is not built in.
pub(crate) const MODULE: &str = "nf_conntrack";

/// Where the kfuncs are.
pub enum Home {
    /// In vmlinux: the target BTF is vmlinux's own.
    Vmlinux { btf: Btf },
    /// In the module: `btf` is vmlinux's with the module's appended, `fd`
    /// the module's BTF object, and kfunc ids from `first_type_id` on are
    /// the module's.
    Module {
        btf: Btf,
        fd: Arc<OwnedFd>,
        first_type_id: u32,
    },
}

impl std::fmt::Debug for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Home::Vmlinux { .. } => f.write_str("vmlinux"),
            Home::Module { first_type_id, .. } => {
                write!(f, "module {MODULE} (types from {first_type_id})")
            }
        }
    }
}

impl Home {
    /// For logs and `inspect`.
    pub fn describe(&self) -> String {
        match self {
            Home::Vmlinux { .. } => "conntrack kfuncs in vmlinux BTF".to_owned(),
            Home::Module { .. } => format!("conntrack kfuncs in module BTF ({MODULE})"),
        }
    }
}

/// Why the programs cannot be loaded on this kernel, in words a node's
/// operator acts on.
#[derive(Debug, thiserror::Error)]
pub enum KfuncError {
    #[error(
        "this kernel has no conntrack kfunc {name} (Linux >= {since} with nf_conntrack and BTF; the kernel path runs)"
    )]
    Absent {
        name: &'static str,
        since: &'static str,
    },
    #[error("reading {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("parsing {what} BTF: {detail}")]
    Parse { what: String, detail: String },
    #[error(
        "finding {MODULE}'s BTF object: {0} (bpf(BPF_BTF_GET_NEXT_ID / BPF_BTF_GET_FD_BY_ID) needs CAP_SYS_ADMIN)"
    )]
    ModuleObject(io::Error),
    #[error("{MODULE} is loaded but the kernel lists no BTF object for it")]
    NoModuleObject,
    #[error(
        "{MODULE} is not loaded and nftables' module autoload did not load it (the agent's log says why): the conntrack kfuncs are in its BTF"
    )]
    NotLoaded,
}

/// Finds the kfuncs under `sys_btf` (`/sys/kernel/btf`). `nf_conntrack`
/// must already be loaded if it is a module ([`pull_in_conntrack`]).
pub fn locate(sys_btf: &Path) -> Result<Home, KfuncError> {
    let forced = std::env::var("MYCNI_KFUNC_PROBE").ok();
    if let Some(name) = forced.as_deref().and_then(|f| f.strip_prefix("absent:"))
        && let Some(&(name, since)) = REQUIRED.iter().find(|(n, _)| *n == name)
    {
        return Err(KfuncError::Absent { name, since });
    }
    let vmlinux = read(&sys_btf.join("vmlinux"))?;
    let btf = parse(&vmlinux, "vmlinux")?;
    let missing = REQUIRED
        .iter()
        .find(|(name, _)| btf.id_by_type_name_kind(name, BtfKind::Func).is_err());
    let Some(&(first_missing, since)) = missing else {
        return Ok(Home::Vmlinux { btf });
    };
    if forced.as_deref() == Some("vmlinux") {
        // What aya alone does: the load then fails naming the kfunc.
        return Ok(Home::Vmlinux { btf });
    }
    let module_path = sys_btf.join(MODULE);
    if !module_path.exists() {
        // nf_conntrack loaded without BTF of its own: a kernel older than
        // the kfuncs (5.10), or one built without DEBUG_INFO_BTF_MODULES.
        return Err(if Path::new("/sys/module").join(MODULE).exists() {
            KfuncError::Absent {
                name: first_missing,
                since,
            }
        } else {
            KfuncError::NotLoaded
        });
    }
    let module = read(&module_path)?;
    let first_type_id = type_count(&vmlinux).map_err(|detail| KfuncError::Parse {
        what: "vmlinux".to_owned(),
        detail,
    })? + 1;
    let merged = concat_split(&vmlinux, &module).map_err(|detail| KfuncError::Parse {
        what: MODULE.to_owned(),
        detail,
    })?;
    let btf = parse(&merged, "vmlinux + nf_conntrack")?;
    for &(name, since) in REQUIRED {
        if btf.id_by_type_name_kind(name, BtfKind::Func).is_err() {
            return Err(KfuncError::Absent { name, since });
        }
    }
    tracing::debug!(
        first_missing,
        since,
        first_type_id,
        "conntrack kfuncs are in module BTF"
    );
    let fd = module_btf_object(MODULE)?;
    Ok(Home::Module {
        btf,
        fd: Arc::new(fd),
        first_type_id,
    })
}

/// Makes the kernel load `nf_conntrack` (and what it needs) if it is a
/// module and not loaded yet: the programs' kfuncs and the conntrack
/// sysctls exist only once it is. Through the kernel's own module autoload,
/// as any nftables user triggers it: a rule with a conntrack expression
/// needs `nft_ct`, which needs `nf_conntrack`. The table is deleted in the
/// same transaction, so nothing of it is ever in force. No CAP_SYS_MODULE
/// and no /lib/modules in the agent's container: the kernel runs its own
/// modprobe.
pub fn pull_in_conntrack(sys_module: &Path) -> anyhow::Result<()> {
    // Present for a loaded module and for a built-in one (it has
    // parameters): nothing to pull in.
    if sys_module.join(MODULE).exists() {
        return Ok(());
    }
    crate::nft::apply(PULL_IN)?;
    tracing::info!("nf_conntrack pulled in through nftables' module autoload");
    Ok(())
}

/// The transaction [`pull_in_conntrack`] runs.
pub const PULL_IN: &str = "table inet mycni_conntrack_probe {
	chain probe {
		ct state established counter
	}
}
delete table inet mycni_conntrack_probe
";

fn read(path: &Path) -> Result<Vec<u8>, KfuncError> {
    std::fs::read(path).map_err(|source| KfuncError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn parse(data: &[u8], what: &str) -> Result<Btf, KfuncError> {
    Btf::parse(data, aya::Endianness::default()).map_err(|e| KfuncError::Parse {
        what: what.to_owned(),
        detail: e.to_string(),
    })
}

/// The BTF header (`struct btf_header`), native endian as the kernel
/// writes it to `/sys/kernel/btf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    hdr_len: u32,
    type_off: u32,
    type_len: u32,
    str_off: u32,
    str_len: u32,
}

const BTF_MAGIC: u16 = 0xeb9f;

fn u32_at(data: &[u8], at: usize) -> Result<u32, String> {
    data.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| format!("truncated at byte {at}"))
}

fn header(data: &[u8]) -> Result<Header, String> {
    let magic = data
        .get(0..2)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_ne_bytes)
        .ok_or("shorter than a BTF header")?;
    if magic != BTF_MAGIC {
        return Err(format!("bad magic {magic:#x}"));
    }
    let h = Header {
        hdr_len: u32_at(data, 4)?,
        type_off: u32_at(data, 8)?,
        type_len: u32_at(data, 12)?,
        str_off: u32_at(data, 16)?,
        str_len: u32_at(data, 20)?,
    };
    let end = |off: u32, len: u32| h.hdr_len as usize + off as usize + len as usize;
    if end(h.type_off, h.type_len) > data.len() || end(h.str_off, h.str_len) > data.len() {
        return Err("sections run past the end".to_owned());
    }
    Ok(h)
}

fn section(data: &[u8], h: &Header, off: u32, len: u32) -> Vec<u8> {
    let start = h.hdr_len as usize + off as usize;
    data[start..start + len as usize].to_vec()
}

/// `base` with the split BTF `split` appended: one BTF whose types and
/// strings keep the ids and offsets the split BTF gives them.
fn concat_split(base: &[u8], split: &[u8]) -> Result<Vec<u8>, String> {
    let b = header(base)?;
    let s = header(split)?;
    let mut types = section(base, &b, b.type_off, b.type_len);
    types.extend(section(split, &s, s.type_off, s.type_len));
    let mut strings = section(base, &b, b.str_off, b.str_len);
    strings.extend(section(split, &s, s.str_off, s.str_len));
    let hdr_len = 24u32;
    let mut out = Vec::with_capacity(hdr_len as usize + types.len() + strings.len());
    out.extend(BTF_MAGIC.to_ne_bytes());
    out.push(1); // version
    out.push(0); // flags
    for v in [
        hdr_len,
        0,
        types.len() as u32,
        types.len() as u32,
        strings.len() as u32,
    ] {
        out.extend(v.to_ne_bytes());
    }
    out.extend(types);
    out.extend(strings);
    Ok(out)
}

/// How many types `data` describes (not counting `void`, id 0): the id of
/// its last type. A split BTF on top of it numbers its first type one more.
fn type_count(data: &[u8]) -> Result<u32, String> {
    let h = header(data)?;
    let types = section(data, &h, h.type_off, h.type_len);
    let mut at = 0usize;
    let mut n = 0u32;
    while at < types.len() {
        let info = u32_at(&types, at + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        if kind == 0 || kind > crate::btf::KIND_MAX {
            return Err(format!("unknown BTF kind {kind} at type {}", n + 1));
        }
        let extra = crate::btf::trailer(kind, vlen);
        at += 12 + extra;
        n += 1;
    }
    if at != types.len() {
        return Err("the last type runs past the type section".to_owned());
    }
    Ok(n)
}

// bpf(2) commands and the attributes they read (include/uapi/linux/bpf.h).
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
const BPF_BTF_GET_NEXT_ID: libc::c_long = 23;

#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

#[repr(C)]
#[derive(Default)]
struct BtfInfo {
    btf: u64,
    btf_size: u32,
    id: u32,
    name: u64,
    name_len: u32,
    kernel_btf: u32,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised attribute struct of the layout
    // `cmd` reads, and its size is passed with it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The kernel's BTF object of module `name`, by walking every BTF object's
/// info (as libbpf and cilium/ebpf do). Needs CAP_SYS_ADMIN.
fn module_btf_object(name: &str) -> Result<OwnedFd, KfuncError> {
    let mut id = 0u32;
    loop {
        let mut next = IdAttr {
            id,
            ..Default::default()
        };
        match sys_bpf(BPF_BTF_GET_NEXT_ID, &mut next) {
            Ok(_) => id = next.next_id,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(KfuncError::NoModuleObject);
            }
            Err(e) => return Err(KfuncError::ModuleObject(e)),
        }
        let mut by_id = IdAttr {
            id,
            ..Default::default()
        };
        let fd = match sys_bpf(BPF_BTF_GET_FD_BY_ID, &mut by_id) {
            // SAFETY: the kernel returned a new fd that nothing else owns.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd as i32) },
            // Gone between the two calls (a module unloaded): next.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(KfuncError::ModuleObject(e)),
        };
        let mut module_name = [0u8; 64];
        let mut info = BtfInfo {
            name: module_name.as_mut_ptr() as u64,
            name_len: module_name.len() as u32,
            ..Default::default()
        };
        let mut attr = InfoAttr {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: std::mem::size_of::<BtfInfo>() as u32,
            info: &mut info as *mut BtfInfo as u64,
        };
        sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map_err(KfuncError::ModuleObject)?;
        let len = module_name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(module_name.len());
        if info.kernel_btf != 0 && &module_name[..len] == name.as_bytes() {
            return Ok(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (raw records) and `strings`.
    fn blob(types: &[u8], strings: &[u8]) -> Vec<u8> {
        let mut out = vec![];
        out.extend(BTF_MAGIC.to_ne_bytes());
        out.extend([1, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(v.to_ne_bytes());
        }
        out.extend(types);
        out.extend(strings);
        out
    }

    fn record(name_off: u32, kind: u32, vlen: u32, size_or_type: u32) -> Vec<u8> {
        let mut r = vec![];
        r.extend(name_off.to_ne_bytes());
        r.extend(((kind << 24) | vlen).to_ne_bytes());
        r.extend(size_or_type.to_ne_bytes());
        r
    }

    #[test]
    fn types_are_counted_by_their_record_sizes() {
        let mut types = record(1, 1, 0, 4); // INT "int"
        types.extend(0x0100_0020u32.to_ne_bytes()); // its encoding word
        types.extend(record(0, 2, 0, 1)); // PTR -> 1
        types.extend(record(5, 4, 2, 8)); // STRUCT "s" with 2 members
        types.extend([0u8; 24]);
        types.extend(record(7, 13, 1, 1)); // FUNC_PROTO, 1 param
        types.extend([0u8; 8]);
        let b = blob(&types, b"\0int\0s\0f\0");
        assert_eq!(type_count(&b), Ok(4));
        let mut cut = types.clone();
        cut.truncate(types.len() - 4);
        assert!(type_count(&blob(&cut, b"\0")).is_err());
    }

    #[test]
    fn a_split_btf_appended_keeps_its_ids_and_string_offsets() -> anyhow::Result<()> {
        // Base: "int" (id 1) and FUNC "base_fn" (id 2) -> FUNC_PROTO (id 3).
        let base_strings = b"\0int\0base_fn\0".to_vec();
        let mut base_types = record(1, 1, 0, 4);
        base_types.extend(0x0100_0020u32.to_ne_bytes());
        base_types.extend(record(5, 12, 1, 3)); // FUNC, linkage global
        base_types.extend(record(0, 13, 0, 1)); // FUNC_PROTO returning int
        let base = blob(&base_types, &base_strings);
        assert_eq!(type_count(&base), Ok(3));
        // Split: FUNC "mod_fn" (id 4) -> FUNC_PROTO (id 5) returning the
        // base's int; its string offsets continue after the base's.
        let off = base_strings.len() as u32;
        let mut split_types = record(off, 12, 1, 5);
        split_types.extend(record(0, 13, 0, 1));
        let split = blob(&split_types, b"mod_fn\0");
        let merged = concat_split(&base, &split).map_err(anyhow::Error::msg)?;
        let btf = Btf::parse(&merged, aya::Endianness::default())?;
        assert_eq!(btf.id_by_type_name_kind("base_fn", BtfKind::Func)?, 2);
        assert_eq!(btf.id_by_type_name_kind("mod_fn", BtfKind::Func)?, 4);
        let first = type_count(&base).map_err(anyhow::Error::msg)? + 1;
        assert_eq!(btf.id_by_type_name_kind("mod_fn", BtfKind::Func)?, first);
        Ok(())
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(header(b"").is_err());
        assert!(header(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_err());
        let mut b = blob(&record(0, 2, 0, 0), b"\0");
        b[12] = 0xff; // type_len past the end
        assert!(header(&b).is_err());
        assert!(concat_split(&b, &b).is_err());
        assert!(type_count(&blob(&record(0, 31, 0, 0), b"\0")).is_err());
    }

    #[test]
    fn the_probe_can_be_told_a_kfunc_is_absent() {
        // SAFETY (env): this test alone sets the variable.
        unsafe { std::env::set_var("MYCNI_KFUNC_PROBE", "absent:bpf_ct_change_timeout") };
        let err = locate(Path::new("/nonexistent")).expect_err("absent");
        unsafe { std::env::remove_var("MYCNI_KFUNC_PROBE") };
        let text = err.to_string();
        assert!(
            text.contains("bpf_ct_change_timeout") && text.contains("6.0"),
            "{text}"
        );
    }
}
