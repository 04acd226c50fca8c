//! The single-request coordinator under faults: the node killed mid-run,
//! a stage past its deadline, a prompt past the model's context, escape
//! attempts at the workspace (links, a FIFO, `..`, absolute paths, `.iop`,
//! a directory swapped for a link between two calls), the environment a
//! command sees, a cleanup that fails after an approved run, and a
//! workspace the node refused before it was ready. Each run ends with one
//! terminal of the class the coordinator documents (`coordinator::state`).

use std::{
    os::unix::fs::{symlink, FileTypeExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{agent::*, harness::*};

/// [`setup_in`] with the workspace's command templates (`commands`: a TOML
/// inline table), more workspace keys (`ws_extra`), more agent keys, the
/// node's environment, and `prepare(dir, root)` run before anything starts.
fn setup_with(
    dir: &Path,
    scripts: &Value,
    commands: &str,
    ws_extra: &str,
    agent_extra: &str,
    node_env: &[(&str, &str)],
    prepare: impl FnOnce(&Path, &Path),
) -> Setup {
    let o = Options { commands, ws_extra, agent_extra, node_env, ..Options::default() };
    setup_in(dir, scripts, &o, prepare)
}

/// Asserts a buffered answer is the error of `class` with its status and type.
fn assert_failed(r: &Response, status: u16, kind: &str, class: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let e = r.json();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], kind, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("`{class}`")), "class `{class}` not named: {msg}");
}

/// The chat requests the mock got for script `name`'s `stage` (`plan`,
/// `work` or `review`), oldest first, as JSON bodies.
fn mock_requests(s: &Setup, name: &str, stage: &str) -> Vec<Value> {
    let r = request(s.mock.addr, "GET", "/log", None, &[]);
    assert_eq!(r.status, 200);
    let marker = format!("[script:{name}]");
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["request_body"].as_str().and_then(|b| serde_json::from_str::<Value>(b).ok()))
        .filter(|b| b["messages"].as_array().is_some_and(|ms| ms.iter().any(|m| m.to_string().contains(&marker))))
        .filter(|b| {
            let at = match b["response_format"]["json_schema"]["name"].as_str() {
                Some("iop_plan") => "plan",
                Some("iop_review") => "review",
                _ => "work",
            };
            at == stage
        })
        .collect()
}

/// The `tool` messages of a work request, their content parsed.
fn tool_results(work_request: &Value) -> Vec<Value> {
    work_request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap())
        .collect()
}

/// Every file under `dir` (recursively, links not followed) with its kind
/// and content: what "nothing changed" is compared by.
fn tree(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let t = std::fs::symlink_metadata(&p).unwrap().file_type();
            let what = if t.is_symlink() {
                format!("link -> {}", std::fs::read_link(&p).unwrap().display())
            } else if t.is_dir() {
                todo.push(p.clone());
                "dir".to_owned()
            } else if t.is_fifo() {
                "fifo".to_owned()
            } else {
                format!("file {:?}", std::fs::read(&p).unwrap())
            };
            out.push((p, what));
        }
    }
    out.sort();
    out
}

/// A streamed answer's events: exactly one terminal, and it is the error
/// of `class` (no content, no `message_stop`).
fn assert_one_error_terminal(r: &Response, kind: &str, class: &str) {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = sse_events(r);
    let errors: Vec<&Value> = events.iter().filter(|(e, _)| e == "error").map(|(_, d)| d).collect();
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["error"]["type"], kind, "{events:?}");
    let msg = errors[0]["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("`{class}`")), "class `{class}` not named: {msg}");
    assert!(
        !events.iter().any(|(e, _)| e == "message_stop" || e == "message_delta" || e == "content_block_delta"),
        "a second terminal or content: {events:?}"
    );
}

/// The command templates of [`setup`]'s workspace.
const COMMANDS: &str = r#"{ test = ["sh", "-c", "cat hello.txt && echo tested"] }"#;

fn metrics(edge: &Edge) -> String {
    String::from_utf8(edge.admin("/metrics").body).unwrap()
}

