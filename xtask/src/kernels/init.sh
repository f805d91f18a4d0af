#!/bin/busybox sh
# PID 1 of a `cargo xtask kernels` guest (busybox-static initramfs).
#
# Mounts the 9p shares (the host's /usr and /etc, the kernel's own modules,
# the workspace at its host path) into a tmpfs chroot /r, so the host's
# glibc test binaries and tools run unchanged, then runs the script xtask
# wrote for this kernel inside it and powers off. Everything xtask parses
# is a line starting with MYCNI- on the serial console.

/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
up() { cut -d' ' -f1 /proc/uptime; }
echo "MYCNI-BOOT uptime=$(up)"

# A setup step that fails ends the run at once: a half-built chroot would
# only turn into confusing test failures.
die() {
    echo "MYCNI-ERROR $*"
    poweroff -f
    sleep 60
}
# mycni.<key>=<value> on the kernel command line: dotted, so the kernel
# keeps them out of init's environment and argv.
arg() { sed -n "s/.*mycni\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
WS=$(arg ws)
RUN=$(arg run)
[ -n "$WS" ] && [ -n "$RUN" ] || die "no mycni.ws= or mycni.run= on the command line"

# Only what mounting 9p needs, in dependency order (xtask resolved it from
# modules.dep, and decompressed them: busybox insmod takes plain .ko).
# Anything else loads on demand through the kernel's usermode helper.
while read -r m; do
    insmod "/$m" || die "insmod $m"
done </modules.load

R=/r
mkdir -p $R
# A mount point, not a directory of the initramfs: `ip netns exec` runs
# `mount --make-rslave /`, which fails on a root that is no mount.
mount -t tmpfs -o mode=755 root $R || die "tmpfs $R"
mkdir -p $R/usr $R/kernel $R$WS $R/proc $R/sys $R/dev $R/tmp $R/run $R/etc $R/var $R/root
# msize: 9p's default 8 KiB messages make paging in a 100 MB debug test
# binary crawl. cache=loose on the read-only shares: the host does not
# change them while the guest runs.
P9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$P9,ro,cache=loose" usr $R/usr || die "9p usr"
mount -t 9p -o "$P9,ro,cache=loose" kernel $R/kernel || die "9p kernel"
mount -t 9p -o "$P9" ws $R$WS || die "9p workspace"
for d in bin sbin lib lib64; do ln -s usr/$d $R/$d; done
mkdir -p $R/var/lib $R/var/log $R/var/tmp
ln -s ../run $R/var/run
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs shm $R/dev/shm
mount -t tmpfs -o mode=1777 tmp $R/tmp
mount -t tmpfs -o mode=755 run $R/run
mkdir -p $R/run/netns
mount -t bpf bpf $R/sys/fs/bpf || die "bpffs"
if [ -d $R/sys/fs/cgroup ]; then mount -t cgroup2 cgroup2 $R/sys/fs/cgroup; fi
if [ -d $R/sys/kernel/debug ]; then mount -t debugfs debugfs $R/sys/kernel/debug; fi
if [ -d $R/sys/kernel/tracing ]; then mount -t tracefs tracefs $R/sys/kernel/tracing; fi
hostname mycni-guest

# Module autoload (a vxlan link, an nftables `ct` rule, a qdisc) calls the
# usermode helper in the initramfs' root, where there is no kmod and no
# modules: hand the request to kmod's modprobe in the chroot, rooted at the
# kernel's own modules (modules.dep, .alias and .softdep by the host's
# depmod). busybox modprobe would resolve no alias and no softdep.
printf '#!/bin/busybox sh\nexec /bin/busybox chroot %s /usr/sbin/modprobe -d /kernel "$@"\n' $R >/bin/mycni-modprobe
chmod 755 /bin/mycni-modprobe
echo /bin/mycni-modprobe >/proc/sys/kernel/modprobe

# The host's /etc, writable through an overlay (its changes stay in the
# guest): /usr needs it (/etc/alternatives holds iptables and friends,
# /etc/ssl/certs the CAs the agent's Kubernetes client loads even for a
# local API server, /etc/services and /etc/protocols nft's names).
# Mounting overlay autoloads it through the helper above.
mkdir -p /hostetc /etcrw
mount -t 9p -o "$P9,ro,cache=loose" etc /hostetc || die "9p etc"
mount -t tmpfs -o mode=755 etcrw /etcrw
mkdir -p /etcrw/upper /etcrw/work
mount -t overlay -o lowerdir=/hostetc,upperdir=/etcrw/upper,workdir=/etcrw/work etc $R/etc ||
    die "overlay on $R/etc"

fact() { echo "MYCNI-FACT $1=$2"; }
has() { if [ -e "$1" ]; then echo yes; else echo no; fi; }
loaded() { if [ -d "/sys/module/$1" ]; then echo yes; else echo no; fi; }
fact uname "$(uname -r)"
fact btf_vmlinux "$(has /sys/kernel/btf/vmlinux)"
fact tcx_config "$(if grep -q '^CONFIG_NET_XGRESS=y' $R/kernel/boot/config-*; then echo y; else echo n; fi)"
# The agent under test must load conntrack itself (through autoload).
CT_START=$(loaded nf_conntrack)
fact conntrack_at_start "$CT_START"
echo "MYCNI-READY uptime=$(up)"

# env -i: init's environment is the kernel's (TERM=linux, HOME=/), nothing
# a test should see. MYCNI_LAB_TIME_SCALE: the lab's waits stretched for
# TCG's ~8x slower guest. RUST_BACKTRACE as the development machines set it: an
# anyhow error's backtrace is the only pointer to where a test's bare
# `os error 11` came from.
chroot $R /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin \
    HOME=/root TERM=dumb LANG=C.UTF-8 RUST_BACKTRACE=1 MYCNI_LAB_TIME_SCALE=8 /bin/sh "$RUN"
echo "MYCNI-RUN-DONE rc=$? uptime=$(up)"

# After the tests, so nothing here changes what they see: whether they
# (or the agent) made conntrack load, whether its BTF is there, and
# whether autoload works at all (an nftables ct rule in a throwaway
# namespace loads nf_conntrack if nothing did).
fact conntrack_after_tests "$(loaded nf_conntrack)"
fact conntrack "$CT_START/$(loaded nf_conntrack)"
C="chroot $R"
$C /usr/sbin/ip netns add mycni-kprobe
$C /usr/sbin/ip netns exec mycni-kprobe /usr/sbin/nft \
    'add table ip t; add chain ip t c { type filter hook output priority 0; }; add rule ip t c ct state established accept' >/dev/null 2>&1
$C /usr/sbin/ip netns exec mycni-kprobe /usr/sbin/ip link add vx0 type vxlan id 1 dstport 4789 >/dev/null 2>&1
fact autoload "conntrack=$(loaded nf_conntrack),vxlan=$(loaded vxlan)"
fact btf_nf_conntrack "$(has /sys/kernel/btf/nf_conntrack)"
$C /usr/sbin/ip netns del mycni-kprobe
echo "MYCNI-END uptime=$(up)"
poweroff -f
sleep 60
