//! A throwaway CA and the certificates the TLS tests need, as PEM files,
//! and a blocking TLS client that trusts the CA.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use crate::harness::scratch;

pub struct Pki {
    pub ca: PathBuf,
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as files.
#[derive(Clone)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Leaf {
    /// The leaf certificate's DER (to tell two apart).
    pub fn der(&self) -> Vec<u8> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        CertificateDer::from_pem_file(&self.cert).unwrap().to_vec()
    }
}

impl Pki {
    pub fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        params.distinguished_name.push(rcgen::DnType::CommonName, "iop test CA");
        let key = KeyPair::generate().unwrap();
        let ca_pem = params.self_signed(&key).unwrap().pem();
        let ca = scratch("ca.pem");
        std::fs::write(&ca, &ca_pem).unwrap();
        Pki { ca, ca_pem, issuer: Issuer::new(params, key) }
    }

    /// A certificate valid now for `names` (DNS names or IP addresses).
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |_| {})
    }

    /// A certificate for `names` that expired yesterday.
    pub fn expired_leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |p| {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        })
    }

    fn leaf_with(&self, names: &[&str], edit: impl FnOnce(&mut CertificateParams)) -> Leaf {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        edit(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let leaf = Leaf { cert: scratch("leaf.pem"), key: scratch("leaf.key") };
        std::fs::write(&leaf.cert, cert.pem()).unwrap();
        std::fs::write(&leaf.key, key.serialize_pem()).unwrap();
        leaf
    }

    /// A rustls client config trusting this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(cfg)
    }
}

/// A blocking TLS connection to `addr` as `name`, trusting `pki`.
pub type TlsConn = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

pub fn connect(pki: &Pki, addr: SocketAddr, name: &str) -> std::io::Result<TlsConn> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let conn = rustls::ClientConnection::new(pki.client_config(b"http/1.1"), server).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    // Drive the handshake now, so its errors show here.
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

/// Sends one request on `s` and reads the whole response (the server
/// closes after it: `connection: close`).
pub fn https_request(s: &mut TlsConn, method: &str, path: &str, body: &str) -> crate::harness::Response {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // The edge closes its side without close_notify after `connection: close`.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("reading the response: {e}"),
        }
    }
    crate::harness::parse_response(&raw)
}