/// Whether process `pid` is gone (or a zombie).
fn gone(pid: &str) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// The node is killed (`kill -9`) while a Work call's command runs: the
/// frozen link is gone, so the call fails closed with one error terminal
/// (`internal_tool`, as `call_error` maps a lost link) and nothing is
/// retried, sent to another node or reselected; the node started again
/// removes the job directory the killed one left, and keeps user files.
#[test]
fn a_node_killed_mid_command_ends_the_run_once_and_its_job_is_removed_at_restart() {
    let scripts = json!({"scripts": {"slow": {
        "plan": [plan_ok()],
        "work": [call("workspace_command", json!({"command": "slow"})), {"content": "never"}],
        "review": [verdict("approve", "never")],
    }}});
    let mut s = setup("faults-kill", &scripts, "");
    let mut events = s.edge.events();
    let http = s.edge.http;
    let client = std::thread::spawn(move || {
        let body = task("slow", true);
        request(http, "POST", "/v1/messages", Some(&body), &[("anthropic-version", "2023-06-01")])
    });
    let pid_file = s.root.join("pid");
    eventually(Duration::from_secs(15), "the command started", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim().parse::<u32>().is_ok())
    });
    let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
    let jobs: Vec<_> = std::fs::read_dir(s.root.join(".iop/job")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(jobs.len(), 1, "one job directory while the run works: {jobs:?}");
    s._node.kill9();
    // Its supervisor sees the node gone and kills the command's whole group.
    eventually(Duration::from_secs(10), "the command dies with its node", || gone(&pid));
    let r = client.join().unwrap();
    assert_one_error_terminal(&r, "api_error", "internal_tool");
    let e = events.wait("edge_single_request_terminal_rejection", Duration::from_secs(10), |_| true);
    assert_eq!((e["class"].as_str(), e["status"].as_u64()), (Some("internal_tool"), Some(500)));
    // One plan call and the one work call that issued the command: nothing
    // after the link was lost (no retry, no second work call, no review).
    assert_eq!(mock_requests(&s, "slow", "plan").len(), 1);
    assert_eq!(mock_requests(&s, "slow", "work").len(), 1);
    assert_eq!(mock_requests(&s, "slow", "review").len(), 0);
    // The killed node could not clean up: its job directory is still there.
    assert!(s.root.join(".iop/job").join(&jobs[0]).exists());
    // The node again: the leftover job is removed before it serves the root.
    let node = s.edge.start_node("n1", "");
    eventually(Duration::from_secs(15), "the restarted node serves the agent", || agent_listed(&s.edge));
    eventually(Duration::from_secs(10), "the leftover job directory is removed", || {
        std::fs::read_dir(s.root.join(".iop/job")).map(|d| d.count() == 0).unwrap_or(true)
    });
    eventually(Duration::from_secs(10), "the restarted node logs the leftover job removed", || {
        let log = node.log_text();
        log.lines().any(|l| l.contains("job directories left by an earlier run removed") && l.contains("jobs=1"))
    });
    assert_cleaned(&s.root);
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap().trim(), pid, "a user file the command wrote is kept");
    // The run stays over: the restarted node gets none of its calls.
    assert_eq!(mock_requests(&s, "slow", "work").len(), 1);
    assert_eq!(mock_requests(&s, "slow", "review").len(), 0);
    assert!(
        metrics(&s.edge)
            .contains("iop_edge_single_request_terminals_total{terminal=\"error\",class=\"internal_tool\"} 1"),
        "{}",
        metrics(&s.edge)
    );
}

/// A plan answer slower than the stage's deadline: `timeout`, once the
/// stage's time is up (not when the slow answer would have come).
#[test]
fn a_stage_past_its_deadline_fails_with_timeout() {
    let scripts = json!({"scripts": {"slow_plan": {"plan": [{
        "content": json!({"plan": "late", "verification": "none"}).to_string(),
        "delay_ms": 10000,
    }]}}});
    let s = setup("faults-deadline", &scripts, "stage_timeout_sec = 1");
    let started = Instant::now();
    let r = ask(&s, "slow_plan", false);
    let took = started.elapsed();
    assert_failed(&r, 500, "api_error", "timeout");
    assert!(took >= Duration::from_millis(900), "ended before the stage's deadline: {took:?}");
    assert!(took < Duration::from_millis(8000), "not cut at the stage's deadline: {took:?}");
    assert!(!String::from_utf8_lossy(&r.body).contains("late"));
    // Planning never opened the workspace: nothing was made.
    assert!(!s.root.join(".iop").exists());
    assert_cleaned(&s.root);
    assert!(
        metrics(&s.edge).contains("iop_edge_single_request_terminals_total{terminal=\"error\",class=\"timeout\"} 1")
    );
}

