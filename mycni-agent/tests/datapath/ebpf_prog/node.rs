//! The node: a namespace with conntrack on, a bpffs, the loaded programs.

use mycni_common::net::Mac;

use super::*;

pub(crate) struct Node {
    // Dropped in this order: the namespace, then the bpffs mount.
    pub(crate) ns: NetNs,
    pub(crate) bpffs: BpfFs,
}

impl Node {
    pub(crate) fn new(tag: &str) -> Result<Self> {
        let node = Self {
            ns: NetNs::new(tag)?,
            bpffs: BpfFs::new()?,
        };
        for ip in [POD_A, POD_B, POD_R] {
            node.ns
                .exec("ip", &["addr", "add", &format!("{ip}/32"), "dev", "lo"])?;
        }
        for ip in [POD_A6, POD_B6, POD_R6] {
            node.ns.exec(
                "ip",
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip}/128"),
                    "dev",
                    "lo",
                    "nodad",
                ],
            )?;
        }
        // Any rule matching on ct state makes conntrack track this namespace.
        node.ns.exec(
            "nft",
            &["add table ip mycni_t; \
               add chain ip mycni_t out { type filter hook output priority 0; }; \
               add rule ip mycni_t out ct state established accept; \
               add table ip6 mycni_t6; \
               add chain ip6 mycni_t6 out { type filter hook output priority 0; }; \
               add rule ip6 mycni_t6 out ct state established accept"],
        )?;
        Ok(node)
    }

    /// Adds the underlay: `ul0` (UL_HOST/24, one end of a veth pair whose
    /// other end `ul0p` only listens) with the peer's MAC as a permanent
    /// neighbour, and a `vxlan.1` over it set up as the agent does, with the
    /// peer's FDB entry, so the device's own frames can be compared with
    /// the program's.
    pub(crate) fn with_underlay(self) -> Result<Self> {
        let vtep = Mac(VTEP_MAC).to_string();
        let peer_vtep = Mac(PEER_VTEP_MAC).to_string();
        let peer_mac = Mac(UL_PEER_MAC).to_string();
        for args in [
            "link add ul0 type veth peer name ul0p",
            &format!("addr add {UL_HOST}/24 dev ul0"),
            "link set ul0 up",
            "link set ul0p up",
            &format!("neigh replace {UL_PEER} lladdr {peer_mac} dev ul0 nud permanent"),
            &format!(
                "link add vxlan.1 address {vtep} type vxlan id 1 dev ul0 local {UL_HOST} \
                 dstport {VXLAN_PORT} nolearning noudpcsum"
            ),
            "link set vxlan.1 up",
        ] {
            let args: Vec<&str> = args.split_whitespace().collect();
            self.ns.exec("ip", &args)?;
        }
        // bpf_fib_lookup answers only for interfaces that forward (the
        // agent turns forwarding on for every node).
        self.ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        self.ns.exec(
            "bridge",
            &[
                "fdb",
                "add",
                &peer_vtep,
                "dev",
                "vxlan.1",
                "dst",
                &UL_PEER.to_string(),
                "self",
                "permanent",
            ],
        )?;
        Ok(self)
    }

    /// Adds the IPv6 underlay: `ul6` (UL6_HOST/64, one end of a veth pair
    /// whose other end `ul6p` only listens) with the peer's MAC as a
    /// permanent neighbour of its IPv6 host address, and a `vxlan6.1` over
    /// it set up as the agent does (MTU = `ul6`'s less 70), with the FDB
    /// entry sending the peer's `vxlan6.1` MAC to that address.
    pub(crate) fn with_underlay6(self) -> Result<Self> {
        let vtep6 = Mac(VTEP6_MAC).to_string();
        let peer_vtep6 = Mac(PEER_VTEP6_MAC).to_string();
        let peer_mac = Mac(UL_PEER_MAC).to_string();
        for args in [
            "link add ul6 type veth peer name ul6p",
            &format!("-6 addr add {UL6_HOST}/64 dev ul6 nodad"),
            "link set ul6 up",
            "link set ul6p up",
            &format!("-6 neigh replace {UL6_PEER} lladdr {peer_mac} dev ul6 nud permanent"),
            &format!(
                "link add vxlan6.1 address {vtep6} mtu {VXLAN6_MTU} type vxlan id 1 dev ul6 \
                 local {UL6_HOST} dstport {VXLAN_PORT} nolearning"
            ),
            "link set vxlan6.1 up",
        ] {
            let args: Vec<&str> = args.split_whitespace().collect();
            self.ns.exec("ip", &args)?;
        }
        self.ns.exec(
            "bridge",
            &[
                "fdb",
                "add",
                &peer_vtep6,
                "dev",
                "vxlan6.1",
                "dst",
                &UL6_PEER.to_string(),
                "self",
                "permanent",
            ],
        )?;
        Ok(self)
    }

    /// Also DNATs the Service IPs, like kube-proxy, to pods R and B.
    pub(crate) fn with_services(self) -> Result<Self> {
        self.ns
            .exec("ip", &["route", "add", "10.96.0.0/16", "dev", "lo"])?;
        self.ns.exec(
            "nft",
            &[&format!(
                "add table ip mycni_nat; \
                 add chain ip mycni_nat out {{ type nat hook output priority -100; }}; \
                 add rule ip mycni_nat out ip daddr {SVC_TO_R} tcp dport 80 dnat to {POD_R}:{SERVER_PORT}; \
                 add rule ip mycni_nat out ip daddr {SVC_TO_B} tcp dport 80 dnat to {POD_B}:{SERVER_PORT}"
            )],
        )?;
        Ok(self)
    }

    /// Runs `f` on a thread inside the namespace, with the programs loaded
    /// and the remote and local maps filled (the config is left to `f`).
    ///
    /// On a kernel without the conntrack kfuncs (before 5.18: Debian 11's
    /// 5.10) the programs cannot exist, and the case checks the one thing
    /// there is to check: the load refuses, naming the kfunc, as the agent
    /// then says in `/readyz` before running the kernel path.
    pub(crate) fn run<T: Send + Default>(
        &self,
        f: impl FnOnce(&Dp) -> Result<T> + Send,
    ) -> Result<T> {
        let object = embedded_object().context(
            "agent built without eBPF object: run `cargo xtask build-ebpf --release` first",
        )?;
        let pin = self.bpffs.path();
        self.ns.run_in(|| {
            // Asked once: parsing the kernel's BTF takes seconds in a guest.
            static NO_KFUNCS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            let no_kfuncs = *NO_KFUNCS.get_or_init(|| {
                matches!(
                    mycni_agent::datapath::kfuncs::locate(FsPath::new("/sys/kernel/btf")),
                    Err(mycni_agent::datapath::kfuncs::KfuncError::Absent { .. })
                )
            });
            if no_kfuncs {
                let Err(e) = Datapath::load(object, pin) else {
                    bail!("the programs loaded on a kernel without conntrack kfuncs");
                };
                ensure!(e.to_string().contains("no conntrack kfunc"), "{e}");
                eprintln!("no conntrack kfuncs here: the load refuses ({e}); no verdicts to check");
                return Ok(T::default());
            }
            let dp = Datapath::load(object, pin)?;
            REMOTE.sync(pin, &remote_map())?;
            LOCAL.sync(pin, &local_map())?;
            REMOTE6.sync(pin, &remote6_map())?;
            LOCAL6.sync(pin, &local6_map())?;
            let peer = PeerNode {
                vtep_mac: PEER_VTEP_MAC,
                _pad: [0; 2],
            };
            PEERS.sync(pin, &BTreeMap::from([(UL_PEER, peer)]))?;
            f(&Dp {
                dp,
                pin,
                iif: std::cell::Cell::new(None),
                family: std::cell::Cell::new(None),
            })
        })?
    }
}

