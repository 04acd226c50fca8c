//! TLS keys of both configs: `[http.tls]` and `[node_listener.tls]` on the
//! edge, `[edge_tls]` on the node. Paths are checked when the TLS material
//! is loaded ([`server_tls`], [`client_tls`]), with errors that name the key.

use std::path::{Path, PathBuf};

use super::{raw::RawTls, ConfigError};
use crate::net::tls::{self, ClientTls, Roots, ServerTls, TlsError};

/// A TLS listener's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM CA bundle client certificates must chain to (mutual TLS); only
    /// on the node listener.
    pub client_ca: Option<PathBuf>,
    /// Handshakes one address may start and hold.
    pub handshakes: TlsHandshakeLimits,
}

impl ListenerTls {
    /// Whether `other` names the same files (the limits may differ: they
    /// apply at once on a reload, the files only after a restart).
    pub fn same_files(&self, other: &ListenerTls) -> bool {
        (&self.cert, &self.key, &self.client_ca) == (&other.cert, &other.key, &other.client_ca)
    }
}

/// Per-address limits on a listener's TLS handshakes: each costs the edge
/// about a millisecond of CPU, before anything is authenticated. An address
/// is one IPv4 address or one IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsHandshakeLimits {
    /// Handshakes in progress at once (`max_handshakes_per_address`).
    pub concurrent: u32,
    /// Handshakes started per second, in bursts of as many
    /// (`handshakes_per_sec_per_address`).
    pub per_sec: u32,
}

/// `[http.tls]` defaults: room for a client pool behind one address.
pub const HTTP_TLS_HANDSHAKES: TlsHandshakeLimits = TlsHandshakeLimits { concurrent: 32, per_sec: 64 };
/// `[node_listener.tls]` defaults: a node opens one link per worker thread.
pub const NODE_TLS_HANDSHAKES: TlsHandshakeLimits = TlsHandshakeLimits { concurrent: 16, per_sec: 32 };
/// Largest accepted value of either limit.
pub const MAX_TLS_HANDSHAKE_LIMIT: u32 = 1_000_000;

/// How a node reaches its edge over TLS (`[edge_tls]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeTls {
    /// PEM CA bundle the edge's certificate must chain to; None = the
    /// system's roots.
    pub ca: Option<PathBuf>,
    /// The name the edge's certificate must be valid for (and SNI);
    /// default: the host of `edge`.
    pub server_name: Option<String>,
    /// The node's client certificate and key (mutual TLS, managed mode).
    pub identity: Option<(PathBuf, PathBuf)>,
}

fn path(key: String, value: Option<String>) -> Result<PathBuf, ConfigError> {
    match value {
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
        Some(_) => Err(ConfigError::key(key, "must be a file path")),
        None => Err(ConfigError::missing(key)),
    }
}

/// `[<section>]` of a listener; `client_ca` only where `allow_client_ca`;
/// handshake limits default to `defaults`.
pub(crate) fn listener(
    section: &str,
    raw: Option<RawTls>,
    allow_client_ca: bool,
    defaults: TlsHandshakeLimits,
) -> Result<Option<ListenerTls>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.server_name.is_some() {
        return Err(ConfigError::key(format!("{section}.server_name"), "is a key of the node's [edge_tls]"));
    }
    if raw.ca.is_some() {
        return Err(ConfigError::key(
            format!("{section}.ca"),
            "is a key of the node's [edge_tls]; a listener has `client_ca`",
        ));
    }
    let client_ca = match raw.client_ca {
        None => None,
        Some(_) if !allow_client_ca => {
            return Err(ConfigError::key(
                format!("{section}.client_ca"),
                "client certificates are asked for only on [node_listener.tls]",
            ))
        }
        v => Some(path(format!("{section}.client_ca"), v)?),
    };
    let handshakes = TlsHandshakeLimits {
        concurrent: super::raw::check::range_u32(
            &format!("{section}.max_handshakes_per_address"),
            raw.max_handshakes_per_address,
            defaults.concurrent,
            1,
            MAX_TLS_HANDSHAKE_LIMIT,
        )?,
        per_sec: super::raw::check::range_u32(
            &format!("{section}.handshakes_per_sec_per_address"),
            raw.handshakes_per_sec_per_address,
            defaults.per_sec,
            1,
            MAX_TLS_HANDSHAKE_LIMIT,
        )?,
    };
    Ok(Some(ListenerTls {
        cert: path(format!("{section}.cert"), raw.cert)?,
        key: path(format!("{section}.key"), raw.key)?,
        client_ca,
        handshakes,
    }))
}