/// A provider's "maximum context length" 400: class `context`, the client's
/// own `invalid_request_error` (400), buffered and streamed.
#[test]
fn a_prompt_past_the_models_context_fails_with_context() {
    let too_long = json!({"error": {"status": 400, "message": "This model's maximum context length is 4096 tokens"}});
    let scripts = json!({"scripts": {"ctx": {"plan": [too_long.clone(), too_long]}}});
    let s = setup("faults-context", &scripts, "");
    let r = ask(&s, "ctx", false);
    assert_failed(&r, 400, "invalid_request_error", "context");
    assert!(!String::from_utf8_lossy(&r.body).contains("4096"), "the provider's message is private");
    let r = ask(&s, "ctx", true);
    assert_one_error_terminal(&r, "invalid_request_error", "context");
    assert_eq!(mock_requests(&s, "ctx", "plan").len(), 2, "one call per request, none retried");
    assert_cleaned(&s.root);
    assert!(
        metrics(&s.edge).contains("iop_edge_single_request_terminals_total{terminal=\"error\",class=\"context\"} 2")
    );
}

/// Escape attempts at the workspace, each its own run: a link to the
/// outside (on the path, at its end), a FIFO, `..`, absolute paths and
/// `.iop`. Each is refused by the node before any effect, so the run ends
/// with `internal_tool` (the node's refusal of a tool call), the FIFO is
/// never opened for a blocking read, and nothing outside the root (nor the
/// links and the FIFO) changes.
#[test]
fn escape_attempts_at_the_workspace_change_nothing() {
    let attempts: Vec<(&str, Value, &str)> = vec![
        ("etc_link_read", call("workspace_read", json!({"path": "etc/passwd"})), "symlink"),
        ("dir_link_read", call("workspace_read", json!({"path": "out/secret.txt"})), "symlink"),
        ("dir_link_write", call("workspace_write", json!({"path": "out/x", "content": "escaped"})), "symlink"),
        ("dir_link_list", call("workspace_list", json!({"path": "out", "after": null})), "symlink"),
        ("dir_link_delete", call("workspace_delete", json!({"path": "out/secret.txt"})), "symlink"),
        ("file_link_read", call("workspace_read", json!({"path": "lfile"})), "symlink"),
        ("file_link_write", call("workspace_write", json!({"path": "lfile", "content": "escaped"})), "symlink"),
        ("file_link_delete", call("workspace_delete", json!({"path": "lfile"})), "symlink"),
        ("fifo_read", call("workspace_read", json!({"path": "fifo"})), "special_file"),
        ("fifo_write", call("workspace_write", json!({"path": "fifo", "content": "x"})), "special_file"),
        ("fifo_delete", call("workspace_delete", json!({"path": "fifo"})), "special_file"),
        ("dotdot_write", call("workspace_write", json!({"path": "../outside/x", "content": "x"})), "path_invalid"),
        ("dotdot_read", call("workspace_read", json!({"path": "sub/../../outside/secret.txt"})), "path_invalid"),
        ("dotdot_list", call("workspace_list", json!({"path": "..", "after": null})), "path_invalid"),
        ("absolute_read", call("workspace_read", json!({"path": "/etc/passwd"})), "path_invalid"),
        ("absolute_write", call("workspace_write", json!({"path": "/PLACEHOLDER", "content": "x"})), "path_invalid"),
        ("iop_write", call("workspace_write", json!({"path": ".iop/job/x", "content": "x"})), "path_reserved"),
        ("iop_list", call("workspace_list", json!({"path": ".iop", "after": null})), "path_reserved"),
        ("iop_delete", call("workspace_delete", json!({"path": ".iop/job"})), "path_reserved"),
    ];
    // The absolute write names a file outside the root (in the test's dir).
    let dir = scratch("faults-escape");
    let outside_target = dir.join("outside/abs.txt");
    let mut scripts = serde_json::Map::new();
    for (name, attempt, _) in &attempts {
        let mut attempt = attempt.clone();
        if *name == "absolute_write" {
            attempt["tool_calls"][0]["arguments"]["path"] = json!(outside_target.to_str().unwrap());
        }
        scripts.insert(
            (*name).to_owned(),
            json!({"plan": [plan_ok()], "work": [attempt, {"content": "escaped"}], "review": [verdict("approve", "x")]}),
        );
    }
    let scripts = json!({ "scripts": scripts });
    let s = setup_with(&dir, &scripts, COMMANDS, "", "", &[], |dir, root| {
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::fs::write(dir.join("outside/secret.txt"), b"outside\n").unwrap();
        symlink("/etc", root.join("etc")).unwrap();
        symlink(dir.join("outside"), root.join("out")).unwrap();
        symlink(dir.join("outside/secret.txt"), root.join("lfile")).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let made = std::process::Command::new("mkfifo").arg(root.join("fifo")).status().unwrap();
        assert!(made.success(), "mkfifo");
    });
    let outside = dir.join("outside");
    let before_outside = tree(&outside);
    let before_root = tree(&s.root);
    let mut refused: std::collections::HashMap<&str, usize> =
        attempts.iter().map(|(_, _, label)| (*label, refusals_of(&s.edge, label))).collect();
    for (name, _, label) in &attempts {
        let started = Instant::now();
        let r = ask(&s, name, false);
        assert_failed(&r, 500, "api_error", "internal_tool");
        assert!(started.elapsed() < Duration::from_secs(10), "{name} took {:?}", started.elapsed());
        // The one work call, no second: the refusal ended the run.
        assert_eq!(mock_requests(&s, name, "work").len(), 1, "{name}");
        // The node's refusal, by its closed label (the edge logs it at debug):
        // one more than before this run.
        // (The log is written off the edge's threads: awaited.)
        let want = refused[*label] + 1;
        eventually(Duration::from_secs(10), &format!("{name}: a new `error={label}` in the edge log"), || {
            refusals_of(&s.edge, label) >= want
        });
        assert_eq!(refusals_of(&s.edge, label), want, "{name}:\n{}", s.edge.proc.log_text());
        refused.insert(label, want);
        assert_cleaned(&s.root);
        assert_eq!(tree(&outside), before_outside, "{name} changed the outside");
        assert_eq!(
            tree(&s.root).into_iter().filter(|(p, _)| !p.starts_with(s.root.join(".iop"))).collect::<Vec<_>>(),
            before_root,
            "{name} changed the root"
        );
    }
    assert!(std::fs::symlink_metadata(s.root.join("fifo")).unwrap().file_type().is_fifo());
    assert!(!outside_target.exists());
    assert!(!dir.join("outside/x").exists());
    assert_eq!(std::fs::read(outside.join("secret.txt")).unwrap(), b"outside\n");
}

