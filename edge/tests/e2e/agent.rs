//! The single-request coordinator end to end: an Anthropic request whose
//! `model` is an agent, run as Plan → Work → Review on a model group served
//! by `iop-mockprov` playing a script per stage, with the workspace tools
//! executed by a real `iop-node` in a scratch directory.

use std::{path::Path, path::PathBuf, time::Duration};

use serde_json::{json, Value};

use crate::harness::*;

/// An edge with node `n1` (provider `up` on the scripted mock, workspace
/// `repo` at `root`), model `m` on it, and agent `coder` using `m` for
/// every stage; `agent_extra` holds more agent keys.
pub struct Setup {
    pub edge: Edge,
    pub _node: Proc,
    pub mock: MockProv,
    pub root: PathBuf,
}

/// The command templates of [`setup`]'s workspace.
pub const COMMANDS: &str = r#"{ test = ["sh", "-c", "cat hello.txt && echo tested"], slow = ["sh", "-c", "echo $$ > pid; exec sleep 30"], broken = ["iop-no-such-program"] }"#;

/// What a [`setup_in`] varies.
pub struct Options<'a> {
    /// The provider's kind (`openai_compat`, `ollama`).
    pub kind: &'a str,
    /// The model name the provider is asked for.
    pub upstream_model: &'a str,
    /// The workspace's command templates (a TOML inline table).
    pub commands: &'a str,
    /// More workspace keys.
    pub ws_extra: &'a str,
    /// More agent keys.
    pub agent_extra: &'a str,
    /// The node's environment.
    pub node_env: &'a [(&'a str, &'a str)],
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            kind: "openai_compat",
            upstream_model: "mock",
            commands: COMMANDS,
            ws_extra: "",
            agent_extra: "",
            node_env: &[],
        }
    }
}

/// [`setup_in`] in a fresh scratch directory with the default options and
/// `agent_extra`.
pub fn setup(name: &str, scripts: &Value, agent_extra: &str) -> Setup {
    setup_in(&scratch(name), scripts, &Options { agent_extra, ..Options::default() }, |_, _| {})
}

/// The edge, node and scripted mock of an agent run in `dir` (the root is
/// `dir/repo`, holding a user file); `prepare(dir, root)` runs before
/// anything starts. Returns once the agent is served.
pub fn setup_in(dir: &Path, scripts: &Value, o: &Options<'_>, prepare: impl FnOnce(&Path, &Path)) -> Setup {
    let root = dir.join("repo");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("README.md"), b"user file\n").unwrap();
    prepare(dir, &root);
    let script = dir.join("script.json");
    std::fs::write(&script, serde_json::to_vec(scripts).unwrap()).unwrap();
    let mock = MockProv::start(&["--script", script.to_str().unwrap()]);
    let config = format!(
        r#"admin_token = "{ADMIN_TOKEN}"
workers = 2
[http]
listen = "127.0.0.1:0"
[node_listener]
listen = "127.0.0.1:0"
[[nodes]]
id = "n1"
token = "{token}"
[[nodes.providers]]
id = "up"
kind = "{kind}"
base_url = "{base}"
capacity = 4
[[nodes.workspaces]]
ref = "repo"
host = "linux"
root = "{root}"
operations = ["read", "list", "write", "delete", "command"]
commands = {commands}
command_timeout_sec = 60
{ws_extra}
[[models]]
name = "m"
node = "n1"
provider = "up"
upstream_model = "{upstream_model}"
[[agents]]
name = "coder"
plan = "m"
work = "m"
review = "m"
workspaces = ["repo"]
{agent_extra}
"#,
        token = node_token("n1"),
        kind = o.kind,
        base = mock.base_for(o.kind),
        root = root.to_str().unwrap(),
        commands = o.commands,
        ws_extra = o.ws_extra,
        upstream_model = o.upstream_model,
        agent_extra = o.agent_extra,
    );
    let edge = Edge::start(&config);
    let node = edge.node_with(&node_token("n1"), "", o.node_env);
    edge.wait_nodes_ready(1);
    eventually(Duration::from_secs(10), "the agent is served", || agent_listed(&edge));
    Setup { edge, _node: node, mock, root }
}

/// Whether `coder` is among the models (it is while a node serves one of
/// its workspaces).
pub fn agent_listed(edge: &Edge) -> bool {
    let r = request(edge.http, "GET", "/v1/models", None, &[]);
    r.json()["data"].as_array().unwrap().iter().any(|m| m["id"] == "coder")
}

