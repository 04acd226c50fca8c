#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use bytes::Bytes;
use monoio::{
    io::{AsyncReadRent, AsyncReadRentExt, AsyncWriteRent, AsyncWriteRentExt},
    net::{TcpListener, TcpStream},
};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use super::tls::{ClientTls, Roots, ServerTls, ALPN_HTTP1};
use crate::rt::gather::Gather;

/// A CA and certificates it signs, written to a temporary directory.
struct Pki {
    dir: PathBuf,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("iop-net-tests-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap();
        let pki = Self { dir, ca_pem: ca.pem(), issuer: Issuer::new(params, key) };
        std::fs::write(pki.ca(), &pki.ca_pem).unwrap();
        pki
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A leaf for `names`, as (cert, key) files named after `file`.
    fn leaf(&self, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (self.dir.join(format!("{file}.pem")), self.dir.join(format!("{file}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    fn roots(&self) -> Roots {
        Roots::Bundle(super::tls::parse_certs(self.ca_pem.as_bytes(), "test CA").unwrap())
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server(pki: &Pki, client_ca: Option<&Path>) -> ServerTls {
    let (c, k) = pki.leaf("server", &["localhost", "127.0.0.1"]);
    ServerTls::new(&c, &k, client_ca, ALPN_HTTP1).unwrap()
}

/// Accepts one connection on a fresh listener and hands it to `serve`;
/// returns the address.
fn listen() -> (TcpListener, std::net::SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

async fn read_to_end(s: &mut super::ReadHalf) -> Vec<u8> {
    let mut got = Vec::new();
    loop {
        let (r, buf) = monoio::io::AsyncReadRent::read(s, Vec::with_capacity(8192)).await;
        if r.unwrap() == 0 {
            return got;
        }
        got.extend_from_slice(&buf);
    }
}

#[test]
fn split_halves_carry_both_directions_at_once_and_vectored_writes() {
    let pki = Pki::new("echo");
    let tls = server(&pki, None);
    let client = ClientTls::new(&pki.roots(), None, ALPN_HTTP1).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let expected = big.clone();
    crate::rt::block_on_current(async move {
        let (l, addr) = listen();
        let server = monoio::spawn(async move {
            let (tcp, _) = l.accept().await.unwrap();
            let s = tls.accept(tcp).await.unwrap();
            assert_eq!(s.alpn_protocol().as_deref(), Some(ALPN_HTTP1));
            let (mut rd, mut wr) = s.into_split();
            // Echo while reading: a read stays posted while writes go out.
            let echo = monoio::spawn(async move {
                let got = read_to_end(&mut rd).await;
                got.len()
            });
            let mut g = Gather::new();
            for i in 0..200 {
                g.put_slice(format!("<{i}>").as_bytes());
                g.push(Bytes::from(vec![b'x'; 1000]));
            }
            g.write_to(&mut wr).await.unwrap();
            wr.shutdown().await.unwrap();
            echo.await
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let s = client.connect(tcp, "localhost").await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let writer = monoio::spawn(async move {
            let (r, _) = wr.write_all(big).await;
            r.unwrap();
            wr.shutdown().await.unwrap();
        });
        let got = read_to_end(&mut rd).await;
        writer.await;
        let mut want = Vec::new();
        for i in 0..200 {
            want.extend_from_slice(format!("<{i}>").as_bytes());
            want.extend_from_slice(&[b'x'; 1000]);
        }
        assert_eq!(got, want);
        assert_eq!(server.await, expected.len());
    })
    .unwrap();
}

#[test]
fn plain_bytes_on_a_tls_port_fail_the_handshake() {
    let pki = Pki::new("plain");
    let tls = server(&pki, None);
    crate::rt::block_on_current(async move {
        let (l, addr) = listen();
        let server = monoio::spawn(async move {
            let (tcp, _) = l.accept().await.unwrap();
            tls.accept(tcp).await.err().map(|e| e.kind())
        });
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let (r, _) = tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n".to_vec()).await;
        r.unwrap();
        assert_eq!(server.await, Some(std::io::ErrorKind::InvalidData));
        // No HTTP answer: at most a TLS alert, then the end.
        let (r, buf) = tcp.read_exact(vec![0u8; 1]).await;
        if r.is_ok() {
            assert_eq!(buf[0], 0x15, "a TLS alert record");
        }
    })
    .unwrap();
}

#[test]
fn a_client_refuses_a_server_of_another_ca_or_name() {
    let pki = Pki::new("wrongca");
    let other = Pki::new("wrongca-other");
    for (roots, name) in [(other.roots(), "localhost"), (pki.roots(), "elsewhere.example")] {
        let tls = server(&pki, None);
        let client = ClientTls::new(&roots, None, ALPN_HTTP1).unwrap();
        crate::rt::block_on_current(async move {
            let (l, addr) = listen();
            let server = monoio::spawn(async move {
                let (tcp, _) = l.accept().await.unwrap();
                tls.accept(tcp).await.is_ok()
            });
            let tcp = TcpStream::connect(addr).await.unwrap();
            let Err(err) = client.connect(tcp, name).await else { panic!("refused") };
            assert!(err.to_string().contains("certificate"), "{err}");
            assert!(!server.await);
        })
        .unwrap();
    }
}

#[test]
fn mutual_tls_needs_a_client_certificate_of_its_ca() {
    let pki = Pki::new("mtls");
    let other = Pki::new("mtls-other");
    let (good_c, good_k) = pki.leaf("client", &["n1"]);
    let (bad_c, bad_k) = other.leaf("client", &["n1"]);
    let cases: [(Option<(&Path, &Path)>, bool); 3] =
        [(Some((&good_c, &good_k)), true), (Some((&bad_c, &bad_k)), false), (None, false)];
    for (identity, ok) in cases {
        let tls = server(&pki, Some(&pki.ca()));
        let client = ClientTls::new(&pki.roots(), identity, ALPN_HTTP1).unwrap();
        crate::rt::block_on_current(async move {
            let (l, addr) = listen();
            let server = monoio::spawn(async move {
                let (tcp, _) = l.accept().await.unwrap();
                tls.accept(tcp).await.ok().and_then(|s| s.peer_certificates()).map(|c| c.len())
            });
            let tcp = TcpStream::connect(addr).await.unwrap();
            // TLS 1.3: the client finishes before the server checks its
            // certificate; the refusal shows at the server.
            let _ = client.connect(tcp, "localhost").await;
            assert_eq!(server.await.is_some(), ok);
        })
        .unwrap();
    }
}

#[test]
fn reload_changes_the_certificate_of_new_handshakes_only() {
    let pki = Pki::new("reload");
    let (c, k) = pki.leaf("server", &["localhost"]);
    let tls = ServerTls::new(&c, &k, None, ALPN_HTTP1).unwrap();
    let first = tls.current_certificate().unwrap();
    // A broken file is refused and the current certificate stays.
    std::fs::write(&c, "not pem").unwrap();
    assert!(tls.reload().is_err());
    assert_eq!(tls.current_certificate().unwrap(), first);
    let (c2, k2) = pki.leaf("server2", &["localhost"]);
    std::fs::copy(&c2, &c).unwrap();
    std::fs::copy(&k2, &k).unwrap();
    tls.reload().unwrap();
    assert_ne!(tls.current_certificate().unwrap(), first);
    let client = ClientTls::new(&pki.roots(), None, ALPN_HTTP1).unwrap();
    crate::rt::block_on_current(async move {
        let (l, addr) = listen();
        let server = monoio::spawn(async move {
            let (tcp, _) = l.accept().await.unwrap();
            tls.accept(tcp).await.is_ok()
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let s = client.connect(tcp, "localhost").await.unwrap();
        let seen = s.peer_certificates().unwrap();
        assert_ne!(seen[0], first);
        assert!(server.await);
    })
    .unwrap();
}

#[test]
fn a_tls_stream_moves_between_runtimes_with_what_it_had_read() {
    let pki = Pki::new("detach");
    let tls = server(&pki, None);
    let client = ClientTls::new(&pki.roots(), None, ALPN_HTTP1).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        crate::rt::block_on_current(async move {
            let (l, addr) = listen();
            tx.send(addr).unwrap();
            let (tcp, _) = l.accept().await.unwrap();
            let mut s = tls.accept(tcp).await.unwrap();
            // Read a little; the rest of what arrived stays buffered.
            let (r, buf) = s.read_exact(vec![0u8; 5]).await;
            r.unwrap();
            assert_eq!(&buf, b"hello");
            s.detach().unwrap()
        })
        .unwrap()
    });
    let addr = rx.recv().unwrap();
    crate::rt::block_on_current(async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut s = client.connect(tcp, "127.0.0.1").await.unwrap();
        let (r, _) = s.write_all(b"hello world".to_vec()).await;
        r.unwrap();
        let detached = server.join().unwrap();
        let adopted = std::thread::spawn(move || {
            crate::rt::block_on_current(async move {
                let mut s = detached.adopt().unwrap();
                let (r, buf) = s.read_exact(vec![0u8; 6]).await;
                r.unwrap();
                let (w, _) = s.write_all(buf.clone()).await;
                w.unwrap();
                s.shutdown().await.unwrap();
                buf
            })
            .unwrap()
        });
        let (r, echoed) = s.read_exact(vec![0u8; 6]).await;
        r.unwrap();
        assert_eq!(&echoed, b" world");
        assert_eq!(&adopted.join().unwrap(), b" world");
    })
    .unwrap();
}

/// Asks `idle_and_open` until it says no (what the peer did takes a moment
/// to arrive), for at most 5 s.
fn until_unusable(s: &super::Stream) -> bool {
    for _ in 0..5000 {
        if !s.idle_and_open() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

#[test]
fn an_idle_connection_is_usable_until_its_peer_closes_or_speaks() {
    crate::rt::block_on_current(async {
        for peer_does in ["close", "speak", "reset"] {
            // The peer is a plain socket: what it does happens at once.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let s = super::Stream::Plain(TcpStream::connect(l.local_addr().unwrap()).await.unwrap());
            let (mut peer, _) = l.accept().unwrap();
            assert!(s.idle_and_open(), "{peer_does}: open and quiet");
            assert!(s.idle_and_open(), "{peer_does}: asking consumes nothing");
            match peer_does {
                "close" => peer.shutdown(std::net::Shutdown::Write).unwrap(),
                "speak" => std::io::Write::write_all(&mut peer, b"late").unwrap(),
                _ => {
                    // A zero linger makes the close a reset.
                    socket2::SockRef::from(&peer).set_linger(Some(std::time::Duration::ZERO)).unwrap();
                    drop(peer);
                }
            }
            assert!(until_unusable(&s), "{peer_does}");
        }
    })
    .unwrap();
}

#[test]
fn an_idle_tls_connection_is_unusable_once_its_peer_closes() {
    let pki = Pki::new("idle");
    let tls = server(&pki, None);
    let client = ClientTls::new(&pki.roots(), None, ALPN_HTTP1).unwrap();
    crate::rt::block_on_current(async move {
        let (l, addr) = listen();
        let server = monoio::spawn(async move {
            let (tcp, _) = l.accept().await.unwrap();
            let mut s = tls.accept(tcp).await.unwrap();
            // The client's word that it looked while the connection was quiet.
            let (r, _) = s.read_exact(vec![0u8; 1]).await;
            r.unwrap();
            s.shutdown().await.unwrap();
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut s = client.connect(tcp, "localhost").await.unwrap();
        assert!(s.idle_and_open());
        let (r, _) = s.write_all(b"x".to_vec()).await;
        r.unwrap();
        server.await;
        assert!(until_unusable(&s));
    })
    .unwrap();
}

#[test]
fn a_half_holds_its_buffer_once_while_it_waits() {
    // Under every open stream: a write (a relay's) and a posted read (its
    // disconnect watch). Each is the arm's own future, which holds the
    // buffer; an `async fn` over both arms held it a second time.
    crate::rt::block_on_current(async {
        let (l, addr) = listen();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = l.accept().await.unwrap();
        let (mut rd, mut wr) = super::Stream::Plain(tcp).into_split();
        let plain_write = std::mem::size_of_val(&client.write(Vec::<u8>::new()));
        let plain_read = std::mem::size_of_val(&client.read(bytes::BytesMut::new()));
        assert!(std::mem::size_of_val(&wr.write(Vec::<u8>::new())) <= plain_write + 8);
        assert!(std::mem::size_of_val(&rd.read(bytes::BytesMut::new())) <= plain_read + 8);
        // A gathered write: the write's state (its list 32 bytes larger
        // than a `Vec<u8>`), the arm, two references and a count. It was
        // 384 bytes when the list was held three times.
        let mut g = Gather::new();
        assert!(std::mem::size_of_val(&g.write_to(&mut wr)) <= plain_write + 96);
    })
    .unwrap();
}
