//! What the netlink tests share: a namespace of their own, and short
//! constructors for the addresses they use.

use std::fs::File;
use std::net::Ipv4Addr;

use mycni_common::net::Cidr;

/// A fresh, empty network namespace, alive while the file is open.
pub fn netns() -> File {
    std::thread::spawn(|| {
        // SAFETY: unshare(2) moves only this thread, which ends right after.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            panic!(
                "unshare(CLONE_NEWNET): {} (the test needs root)",
                std::io::Error::last_os_error()
            );
        }
        File::open("/proc/thread-self/ns/net").expect("opening the new netns")
    })
    .join()
    .expect("netns thread")
}

pub fn v4(s: &str) -> Cidr<Ipv4Addr> {
    s.parse().expect("test CIDR")
}

pub fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}