pub fn plan_ok() -> Value {
    json!({"content": json!({"plan": "1. write hello.txt\n2. run test", "verification": "test prints tested"}).to_string()})
}

pub fn verdict(v: &str, findings: &str) -> Value {
    json!({"content": json!({"verdict": v, "findings": findings}).to_string()})
}

pub fn call(name: &str, args: Value) -> Value {
    json!({"tool_calls": [{"name": name, "arguments": args}]})
}

pub fn task(script: &str, stream: bool) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "coder",
        "max_tokens": 512,
        "stream": stream,
        "messages": [{"role": "user", "content": format!("[script:{script}] Write hello.txt and test it.")}],
    }))
    .unwrap()
}

pub fn ask(s: &Setup, script: &str, stream: bool) -> Response {
    let body = task(script, stream);
    request(s.edge.http, "POST", "/v1/messages", Some(&body), &[("anthropic-version", "2023-06-01")])
}

/// The request's job directories are all gone; user files are kept.
pub fn assert_cleaned(root: &Path) {
    let jobs = root.join(".iop/job");
    let left: Vec<_> =
        std::fs::read_dir(&jobs).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "job directories left: {left:?}");
    assert_eq!(std::fs::read(root.join("README.md")).unwrap(), b"user file\n");
}

pub fn sse_events(r: &Response) -> Vec<(String, Value)> {
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let mut out = Vec::new();
    let mut event = String::new();
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            event = e.to_owned();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((event.clone(), serde_json::from_str(d).unwrap_or(Value::Null)));
        }
    }
    out
}

#[test]
fn an_agent_plans_works_in_the_workspace_and_is_approved() {
    let scripts = json!({"scripts": {"ok": {
        "plan": [plan_ok()],
        "work": [
            call("workspace_write", json!({"path": "hello.txt", "content": "hello\n"})),
            call("workspace_command", json!({"command": "test"})),
            {"content": "Wrote hello.txt; `test` printed hello and tested."},
        ],
        "review": [verdict("approve", "done as planned")],
    }}});
    let s = setup("agent-ok", &scripts, "");
    let r = ask(&s, "ok", false);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let m = r.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["model"], "coder");
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["content"][0]["text"], "Wrote hello.txt; `test` printed hello and tested.");
    assert_eq!(std::fs::read(s.root.join("hello.txt")).unwrap(), b"hello\n");
    assert_cleaned(&s.root);
    let metrics = String::from_utf8(s.edge.admin("/metrics").body).unwrap();
    assert!(metrics.contains("iop_anthropic_single_request_ingress_total 1\n"), "{metrics}");
    assert!(metrics.contains("iop_edge_single_request_terminals_total{terminal=\"end_turn\",class=\"\"} 1"));
    // Nothing private in the edge's log: no plan, no file content, no tool name.
    let log = s.edge.proc.log_text();
    for private in ["hello.txt", "write hello", "workspace_write", "done as planned"] {
        assert!(!log.contains(private), "`{private}` in the edge log:\n{log}");
    }
}

#[test]
fn a_review_sends_the_work_back_and_the_stream_shows_only_stages() {
    let scripts = json!({"scripts": {"repair": {
        "plan": [plan_ok()],
        "work": [
            call("workspace_write", json!({"path": "hello.txt", "content": "draft\n"})),
            {"content": "first try"},
            call("workspace_write", json!({"path": "hello.txt", "content": "hello\n"})),
            {"content": "fixed after review"},
        ],
        "review": [verdict("repair", "the greeting is wrong"), verdict("approve", "ok now")],
    }}});
    let s = setup("agent-repair", &scripts, "");
    let r = ask(&s, "repair", true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&r);
    let stages: Vec<&str> = events
        .iter()
        .filter(|(e, d)| e == "ping" && d["type"] == "ping")
        .filter_map(|(_, d)| d["stage"].as_str())
        .collect();
    for want in ["accepted", "planning", "working", "internal_tool", "reviewing", "repairing", "finalizing"] {
        assert!(stages.contains(&want), "stage {want} missing: {stages:?}");
    }
    assert_eq!(events.iter().filter(|(e, _)| e == "message_stop").count(), 1);
    let text: String = events
        .iter()
        .filter(|(e, _)| e == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "fixed after review");
    let body = String::from_utf8_lossy(&r.body);
    for private in ["greeting", "draft", "first try", "hello.txt"] {
        assert!(!body.contains(private), "`{private}` reached the client:\n{body}");
    }
    assert_eq!(std::fs::read(s.root.join("hello.txt")).unwrap(), b"hello\n");
    assert_cleaned(&s.root);
}