/// How many tool calls the edge has logged as refused with `label`.
fn refusals_of(edge: &Edge, label: &str) -> usize {
    let needle = format!("error={label}");
    edge.proc
        .log_text()
        .lines()
        .filter(|l| l.contains("workspace tool call") && l.split_whitespace().any(|w| w == needle))
        .count()
}

/// A directory written into, then swapped for a link to the outside by a
/// command between two calls: the next write through it is refused
/// (`symlink`: no link is followed anywhere on a path), and nothing is
/// written outside.
#[test]
fn a_directory_swapped_for_a_link_between_two_calls_is_not_followed() {
    let scripts = json!({"scripts": {"swap": {
        "plan": [plan_ok()],
        "work": [
            call("workspace_write", json!({"path": "d/a.txt", "content": "inside\n"})),
            call("workspace_command", json!({"command": "swap"})),
            call("workspace_write", json!({"path": "d/b.txt", "content": "escaped\n"})),
            {"content": "never"},
        ],
        "review": [verdict("approve", "never")],
    }}});
    let commands = r#"{ swap = ["sh", "-c", "rm -rf d && ln -s ../outside d && echo swapped"] }"#;
    let dir = scratch("faults-swap");
    let s = setup_with(&dir, &scripts, commands, "", "", &[], |dir, root| {
        // A write does not make parent directories: `d` is the user's.
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
    });
    let r = ask(&s, "swap", false);
    assert_failed(&r, 500, "api_error", "internal_tool");
    let work = mock_requests(&s, "swap", "work");
    assert_eq!(work.len(), 3, "the write, the command, the refused write: {work:#?}");
    let results = tool_results(&work[2]);
    assert_eq!(results[0], json!({"written": true}), "the first write went in: {results:?}");
    assert_eq!(results[1]["exit_code"], 0, "the swap ran: {results:?}");
    assert!(results[1]["output"].as_str().unwrap().contains("swapped"), "{results:?}");
    // `d` is the link now, and nothing went through it.
    assert!(std::fs::symlink_metadata(s.root.join("d")).unwrap().file_type().is_symlink());
    assert!(!dir.join("outside/b.txt").exists(), "a write followed the swapped-in link");
    assert_eq!(std::fs::read_dir(dir.join("outside")).unwrap().count(), 0);
    eventually(Duration::from_secs(10), "the edge logs the third call refused as a link", || {
        s.edge
            .proc
            .log_text()
            .lines()
            .any(|l| l.contains("workspace tool call") && l.contains("tool_id=\"t3\"") && l.contains("error=symlink"))
    });
    assert_cleaned(&s.root);
}