/// The loaded programs; lives on the thread inside the namespace.
/// One test run's input: `pkt` through `prog`, `what` naming it in
/// messages.
#[derive(Clone, Copy)]
pub(crate) struct Input<'a> {
    pub(crate) what: &'a str,
    pub(crate) prog: Prog,
    pub(crate) pkt: &'a [u8],
}

/// [`Input`], in the order the checks name it.
pub(crate) fn input<'a>(what: &'a str, prog: Prog, pkt: &'a [u8]) -> Input<'a> {
    Input { what, prog, pkt }
}

pub(crate) struct Dp<'a> {
    pub(crate) dp: Datapath,
    pub(crate) pin: &'a FsPath,
    /// Overrides the arrival interface [`ingress_of`] would pick.
    pub(crate) iif: std::cell::Cell<Option<u32>>,
    /// The family the last counted run was counted under.
    family: std::cell::Cell<Option<DpFamily>>,
}

impl Dp<'_> {
    pub(crate) fn configure(&self, cfg: &DpConfig) -> Result<()> {
        Ok(write_config(self.pin, cfg)?)
    }

    pub(crate) fn counters(&self) -> Result<Vec<(DpPath, PathCounter)>> {
        Ok(read_counters(self.pin)?)
    }

    pub(crate) fn family_counters(&self) -> Result<Vec<(DpFamily, DpPath, PathCounter)>> {
        Ok(read_family_counters(self.pin)?)
    }

    /// The family the last run that was counted was counted under.
    pub(crate) fn family(&self) -> Option<DpFamily> {
        self.family.get()
    }

    /// Runs `prog` once on `pkt` and returns the path it was counted under,
    /// checking it was counted exactly once, with the packet's length, and
    /// that the program stayed within what it may do to a packet.
    pub(crate) fn run(&self, prog: Prog, pkt: &[u8]) -> Result<(DpPath, Outcome)> {
        self.try_run(prog, pkt)?
            .with_context(|| format!("BPF_PROG_TEST_RUN refused {}", hex(pkt)))
    }

    /// [`Self::run`], or `None` when `BPF_PROG_TEST_RUN` refused to build an
    /// skb from the frame (see [`test_run_accepts`]) and so ran nothing.
    pub(crate) fn try_run(&self, prog: Prog, pkt: &[u8]) -> Result<Option<(DpPath, Outcome)>> {
        self.family.set(None);
        let before = self.family_counters()?;
        let iif = self.iif.get().unwrap_or_else(|| ingress_of(prog, pkt));
        let out = match run_skb_from(self.dp.program_fd(prog)?, pkt, iif) {
            Ok(out) => out,
            Err(_) if !test_run_accepts(pkt) => {
                ensure!(
                    self.family_counters()? == before,
                    "a refused run was counted"
                );
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let after = self.family_counters()?;
        let moved: Vec<(DpFamily, DpPath, u64, u64)> = before
            .iter()
            .zip(&after)
            .filter(|((_, _, b), (_, _, a))| a != b)
            .map(|((f, p, b), (_, _, a))| (*f, *p, a.packets - b.packets, a.bytes - b.bytes))
            .collect();
        let [(family, path, packets, bytes)] = moved[..] else {
            bail!(
                "{}: expected exactly one counter to move, got {moved:?}\n  in: {}",
                prog.name(),
                hex(pkt)
            );
        };
        ensure!(
            (packets, bytes) == (1, pkt.len() as u64),
            "{}: {} moved by {packets} packets / {bytes} bytes, expected 1 / {}",
            prog.name(),
            path.name(),
            pkt.len()
        );
        check_family(prog, pkt, family, path)?;
        self.family.set(Some(family));
        match out.retval {
            TCX_NEXT => ensure!(
                !path.is_fast() && out.data == pkt,
                "{}: TCX_NEXT under {} changed the packet\n  in:  {}\n  out: {}",
                prog.name(),
                path.name(),
                hex(pkt),
                hex(&out.data)
            ),
            TC_ACT_REDIRECT => {
                ensure!(path.is_fast(), "redirect counted under {}", path.name());
                // Wrapping and unwrapping are checked field by field by
                // their own tests.
                if !matches!(path, DpPath::FastEncap | DpPath::FastTcDecap) {
                    ensure_only_forwarding_rewrite(pkt, &out.data)?;
                }
            }
            other => bail!("{}: unexpected verdict {other}", prog.name()),
        }
        Ok(Some((path, out)))
    }

    /// [`Self::kernel`] for a frame that arrives on host veth `iif`.
    pub(crate) fn kernel_on(&self, input: Input, iif: u32, want: DpPath) -> Result<()> {
        let Input { what, prog, pkt } = input;
        self.iif.set(Some(iif));
        let r = self.kernel(what, prog, pkt, want);
        self.iif.set(None);
        r
    }

    /// A packet the program must leave to the kernel, untouched, under `want`
    /// (or that this kernel refuses to test-run at all; see [`test_run_accepts`]).
    pub(crate) fn kernel(&self, what: &str, prog: Prog, pkt: &[u8], want: DpPath) -> Result<()> {
        let run = self.try_run(prog, pkt).with_context(|| what.to_string())?;
        let Some((path, out)) = run else {
            eprintln!(
                "--  {:<16} {what:<48} refused by BPF_PROG_TEST_RUN",
                prog.name()
            );
            return Ok(());
        };
        ensure!(
            path == want && out.retval == TCX_NEXT,
            "{what}: {} counted under {} with verdict {}, expected {} with {TCX_NEXT}\n  in: {}",
            prog.name(),
            path.name(),
            out.retval,
            want.name(),
            hex(pkt)
        );
        eprintln!("ok  {:<16} {what:<48} -> {}", prog.name(), path.name());
        Ok(())
    }

    /// [`Self::kernel`], counted in the row of `family`.
    pub(crate) fn kernel_as(&self, input: Input, want: DpPath, family: DpFamily) -> Result<()> {
        let Input { what, prog, pkt } = input;
        self.kernel(what, prog, pkt, want)?;
        ensure!(
            self.family() == Some(family),
            "{what}: counted as {:?}, expected {}",
            self.family().map(DpFamily::name),
            family.name()
        );
        Ok(())
    }

    /// `pkt` run through `prog`: redirected, counted under `want` in the
    /// row of `family`, and out as `expected` makes it (with a valid IPv4
    /// header checksum; IPv6 has none).
    pub(crate) fn forwarded(
        &self,
        input: Input,
        want: DpPath,
        family: DpFamily,
        expected: impl FnOnce() -> Vec<u8>,
    ) -> Result<()> {
        let Input { what, prog, pkt } = input;
        let (path, out) = self.run(prog, pkt).with_context(|| what.to_string())?;
        ensure!(
            path == want && out.retval == TC_ACT_REDIRECT,
            "{what}: {} counted under {} with verdict {}, expected {} with {TC_ACT_REDIRECT}\n  in: {}",
            prog.name(),
            path.name(),
            out.retval,
            want.name(),
            hex(pkt)
        );
        ensure!(
            self.family() == Some(family),
            "{what}: counted as {:?}, expected {}",
            self.family(),
            family.name()
        );
        let expected = expected();
        ensure!(
            family != DpFamily::Ipv4 || ip_csum_ok(&out.data),
            "{what}: invalid IP checksum in {}",
            hex(&out.data)
        );
        ensure!(
            out.data == expected,
            "{what}: rewritten packet differs\n  want: {}\n  got:  {}",
            hex(&expected),
            hex(&out.data)
        );
        eprintln!("ok  {:<16} {what:<48} -> {}", prog.name(), path.name());
        Ok(())
    }

    /// A packet the program must forward under `want`, as a router would:
    /// new MACs, TTL one less, a valid checksum, nothing else changed.
    pub(crate) fn fast(&self, input: Input, want: DpPath, macs: ([u8; 6], [u8; 6])) -> Result<()> {
        let pkt = input.pkt;
        self.forwarded(input, want, DpFamily::Ipv4, || routed(pkt, macs))
    }
}

/// The family the Ethernet header at `off` of `frame` and the IP version
/// behind it declare (both must agree), as the counters split packets.
pub(crate) fn declared_family(frame: &[u8], off: usize) -> DpFamily {
    let Some(h) = frame.get(off + 12..off + 15) else {
        return DpFamily::Other;
    };
    match (u16::from_be_bytes([h[0], h[1]]), h[2] >> 4) {
        (0x0800, 4) => DpFamily::Ipv4,
        (0x86dd, 6) => DpFamily::Ipv6,
        _ => DpFamily::Other,
    }
}

/// What every run's family must satisfy, whatever the packet: from a pod or
/// `vxlan.1`, the frame's own family; on the underlay, the outer family
/// unless the program got as far as the inner packet of VXLAN (then the
/// inner one), which the paths before that point never are.
fn check_family(prog: Prog, pkt: &[u8], family: DpFamily, path: DpPath) -> Result<()> {
    let outer = declared_family(pkt, 0);
    let before_inner = matches!(
        path,
        DpPath::KernelNoConfig
            | DpPath::KernelUnderlayOther
            | DpPath::KernelDecapNotPeer
            | DpPath::KernelDecapHeader
            | DpPath::KernelDecapFragment
            | DpPath::FastDirectIn
    );
    let ok = match prog {
        Prog::FromUnderlay if !before_inner => {
            family == outer || family == declared_family(pkt, INNER - 14)
        }
        _ => family == outer,
    };
    ensure!(
        ok && (path != DpPath::KernelNotIpv4 || family == DpFamily::Other)
            && (!path.is_fast() || family != DpFamily::Other),
        "{}: counted as {} under {}, but the frame says {} (inner: {})\n  in: {}",
        prog.name(),
        family.name(),
        path.name(),
        outer.name(),
        declared_family(pkt, INNER - 14).name(),
        hex(pkt)
    );
    Ok(())
}

/// `frame` as a router forwards it: new MACs (dst, src), TTL one less, the
/// IP checksum fixed.
pub(crate) fn routed(frame: &[u8], macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[..6].copy_from_slice(&macs.0);
    f[6..12].copy_from_slice(&macs.1);
    f[TTL] -= 1;
    set_ip_csum(&mut f);
    f
}

/// Whether `BPF_PROG_TEST_RUN` builds an skb from `frame`. Linux 6.18 wants
/// an Ethernet header, and behind an IPv4 (IPv6) ethertype a
/// whole fixed IPv4 (IPv6) header; it refuses the rest with `EINVAL` before
/// running anything, so a frame cut inside the IPv4 header cannot be tried
/// on it. Frames this says yes to must run; the others may (older and newer
/// kernels differ), and then the usual checks apply.
pub(crate) fn test_run_accepts(frame: &[u8]) -> bool {
    let l3 = match frame.get(12..14) {
        Some([0x08, 0x00]) => 20,
        Some([0x86, 0xdd]) => 40,
        _ => 0,
    };
    frame.len() >= 14 + l3
}

/// What a redirected packet may differ in: the MACs, the TTL (one less) and
/// the IP checksum, which stays exactly as valid or invalid as it was; for
/// IPv6, the MACs and the hop limit (one less).
pub(crate) fn ensure_only_forwarding_rewrite(pkt: &[u8], out: &[u8]) -> Result<()> {
    ensure!(out.len() == pkt.len(), "redirect changed the length");
    if pkt.get(12..14) == Some(&ETH_P_IPV6.to_be_bytes()[..]) {
        const HOP: usize = IP + 7;
        for (i, (a, b)) in pkt.iter().zip(out).enumerate() {
            ensure!(
                a == b || i < 12 || i == HOP,
                "redirect changed byte {i}\n  in:  {}\n  out: {}",
                hex(pkt),
                hex(out)
            );
        }
        ensure!(
            out[HOP] == pkt[HOP].wrapping_sub(1),
            "hop limit not decremented"
        );
        return Ok(());
    }
    for (i, (a, b)) in pkt.iter().zip(out).enumerate() {
        ensure!(
            a == b || i < 12 || i == TTL || i == CSUM || i == CSUM + 1,
            "redirect changed byte {i}\n  in:  {}\n  out: {}",
            hex(pkt),
            hex(out)
        );
    }
    ensure!(out[TTL] == pkt[TTL].wrapping_sub(1), "TTL not decremented");
    ensure!(
        ip_csum_ok(out) == ip_csum_ok(pkt),
        "checksum validity changed"
    );
    Ok(())
}