/// Each failure class on purpose, each with one terminal and the
/// workspace cleaned; escape attempts change nothing outside the root.
#[test]
fn every_failure_ends_with_its_class_and_a_clean_workspace() {
    let provider_error = json!({"error": {"status": 500, "message": "boom"}});
    let scripts = json!({"scripts": {
        "provider": {"plan": [provider_error]},
        "malformed_plan": {"plan": [{"content": "I think we should"}]},
        "bad_call": {"plan": [plan_ok()], "work": [{"tool_calls": [{"name": "workspace_write", "arguments": "{\"path\":"}]}]},
        "unknown_tool": {"plan": [plan_ok()], "work": [call("shell", json!({"cmd": "rm -rf /"}))]},
        "denied_command": {"plan": [plan_ok()], "work": [call("workspace_command", json!({"command": "rm"}))]},
        "failing_command": {"plan": [plan_ok()], "work": [call("workspace_command", json!({"command": "broken"}))]},
        "escape": {"plan": [plan_ok()], "work": [call("workspace_write", json!({"path": "../outside.txt", "content": "x"}))]},
        "reserved": {"plan": [plan_ok()], "work": [call("workspace_read", json!({"path": ".iop/job"}))]},
        "repeat": {"plan": [plan_ok()], "work": [
            call("workspace_read", json!({"path": "README.md"})),
            call("workspace_read", json!({"path": "README.md"})),
        ]},
        "length": {"plan": [{"content": "{\"plan\":\"secret partial", "finish_reason": "length"}]},
        "budget": {"plan": [plan_ok()], "work": [
            call("workspace_list", json!({"path": "", "after": null})),
            call("workspace_read", json!({"path": "README.md"})),
            call("workspace_write", json!({"path": "a.txt", "content": "a"})),
        ]},
    }});
    let s = setup("agent-classes", &scripts, "stage_iterations = 2");
    let mut events = s.edge.events();
    let outside = s.root.parent().unwrap().join("outside.txt");
    for (script, status, kind, class) in [
        ("provider", 500, "api_error", "provider"),
        ("malformed_plan", 500, "api_error", "malformed"),
        ("bad_call", 500, "api_error", "malformed"),
        ("unknown_tool", 500, "api_error", "malformed"),
        ("denied_command", 500, "api_error", "malformed"),
        ("failing_command", 500, "api_error", "internal_tool"),
        ("escape", 500, "api_error", "internal_tool"),
        ("reserved", 500, "api_error", "internal_tool"),
        ("repeat", 500, "api_error", "repetition"),
        ("budget", 500, "api_error", "budget"),
    ] {
        let r = ask(&s, script, false);
        assert_eq!(r.status, status, "{script}: {}", String::from_utf8_lossy(&r.body));
        let e = r.json();
        assert_eq!(e["error"]["type"], kind, "{script}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("`{class}`")), "{script}: {msg}");
        assert_cleaned(&s.root);
        // The rejection event: the terminal kind, the class and the status, nothing else.
        let e = events.wait("edge_single_request_terminal_rejection", Duration::from_secs(10), |_| true);
        assert_eq!(
            (e["terminal"].as_str(), e["class"].as_str(), e["status"].as_u64()),
            (Some("error"), Some(class), Some(500))
        );
        let mut keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["class", "status", "terminal", "ts_ms", "type"]);
    }
    let metrics = String::from_utf8(s.edge.admin("/metrics").body).unwrap();
    for want in [
        "iop_edge_single_request_terminals_total{terminal=\"error\",class=\"repetition\"} 1",
        "iop_edge_single_request_stage_seconds_count{stage=\"planning\"}",
        "iop_edge_single_request_calls_total{kind=\"cleanup\"}",
    ] {
        assert!(metrics.contains(want), "{want} missing:\n{metrics}");
    }
    assert!(!outside.exists(), "a write escaped the root");
    // `length` says so and exposes nothing of the partial stage output.
    let r = ask(&s, "length", false);
    assert_eq!(r.status, 200);
    let m = r.json();
    assert_eq!(m["stop_reason"], "max_tokens");
    assert_eq!(m["content"], json!([]));
    assert!(!String::from_utf8_lossy(&r.body).contains("secret"));
    // The same on a stream: one error event, no content.
    let r = ask(&s, "provider", true);
    let events = sse_events(&r);
    let errors: Vec<_> = events.iter().filter(|(e, _)| e == "error").collect();
    assert_eq!(errors.len(), 1, "{events:?}");
    assert!(!events.iter().any(|(e, _)| e == "message_stop" || e == "content_block_delta"));
    assert_cleaned(&s.root);
}

