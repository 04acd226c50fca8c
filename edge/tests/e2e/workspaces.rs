//! The coordinator's workspaces: approved per node in the edge config,
//! delivered in the node's config, checked by the node before it is ready
//! (and the job directories a crash left removed).

use std::time::Duration;

use crate::harness::*;

/// A node that cannot honour some of its catalog says which and why
/// before it is ready, serves the rest, and still serves runs.
#[test]
fn a_node_refuses_the_workspaces_it_cannot_honour_before_ready() {
    let dir = scratch("workspaces");
    std::fs::create_dir_all(dir.join("repo/.iop/job/crashed-req")).unwrap();
    // What an earlier run left: removed when this node first serves the root.
    std::fs::write(dir.join("repo/.iop/job/crashed-req/plan.md"), b"# old").unwrap();
    std::fs::write(dir.join("repo/user.txt"), b"mine").unwrap();
    std::fs::write(dir.join("a-file"), b"x").unwrap();
    let root = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let ws = |r: &str, host: &str, root: &str| {
        format!("[[nodes.workspaces]]\nref = \"{r}\"\nhost = \"{host}\"\nroot = \"{root}\"\noperations = [\"read\", \"list\"]\n")
    };
    let node = format!(
        "{}{}{}{}{}",
        mock_node("n1", 4, 0, 3, 0),
        ws("ok", "linux", &root("repo")),
        ws("gone", "linux", &root("missing")),
        ws("file", "linux", &root("a-file")),
        ws("mac", "darwin", &root("repo")),
    );
    let agent = "[[agents]]\nname = \"coder\"\nplan = \"m\"\nwork = \"m\"\nreview = \"m\"\nworkspaces = [\"ok\"]\n";
    let edge = Edge::start(&pool_config(&[node], &[mock_model("m", &["n1"], "")], agent));
    let node = edge.start_node("n1", "workers = 2");
    edge.wait_nodes_ready(1);
    let said = |log: &str, r: &str, reason: &str| {
        log.lines().any(|l| l.contains(&format!("workspace={r} ")) && l.contains(reason))
    };
    eventually(Duration::from_secs(10), "the edge logs each refusal", || {
        let log = edge.proc.log_text();
        said(&log, "gone", "ROOT_MISSING")
            && said(&log, "file", "ROOT_NOT_DIRECTORY")
            && said(&log, "mac", "HOST_MISMATCH")
    });
    let log = edge.proc.log_text();
    assert!(!log.contains("workspace=ok "), "the good workspace is not refused:\n{log}");
    // Once per node, not once per link.
    assert_eq!(log.matches("workspace=gone ").count(), 1, "{log}");
    // No path of the operator's in the refusals.
    assert!(!log.contains(&root("missing")), "{log}");
    eventually(Duration::from_secs(10), "the node names what it serves", || {
        node.log_text().lines().any(|l| l.contains("node ready") && l.contains("workspaces=[\"ok\"]"))
    });
    assert!(!dir.join("repo/.iop/job/crashed-req").exists(), "the leftover job is gone");
    assert_eq!(std::fs::read(dir.join("repo/user.txt")).unwrap(), b"mine");
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}
