//! TLS configuration (rustls on ring): a server identity that can be
//! replaced while the listener runs, optional client-certificate
//! verification against a CA (the node link's mutual TLS), and client
//! configs that trust the system's roots or a given CA bundle.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use monoio::net::TcpStream;
use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName},
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
    ClientConfig, RootCertStore, ServerConfig,
};
use rustls_pki_types::pem::PemObject;

use super::stream::{Stream, TlsStream};

/// ALPN of the client-facing HTTP listener and of HTTPS upstreams.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";
/// ALPN of the edge↔node link.
pub const ALPN_LINK: &[u8] = b"iop-link/1";

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file (or bundle) holds nothing of what it should.
    #[error("{what} holds no PEM {expected}")]
    Missing {
        /// The file, or what the bundle came with.
        what: String,
        /// "certificate", "private key".
        expected: &'static str,
    },
    /// PEM that does not parse.
    #[error("{what}: {reason}")]
    Pem {
        /// The file, or what the bundle came with.
        what: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the material (a key that does not match its
    /// certificate, a CA that is not one).
    #[error("{what}: {source}")]
    Rustls {
        /// What was being set up.
        what: String,
        /// Why.
        source: rustls::Error,
    },
    /// The system's trusted roots could not be loaded.
    #[error("no system roots: {0}")]
    NoSystemRoots(String),
}

/// The crypto provider every config is built with (ring: no aws-lc-rs).
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone()
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

/// The certificates of a PEM bundle; `what` names it in errors.
pub fn parse_certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { what: what.to_owned(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Missing { what: what.to_owned(), expected: "certificate" });
    }
    Ok(certs)
}

/// The certificates of a PEM file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(&read_file(path)?, &path.display().to_string())
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_file(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            TlsError::Missing { what: path.display().to_string(), expected: "private key" }
        }
        e => TlsError::Pem { what: path.display().to_string(), reason: e.to_string() },
    })
}

/// A certificate chain and its key, checked to belong together.
fn certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs(cert)?;
    let key_der = read_key(key)?;
    let what = format!("{} with {}", cert.display(), key.display());
    CertifiedKey::from_der(chain, key_der, &provider())
        .map(Arc::new)
        .map_err(|source| TlsError::Rustls { what, source })
}

/// A trust store of the certificates of a PEM bundle.
pub fn root_store(certs: Vec<CertificateDer<'static>>, what: &str) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|source| TlsError::Rustls { what: what.to_owned(), source })?;
    }
    Ok(Arc::new(roots))
}

/// The server certificate handed to each new handshake; replaced by
/// [`ServerTls::reload`] (connections already open keep theirs).
#[derive(Debug)]
struct ReloadableCert {
    current: parking_lot::RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

/// A TLS listener's configuration: certificate and key files (reloadable)
/// and, for mutual TLS, the CA client certificates must chain to.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    cert: Arc<ReloadableCert>,
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl ServerTls {
    /// Loads `cert` and `key` (PEM files); with `client_ca`, every client
    /// must present a certificate that chains to it. `alpn`: the protocol
    /// offered.
    pub fn new(cert: &Path, key: &Path, client_ca: Option<&Path>, alpn: &[u8]) -> Result<Self, TlsError> {
        let resolver = Arc::new(ReloadableCert { current: parking_lot::RwLock::new(certified_key(cert, key)?) });
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls { what: "TLS versions".into(), source })?;
        let builder = match client_ca {
            Some(ca) => {
                let what = ca.display().to_string();
                let roots = root_store(read_certs(ca)?, &what)?;
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(|e| TlsError::Pem { what, reason: e.to_string() })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(Self { config: Arc::new(config), cert: resolver, cert_path: cert.to_owned(), key_path: key.to_owned() })
    }

    /// Reads the certificate and key files again; new handshakes use them.
    /// On error the current ones stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = certified_key(&self.cert_path, &self.key_path)?;
        *self.cert.current.write() = fresh;
        Ok(())
    }

    /// The leaf certificate new handshakes present.
    pub fn current_certificate(&self) -> Option<CertificateDer<'static>> {
        self.cert.current.read().cert.first().cloned()
    }

    /// Runs the server side of a handshake on `tcp` (the caller bounds it
    /// in time). A peer that speaks anything but TLS fails here.
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<Stream> {
        let conn = rustls::ServerConnection::new(self.config.clone()).map_err(std::io::Error::other)?;
        Ok(Stream::Tls(Box::new(TlsStream::handshake(tcp, conn.into()).await?)))
    }
}

/// Whom a TLS client trusts.
#[derive(Debug, Clone)]
pub enum Roots {
    /// The system's trusted roots ([`load_system_roots`]).
    System,
    /// Exactly these CA certificates.
    Bundle(Vec<CertificateDer<'static>>),
}

static SYSTEM_ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();

/// Loads the system's trusted roots once (file reads: call it at startup,
/// before any reactor runs). Later calls return the same result.
pub fn load_system_roots() -> Result<Arc<RootCertStore>, TlsError> {
    SYSTEM_ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found.errors.first().map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(why);
            }
            Ok(Arc::new(roots))
        })
        .clone()
        .map_err(TlsError::NoSystemRoots)
}

/// A TLS client's configuration.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
}

impl ClientTls {
    /// Trusting `roots`, offering `alpn`, and presenting `identity` (a
    /// certificate chain and its key) when the server asks for one.
    pub fn new(roots: &Roots, identity: Option<(&Path, &Path)>, alpn: &[u8]) -> Result<Self, TlsError> {
        let store = match roots {
            Roots::System => load_system_roots()?,
            Roots::Bundle(certs) => root_store(certs.clone(), "the CA bundle")?,
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls { what: "TLS versions".into(), source })?
            .with_root_certificates(store);
        let mut config = match identity {
            Some((cert, key)) => {
                let what = format!("{} with {}", cert.display(), key.display());
                builder
                    .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
                    .map_err(|source| TlsError::Rustls { what, source })?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(Self { config: Arc::new(config) })
    }

    /// Runs the client side of a handshake on `tcp` with `server_name` (a
    /// DNS name or an IP address) as SNI and the name the server's
    /// certificate must be valid for. The caller bounds it in time.
    pub async fn connect(&self, tcp: TcpStream, server_name: &str) -> std::io::Result<Stream> {
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a valid TLS server name"))?;
        let conn = rustls::ClientConnection::new(self.config.clone(), name).map_err(std::io::Error::other)?;
        Ok(Stream::Tls(Box::new(TlsStream::handshake(tcp, conn.into()).await?)))
    }
}

/// Whether `cert` (a verified client certificate) is issued for the
/// workload `id`: the id as a DNS name among its subject alternative names.
pub fn names_identity(cert: &CertificateDer<'_>, id: &str) -> bool {
    let Ok(name) = ServerName::try_from(id) else { return false };
    let Ok(parsed) = rustls::server::ParsedCertificate::try_from(cert) else { return false };
    rustls::client::verify_server_name(&parsed, &name).is_ok()
}
