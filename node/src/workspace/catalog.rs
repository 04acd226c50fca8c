//! The workspace catalog: each entry the edge approved for this node,
//! checked before ready (host, root present and a directory). An entry the
//! node cannot honour is refused by reason (never by path: a root is the
//! operator's, and stays out of logs and the wire back) and served by no
//! request. The job directories a crash left in a root are removed the
//! first time this process serves it.

use iop_core::wire::pb::{self, WorkspaceRefusalReason as Reason};

/// The workspaces this node serves.
#[derive(Debug, Default)]
pub struct Catalog {
    entries: Vec<pb::WorkspaceConfig>,
}

impl Catalog {
    /// The references served, in the edge's order.
    pub fn refs(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.workspace_ref.as_str()).collect()
    }

    /// The entries served, in the edge's order.
    pub fn entries(&self) -> &[pb::WorkspaceConfig] {
        &self.entries
    }
}

/// Checks `entries` against this host on the blocking thread (it looks at
/// the file system): the catalog of those that hold, and a refusal for
/// each other one, logged when `log` (one link of the node's says it).
pub async fn admit(entries: Vec<pb::WorkspaceConfig>, log: bool) -> (Catalog, Vec<pb::WorkspaceRefusal>) {
    if entries.is_empty() {
        return (Catalog::default(), Vec::new());
    }
    let refs: Vec<String> = entries.iter().map(|e| e.workspace_ref.clone()).collect();
    let checked = move || {
        let (catalog, refused) = check(entries, std::env::consts::OS, &|p| std::fs::metadata(p), log);
        clean_leftovers(catalog, refused, log)
    };
    match iop_core::rt::blocking::run_blocking(checked).await {
        Ok(checked) => checked,
        // The blocking thread is gone (shutting down): serve none.
        Err(_) => (Catalog::default(), refs.into_iter().map(|r| refusal(r, Reason::RootUnreadable)).collect()),
    }
}

/// Roots whose leftover job directories this process has removed.
static CLEANED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The first time this process serves a root, the job directories a crash
/// left there are removed (later registrations skip it: by then requests of
/// this process may own job directories). A root where that fails is
/// refused.
fn clean_leftovers(
    mut catalog: Catalog,
    mut refused: Vec<pb::WorkspaceRefusal>,
    log: bool,
) -> (Catalog, Vec<pb::WorkspaceRefusal>) {
    let Ok(mut cleaned) = CLEANED.lock() else { return (catalog, refused) };
    catalog.entries.retain(|e| {
        if cleaned.contains(&e.root) {
            return true;
        }
        let done = super::files::Root::open(&e.root).and_then(|root| super::jobs::cleanup_all(&root));
        match done {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(workspace = %e.workspace_ref, jobs = n, "job directories left by an earlier run removed");
                }
                cleaned.push(e.root.clone());
                true
            }
            Err(err) => {
                if log {
                    tracing::warn!(workspace = %e.workspace_ref, error = %err, "workspace refused: its leftover job directories could not be removed");
                }
                refused.push(refusal(e.workspace_ref.clone(), Reason::RootUnreadable));
                false
            }
        }
    });
    (catalog, refused)
}

fn refusal(workspace_ref: String, reason: Reason) -> pb::WorkspaceRefusal {
    pb::WorkspaceRefusal { workspace_ref, reason: reason as i32 }
}

/// The check itself, for host `os` (`std::env::consts::OS`), reading the
/// file system through `stat`.
fn check(
    entries: Vec<pb::WorkspaceConfig>,
    os: &str,
    stat: &dyn Fn(&str) -> std::io::Result<std::fs::Metadata>,
    log: bool,
) -> (Catalog, Vec<pb::WorkspaceRefusal>) {
    let mut catalog = Catalog::default();
    let mut refused = Vec::new();
    for e in entries {
        match refused_for(&e, os, stat) {
            None => catalog.entries.push(e),
            Some(reason) => {
                if log {
                    tracing::warn!(workspace = %e.workspace_ref, reason = reason.as_str_name(), "workspace refused: this node serves no request in it");
                }
                refused.push(refusal(e.workspace_ref, reason));
            }
        }
    }
    (catalog, refused)
}

fn refused_for(
    e: &pb::WorkspaceConfig,
    os: &str,
    stat: &dyn Fn(&str) -> std::io::Result<std::fs::Metadata>,
) -> Option<Reason> {
    if e.workspace_ref.is_empty() || !e.root.starts_with('/') || e.operations.is_empty() {
        return Some(Reason::Malformed);
    }
    // The executor resolves paths with Linux's openat2: other hosts have none.
    if os != "linux" {
        return Some(Reason::UnsupportedHost);
    }
    if pb::WorkspaceHost::try_from(e.host) != Ok(pb::WorkspaceHost::Linux) {
        return Some(Reason::HostMismatch);
    }
    match stat(&e.root) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(Reason::RootNotDirectory),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Some(Reason::RootMissing),
        Err(_) => Some(Reason::RootUnreadable),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn entry(r: &str, host: pb::WorkspaceHost, root: &str) -> pb::WorkspaceConfig {
        pb::WorkspaceConfig {
            workspace_ref: r.into(),
            host: host as i32,
            root: root.into(),
            operations: vec![pb::WorkspaceOperation::Read as i32],
            ..Default::default()
        }
    }

    #[test]
    fn each_entry_is_served_or_refused_for_its_reason() {
        let dir = std::env::temp_dir().join(format!("iop-ws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let (dir_s, file_s) = (dir.to_str().unwrap(), file.to_str().unwrap());
        let missing = dir.join("missing");
        let entries = vec![
            entry("ok", pb::WorkspaceHost::Linux, dir_s),
            entry("mac", pb::WorkspaceHost::Darwin, dir_s),
            entry("gone", pb::WorkspaceHost::Linux, missing.to_str().unwrap()),
            entry("file", pb::WorkspaceHost::Linux, file_s),
            entry("relative", pb::WorkspaceHost::Linux, "srv/x"),
        ];
        let stat = |p: &str| std::fs::metadata(p);
        let (catalog, refused) = check(entries.clone(), "linux", &stat, true);
        assert_eq!(catalog.refs(), ["ok"]);
        let got: Vec<(&str, Reason)> =
            refused.iter().map(|r| (r.workspace_ref.as_str(), Reason::try_from(r.reason).unwrap())).collect();
        assert_eq!(
            got,
            [
                ("mac", Reason::HostMismatch),
                ("gone", Reason::RootMissing),
                ("file", Reason::RootNotDirectory),
                ("relative", Reason::Malformed),
            ]
        );
        // On another host, nothing is served.
        let (catalog, refused) = check(entries, "macos", &stat, false);
        assert!(catalog.refs().is_empty());
        assert!(refused.iter().take(4).all(|r| r.reason == Reason::UnsupportedHost as i32));
        // An unreadable root (here: any error but NotFound).
        let denied = |_: &str| Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        let (_, refused) = check(vec![entry("x", pb::WorkspaceHost::Linux, "/x")], "linux", &denied, false);
        assert_eq!(refused[0].reason, Reason::RootUnreadable as i32);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_catalog_serves_nothing_and_refuses_nothing() {
        iop_core::rt::block_on_current(async {
            let (catalog, refused) = admit(Vec::new(), true).await;
            assert!(catalog.refs().is_empty() && refused.is_empty());
        })
        .unwrap();
    }
}
