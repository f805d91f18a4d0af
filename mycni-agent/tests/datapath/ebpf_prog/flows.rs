//! Real flows, so that conntrack holds entries the programs can find.

use super::*;

pub(crate) fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    }
}

/// `connect` from a chosen source address (std cannot bind before connect).
pub(crate) fn tcp_connect_from(src: Ipv4Addr, dst: SocketAddrV4) -> Result<TcpStream> {
    let local = sockaddr(SocketAddrV4::new(src, 0));
    connect_from(libc::AF_INET, &local, &sockaddr(dst), src, dst)
}

/// [`tcp_connect_from`] for either family: `local` and `remote` are that
/// family's `sockaddr_in` or `sockaddr_in6` of `domain`; `src` and `dst`
/// name them in errors.
pub(crate) fn connect_from<S>(
    domain: libc::c_int,
    local: &S,
    remote: &S,
    src: impl std::fmt::Display,
    dst: impl std::fmt::Display,
) -> Result<TcpStream> {
    // SAFETY: plain socket(2); the fd is owned right after.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        bail!("socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<S>() as libc::socklen_t;
    // SAFETY: both addresses are valid for `len` bytes; the kernel reads
    // them as the `domain`'s sockaddr.
    unsafe {
        if libc::bind(fd, std::ptr::from_ref(local).cast(), len) != 0 {
            bail!("bind {src}: {}", std::io::Error::last_os_error());
        }
        if libc::connect(fd, std::ptr::from_ref(remote).cast(), len) != 0 {
            bail!("connect {dst}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(TcpStream::from(sock))
}

pub(crate) fn v4(a: std::net::SocketAddr) -> Result<SocketAddrV4> {
    match a {
        std::net::SocketAddr::V4(a) => Ok(a),
        std::net::SocketAddr::V6(_) => bail!("not IPv4: {a}"),
    }
}

/// An open TCP connection; its conntrack entry is ESTABLISHED while both
/// ends are open.
pub(crate) struct TcpConn {
    pub(crate) _client: TcpStream,
    pub(crate) _server: TcpStream,
    /// Client to server as the client sent it (before any DNAT).
    pub(crate) flow: Flow,
    /// Server to client as the server sent it (after DNAT, its reply tuple).
    pub(crate) reply: Flow,
}

pub(crate) fn tcp_conn(
    src: Ipv4Addr,
    dst: SocketAddrV4,
    listener: &TcpListener,
) -> Result<TcpConn> {
    let client = tcp_connect_from(src, dst)?;
    let (server, _) = listener.accept()?;
    let flow = Flow {
        src: v4(client.local_addr()?)?,
        dst,
    };
    let reply = Flow {
        src: v4(server.local_addr()?)?,
        dst: v4(server.peer_addr()?)?,
    };
    Ok(TcpConn {
        _client: client,
        _server: server,
        flow,
        reply,
    })
}

/// This namespace's conntrack line for `flow` (original direction).
pub(crate) fn ct_line(flow: Flow) -> Result<String> {
    // thread-self: the namespace of this thread, not of the process.
    let table = std::fs::read_to_string("/proc/thread-self/net/nf_conntrack")?;
    let key = format!(
        "src={} dst={} sport={} dport={} ",
        flow.src.ip(),
        flow.dst.ip(),
        flow.src.port(),
        flow.dst.port()
    );
    table
        .lines()
        .find(|l| l.contains(&key))
        .map(str::to_string)
        .with_context(|| format!("no conntrack entry for {flow:?} in:\n{table}"))
}

pub(crate) fn ensure_ct(flow: Flow, marks: &[&str]) -> Result<()> {
    let line = ct_line(flow)?;
    for m in marks {
        ensure!(line.contains(m), "conntrack entry lacks {m}: {line}");
    }
    Ok(())
}

/// A UDP exchange between two bound sockets, both kept open.
pub(crate) struct UdpPair {
    pub(crate) a: UdpSocket,
    pub(crate) b: UdpSocket,
    pub(crate) flow: Flow,
}

impl UdpPair {
    pub(crate) fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Result<Self> {
        let a = UdpSocket::bind(SocketAddrV4::new(src, 0))?;
        let b = UdpSocket::bind(SocketAddrV4::new(dst, 0))?;
        a.connect(b.local_addr()?)?;
        b.connect(a.local_addr()?)?;
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
        }
        let flow = Flow {
            src: v4(a.local_addr()?)?,
            dst: v4(b.local_addr()?)?,
        };
        Ok(Self { a, b, flow })
    }

    /// One datagram a -> b, and with `reply` one b -> a.
    pub(crate) fn exchange(&self, reply: bool) -> Result<()> {
        let mut buf = [0u8; 16];
        self.a.send(b"ping")?;
        self.b.recv(&mut buf)?;
        if reply {
            self.b.send(b"pong")?;
            self.a.recv(&mut buf)?;
        }
        Ok(())
    }
}