/// A command sees only the environment names its workspace allows: the
/// node has both variables, the tool result the model reads has the
/// allowed one's value and not the other's.
#[test]
fn a_command_sees_only_the_allowed_environment_names() {
    let scripts = json!({"scripts": {"env": {
        "plan": [plan_ok()],
        "work": [call("workspace_command", json!({"command": "env"})), {"content": "printed the environment"}],
        "review": [verdict("approve", "fine")],
    }}});
    let commands = r#"{ env = ["sh", "-c", "echo A=$IOP_TEST_ALLOWED B=$IOP_TEST_SECRET; env"] }"#;
    let secret = "hunter2-not-for-commands";
    let node_env = [("IOP_TEST_ALLOWED", "yes"), ("IOP_TEST_SECRET", secret)];
    let s = setup_with(
        &scratch("faults-env"),
        &scripts,
        commands,
        r#"env = ["IOP_TEST_ALLOWED"]"#,
        "",
        &node_env,
        |_, _| {},
    );
    let r = ask(&s, "env", false);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let work = mock_requests(&s, "env", "work");
    assert_eq!(work.len(), 2);
    let results = tool_results(&work[1]);
    assert_eq!(results.len(), 1, "{results:?}");
    let output = results[0]["output"].as_str().unwrap();
    assert_eq!(results[0]["exit_code"], 0, "{results:?}");
    assert!(output.starts_with("A=yes B=\n"), "{output:?}");
    assert!(!output.contains(secret), "the secret reached the command: {output:?}");
    assert!(!output.contains("IOP_TEST_SECRET"), "{output:?}");
    // Nothing in any request the model saw carries it either.
    let log = request(s.mock.addr, "GET", "/log", None, &[]);
    assert!(!String::from_utf8_lossy(&log.body).contains(secret));
    assert_cleaned(&s.root);
}