#[test]
fn a_client_that_leaves_mid_command_cancels_silently_and_the_command_dies() {
    let scripts = json!({"scripts": {"slow": {
        "plan": [plan_ok()],
        "work": [call("workspace_command", json!({"command": "slow"})), {"content": "never"}],
        "review": [verdict("approve", "never")],
    }}});
    let s = setup("agent-leave", &scripts, "");
    let body = task("slow", true);
    let mut sock = std::net::TcpStream::connect(s.edge.http).unwrap();
    use std::io::{Read, Write};
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).unwrap();
    sock.write_all(&body).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"internal_tool\"") {
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let pid_file = s.root.join("pid");
    eventually(Duration::from_secs(10), "the command started", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| !p.trim().is_empty())
    });
    let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
    drop(sock);
    eventually(Duration::from_secs(15), "the command's process is gone", || {
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
    });
    eventually(Duration::from_secs(15), "the job directory is removed", || {
        std::fs::read_dir(s.root.join(".iop/job")).map(|d| d.count() == 0).unwrap_or(true)
    });
    eventually(Duration::from_secs(10), "a silent cancel is counted", || {
        String::from_utf8(s.edge.admin("/metrics").body)
            .unwrap()
            .contains("iop_edge_single_request_terminals_total{terminal=\"cancelled\",class=\"\"} 1")
    });
}

#[test]
fn a_workspace_the_agent_may_not_use_or_no_node_serves_fails_closed() {
    let scripts = json!({"scripts": {}});
    let s = setup("agent-admission", &scripts, "");
    let body = task("none", false);
    let r = request(s.edge.http, "POST", "/v1/messages", Some(&body), &[("x-iop-workspace", "elsewhere")]);
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = request(
        s.edge.http,
        "POST",
        "/v1/messages",
        Some(b"{\"model\":\"coder\",\"max_tokens\":5,\"messages\":[]}"),
        &[],
    );
    assert_eq!(r.status, 400);
    let listed = agent_listed;
    assert!(listed(&s.edge), "a served agent is a model");
    let Setup { edge, _node: node, .. } = s;
    drop(node);
    eventually(Duration::from_secs(10), "an agent no node serves is not listed", || !listed(&edge));
    eventually(Duration::from_secs(10), "the node is gone", || {
        let r = request(edge.http, "POST", "/v1/messages", Some(&body), &[]);
        r.status == 503 || r.status == 529
    });
}

/// A config reload re-checks the node's catalog: a workspace whose root is
/// gone is refused (the agent fails closed and is not listed), and served
/// again once it is back.
#[test]
fn a_reload_rechecks_the_workspaces_the_node_serves() {
    let scripts = json!({"scripts": {"ok": {
        "plan": [plan_ok()],
        "work": [{"content": "nothing to do"}],
        "review": [verdict("approve", "fine")],
    }}});
    let s = setup("agent-reload", &scripts, "");
    let config = std::fs::read_to_string(&s.edge.config_path).unwrap();
    let root = s.root.to_str().unwrap().to_owned();
    let moved = format!("{root}-missing");
    s.edge.rewrite_config(&config.replace(&format!("root = \"{root}\""), &format!("root = \"{moved}\"")));
    s.edge.sighup();
    eventually(Duration::from_secs(10), "the refused workspace's agent is not listed", || !agent_listed(&s.edge));
    let r = ask(&s, "ok", false);
    assert!(r.status == 503 || r.status == 529, "{}", String::from_utf8_lossy(&r.body));
    s.edge.rewrite_config(&config);
    s.edge.sighup();
    eventually(Duration::from_secs(10), "the agent is served again", || agent_listed(&s.edge));
    let r = ask(&s, "ok", false);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_cleaned(&s.root);
}