/// The node's `[edge_tls]`.
pub(crate) fn edge(raw: Option<RawTls>) -> Result<Option<EdgeTls>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.client_ca.is_some() {
        return Err(ConfigError::key(
            "edge_tls.client_ca",
            "is a key of the edge's [node_listener.tls]; the node trusts `ca`",
        ));
    }
    for (key, value) in [
        ("max_handshakes_per_address", raw.max_handshakes_per_address),
        ("handshakes_per_sec_per_address", raw.handshakes_per_sec_per_address),
    ] {
        if value.is_some() {
            return Err(ConfigError::key(format!("edge_tls.{key}"), "is a key of the edge's listeners"));
        }
    }
    let identity = match (raw.cert, raw.key) {
        (None, None) => None,
        (cert, key) => Some((path("edge_tls.cert".into(), cert)?, path("edge_tls.key".into(), key)?)),
    };
    let ca = match raw.ca {
        None => None,
        v => Some(path("edge_tls.ca".into(), v)?),
    };
    let server_name = match raw.server_name {
        Some(n) if n.is_empty() => return Err(ConfigError::key("edge_tls.server_name", "must not be empty")),
        n => n,
    };
    Ok(Some(EdgeTls { ca, server_name, identity }))
}

/// Names the key of `files` an error is about.
fn keyed(err: TlsError, files: &[(String, &Path)]) -> ConfigError {
    let about = |p: &Path| match &err {
        TlsError::Read { path, .. } => path == p,
        TlsError::Missing { what, .. } | TlsError::Pem { what, .. } | TlsError::Rustls { what, .. } => {
            what.starts_with(&p.display().to_string())
        }
        TlsError::NoSystemRoots(_) => false,
    };
    // A mismatch names the cert and the key: the key is the one to fix.
    let mut hit: Option<&(String, &Path)> = files.iter().find(|(_, p)| about(p));
    if let TlsError::Rustls { .. } = &err {
        hit = files.iter().find(|(k, _)| k.ends_with(".key")).or(hit);
    }
    match hit {
        Some((key, p)) => ConfigError::invalid(key.clone(), p.display(), err.to_string()),
        None => ConfigError::key(files.first().map_or_else(String::new, |(k, _)| k.clone()), err.to_string()),
    }
}

/// Loads a listener's TLS material (`section` names its keys in errors).
pub fn server_tls(section: &str, t: &ListenerTls, alpn: &[u8]) -> Result<ServerTls, ConfigError> {
    let mut files = vec![(format!("{section}.cert"), t.cert.as_path()), (format!("{section}.key"), t.key.as_path())];
    if let Some(ca) = &t.client_ca {
        files.push((format!("{section}.client_ca"), ca.as_path()));
    }
    ServerTls::new(&t.cert, &t.key, t.client_ca.as_deref(), alpn).map_err(|e| keyed(e, &files))
}

/// Loads the node's TLS client for its edge link.
pub fn client_tls(t: &EdgeTls) -> Result<ClientTls, ConfigError> {
    let roots = match &t.ca {
        None => Roots::System,
        Some(ca) => Roots::Bundle(tls::read_certs(ca).map_err(|e| keyed(e, &[("edge_tls.ca".into(), ca.as_path())]))?),
    };
    let identity = t.identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let mut files = Vec::new();
    if let Some((c, k)) = &t.identity {
        files.push(("edge_tls.cert".to_owned(), c.as_path()));
        files.push(("edge_tls.key".to_owned(), k.as_path()));
    }
    ClientTls::new(&roots, identity, tls::ALPN_LINK).map_err(|e| match e {
        TlsError::NoSystemRoots(_) => ConfigError::key("edge_tls.ca", format!("{e}; set edge_tls.ca to a CA bundle")),
        e => keyed(e, &files),
    })
}
