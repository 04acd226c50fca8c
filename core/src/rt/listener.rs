//! Per-core listeners sharing one port through `SO_REUSEPORT`.

use std::{
    io,
    net::SocketAddr,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, Socket, Type};

/// How long a fixed port may stay busy before binding gives up: the
/// listeners of a process that just died can outlive it briefly (io_uring
/// tears its ring down asynchronously), and a quick restart must wait for them.
const PORT_BUSY_WAIT: Duration = Duration::from_secs(3);

/// Binds `count` listeners on `addr` with `SO_REUSEPORT`, so the kernel
/// spreads connections over the cores. With port 0 the first bind picks the
/// port and the rest join it. Fails when something listens on a fixed port
/// for longer than a few seconds (reuse_port would otherwise silently share
/// it with a stale server, which would then swallow connections). Blocks:
/// call it before the reactors start.
pub fn bind_reuseport(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    if addr.port() != 0 {
        // A plain bind fails if any socket holds the port, ours included.
        let deadline = Instant::now() + PORT_BUSY_WAIT;
        loop {
            let probe = new_socket(addr)?;
            match probe.bind(&addr.into()) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))),
            }
        }
    }
    let mut out = Vec::with_capacity(count.max(1));
    let mut bound = addr;
    for _ in 0..count.max(1) {
        let s = new_socket(bound)?;
        s.set_reuse_port(true)?;
        s.bind(&bound.into()).map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {bound}: {e}")))?;
        s.listen(1024)?;
        s.set_nonblocking(true)?;
        let l: std::net::TcpListener = s.into();
        bound = l.local_addr()?;
        out.push(l);
    }
    Ok(out)
}

fn new_socket(addr: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    Ok(s)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn port_zero_shares_one_port() {
        let ls = bind_reuseport("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let port = ls[0].local_addr().unwrap().port();
        assert!(ls.iter().all(|l| l.local_addr().unwrap().port() == port));
    }

    #[test]
    fn fixed_port_in_use_is_refused() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        assert!(bind_reuseport(addr, 2).is_err());
    }
}