/// An approved run whose cleanup fails (the command planted a tree deeper
/// than the job cleanup walks, `jobs::MAX_DEPTH`): the success is replaced
/// by a `workspace_cleanup` error, buffered and streamed.
#[test]
fn a_failed_cleanup_replaces_the_success() {
    let run = json!({
        "plan": [plan_ok()],
        "work": [call("workspace_command", json!({"command": "plant"})), {"content": "all done"}],
        "review": [verdict("approve", "fine")],
    });
    let scripts = json!({"scripts": {"plant": run.clone(), "plant_stream": run}});
    // Links or FIFOs in the job directory are unlinked as entries (no
    // failure); a directory nested deeper than the walk's limit is refused.
    let commands = r#"{ plant = ["sh", "-c", "for d in .iop/job/*; do mkdir -p \"$d/1/2/3/4/5/6/7/8/9/10\"; done"] }"#;
    let s = setup_with(&scratch("faults-cleanup"), &scripts, commands, "", "", &[], |_, _| {});
    let mut events = s.edge.events();
    let r = ask(&s, "plant", false);
    assert_failed(&r, 500, "api_error", "workspace_cleanup");
    assert!(!String::from_utf8_lossy(&r.body).contains("all done"), "the replaced success leaked its text");
    let e = events.wait("edge_single_request_terminal_rejection", Duration::from_secs(10), |_| true);
    assert_eq!((e["class"].as_str(), e["status"].as_u64()), (Some("workspace_cleanup"), Some(500)));
    // The review did approve: only the cleanup turned it into an error.
    assert_eq!(mock_requests(&s, "plant", "review").len(), 1);
    let r = ask(&s, "plant_stream", true);
    assert_one_error_terminal(&r, "api_error", "workspace_cleanup");
    assert!(!String::from_utf8_lossy(&r.body).contains("all done"));
    let m = metrics(&s.edge);
    assert!(
        m.contains("iop_edge_single_request_terminals_total{terminal=\"error\",class=\"workspace_cleanup\"} 2"),
        "{m}"
    );
    assert!(!m.contains("terminal=\"end_turn\""), "{m}");
    // The node's cleanup failed for the depth, not for anything else.
    let too_deep = || {
        let log = s._node.log_text();
        log.lines().filter(|l| l.contains("workspace cleanup") && l.contains("error=too_large")).count()
    };
    eventually(Duration::from_secs(10), "the node logs both cleanups failed as too_large", || too_deep() == 2);
    // What the cleanup refused stays (it is the operator's to look at); the user's files are kept.
    assert_eq!(std::fs::read_dir(s.root.join(".iop/job")).unwrap().count(), 2);
    assert_eq!(std::fs::read(s.root.join("README.md")).unwrap(), b"user file\n");
}

/// A workspace the node refused before it was ready (its root does not
/// exist): the agent using it is not among the models and answers 529
/// (`overloaded_error`, the 503 of an unavailable workspace) while an agent
/// on the node's other workspace is served.
#[test]
fn an_agent_on_a_workspace_the_node_refused_is_unavailable_and_not_listed() {
    let dir = scratch("faults-refused");
    std::fs::create_dir_all(dir.join("repo")).unwrap();
    let ws = |r: &str, root: &Path| {
        format!(
            "[[nodes.workspaces]]\nref = \"{r}\"\nhost = \"linux\"\nroot = \"{}\"\noperations = [\"read\", \"list\"]\n",
            root.to_str().unwrap()
        )
    };
    let agent = |name: &str, ws: &str| {
        format!("[[agents]]\nname = \"{name}\"\nplan = \"m\"\nwork = \"m\"\nreview = \"m\"\nworkspaces = [\"{ws}\"]\n")
    };
    let node =
        format!("{}{}{}", mock_node("n1", 4, 0, 3, 0), ws("repo", &dir.join("repo")), ws("gone", &dir.join("missing")));
    let tail = agent("coder", "repo") + &agent("lost", "gone");
    let edge = Edge::start(&pool_config(&[node], &[mock_model("m", &["n1"], "")], &tail));
    let _node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    eventually(Duration::from_secs(10), "the served workspace's agent is listed", || agent_listed(&edge));
    eventually(Duration::from_secs(10), "the edge logs the refusal", || {
        edge.proc.log_text().lines().any(|l| l.contains("workspace=gone ") && l.contains("ROOT_MISSING"))
    });
    let models = request(edge.http, "GET", "/v1/models", None, &[]).json();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().filter_map(|m| m["id"].as_str()).collect();
    assert!(ids.contains(&"coder") && !ids.contains(&"lost"), "{ids:?}");
    let body =
        json!({"model": "lost", "max_tokens": 16, "messages": [{"role": "user", "content": "[script:none] hi"}]});
    for stream in [false, true] {
        let mut body = body.clone();
        body["stream"] = json!(stream);
        let r = request(edge.http, "POST", "/v1/messages", Some(body.to_string().as_bytes()), &[]);
        assert!(r.status == 503 || r.status == 529, "{}: {}", r.status, String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["error"]["type"], "overloaded_error");
    }
    assert!(!dir.join("missing").exists(), "the refused root was not made");
    // The agent on the served workspace still runs (no scripts: the plan is
    // the mock's generated text, so it fails as malformed, after admission).
    let body = json!({"model": "coder", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let r = request(edge.http, "POST", "/v1/messages", Some(body.to_string().as_bytes()), &[]);
    assert_failed(&r, 500, "api_error", "malformed");
}
