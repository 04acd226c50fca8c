//! Where the reactor threads run: wherever the kernel places them by
//! default, on core `i mod cores` with `pin_workers` (DESIGN.md, "Pinning").

use crate::harness::*;

/// The CPUs a thread may run on, as the kernel lists them.
fn allowed_cpus(status: &str) -> String {
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list").trim().to_owned()
}

/// The reactor threads of `pid` (named `{prefix}{index}`): index and allowed CPUs.
fn reactors(pid: u32, prefix: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("threads") {
        let dir = task.expect("thread").path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let Some(index) = name.trim().strip_prefix(prefix).and_then(|i| i.parse().ok()) else { continue };
        out.push((index, allowed_cpus(&std::fs::read_to_string(dir.join("status")).expect("status"))));
    }
    out.sort();
    out
}

#[test]
fn reactors_are_placed_by_the_kernel_unless_pinned() {
    let ours = allowed_cpus(&std::fs::read_to_string("/proc/self/status").expect("own status"));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for pin in [false, true] {
        let key = if pin { "pin_workers = true\n" } else { "" };
        let config = pool_config(&[mock_node("n1", 4, 0, 1, 1)], &[mock_model("m", &["n1"], "")], "");
        let edge = Edge::start(&format!("{key}{config}"));
        let node = edge.start_node("n1", &format!("{key}workers = 2\n"));
        edge.wait_nodes_ready(1);
        for (pid, prefix) in [(edge.proc.child.id(), "iop-edge-"), (node.child.id(), "iop-node-")] {
            let threads = reactors(pid, prefix);
            assert_eq!(threads.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1], "{prefix}: {threads:?}");
            for (index, cpus) in &threads {
                let want = if pin { (index % cores).to_string() } else { ours.clone() };
                assert_eq!(cpus, &want, "{prefix}{index}, pin_workers = {pin}");
            }
        }
    }
}
