use super::*;
use crate::config::EdgeConfig;

const NODE: &str = "[http]\nlisten = \"127.0.0.1:0\"\n[node_listener]\nlisten = \"127.0.0.1:0\"\n\
    [[nodes]]\nid = \"n\"\ntoken = \"t\"\n[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\n";
const MODELS: &str = "[[models]]\nname = \"m\"\nnode = \"n\"\nprovider = \"p\"\n\
    [[models]]\nname = \"big\"\nnode = \"n\"\nprovider = \"p\"\n";
const WS: &str = "[[nodes.workspaces]]\nref = \"repo\"\nhost = \"linux\"\nroot = \"/srv/repo\"\n\
    operations = [\"write\", \"read\", \"command\"]\ncommands = { test = [\"cargo\", \"test\"] }\nenv = [\"PATH\"]\n";
const AGENT: &str =
    "[[agents]]\nname = \"coder\"\nplan = \"big\"\nwork = \"m\"\nreview = \"big\"\nworkspaces = [\"repo\"]\n";

fn parse(ws: &str, agents: &str) -> Result<EdgeConfig, ConfigError> {
    EdgeConfig::from_toml(&format!("{NODE}{ws}{MODELS}{agents}"), &|_| None)
}

fn key_of(e: ConfigError) -> String {
    match e {
        ConfigError::Key { key, .. } => key,
        other => panic!("not a key error: {other}"),
    }
}

#[test]
fn a_workspace_and_an_agent_are_read_with_their_defaults() {
    let cfg = parse(WS, AGENT).unwrap();
    let w = &cfg.nodes[0].workspaces[0];
    assert_eq!((w.reference.as_str(), w.host, w.root.as_str()), ("repo", WorkspaceHost::Linux, "/srv/repo"));
    assert_eq!(w.operations, [WorkspaceOp::Read, WorkspaceOp::Write, WorkspaceOp::Command]);
    assert_eq!(w.commands["test"], ["cargo", "test"]);
    assert_eq!(w.limits.command_timeout, Duration::from_secs(120));
    assert_eq!(w.limits.list_entries, 256);
    let a = &cfg.agents[0];
    assert_eq!((a.plan.as_str(), a.work.as_str(), a.review.as_str()), ("big", "m", "big"));
    assert_eq!(a.workspaces, ["repo"]);
    assert_eq!(a.budget.request_timeout, Duration::from_secs(600));
    assert_eq!(a.budget.repair_rounds, 1);
    // The wire form carries everything the node needs.
    let wire = w.to_wire();
    assert_eq!(wire.workspace_ref, "repo");
    assert_eq!(wire.commands[0].argv, ["cargo", "test"]);
    assert_eq!(wire.operations.len(), 3);
    assert_eq!(wire.command_timeout_ms, 120_000);
    // Neither is required.
    assert!(parse("", "").unwrap().agents.is_empty());
}

#[test]
fn every_mistake_names_its_key() {
    let ws = |extra: &str| format!("{WS}{extra}");
    let cases: Vec<(String, String, &str)> = vec![
        (WS.replace("ref = \"repo\"\n", ""), String::new(), "nodes[0].workspaces[0].ref"),
        (WS.replace("\"linux\"", "\"windows\""), String::new(), "nodes[0].workspaces[0].host"),
        (WS.replace("/srv/repo", "srv/repo"), String::new(), "nodes[0].workspaces[0].root"),
        (WS.replace("\"write\", \"read\", \"command\"", ""), String::new(), "nodes[0].workspaces[0].operations"),
        (WS.replace("\"read\"", "\"exec\""), String::new(), "nodes[0].workspaces[0].operations[1]"),
        (WS.replace("\"read\"", "\"write\""), String::new(), "nodes[0].workspaces[0].operations[1]"),
        (WS.replace("[\"cargo\", \"test\"]", "[]"), String::new(), "nodes[0].workspaces[0].commands.test"),
        (WS.replace(", \"command\"", ""), String::new(), "nodes[0].workspaces[0].commands"),
        (WS.replace("commands = { test = [\"cargo\", \"test\"] }\n", ""), String::new(), "nodes[0].workspaces[0].commands"),
        (WS.replace("\"PATH\"", "\"1PATH\""), String::new(), "nodes[0].workspaces[0].env[0]"),
        (ws("max_read_bytes = 1\n"), String::new(), "nodes[0].workspaces[0].max_read_bytes"),
        (ws("command_timeout_sec = 0\n"), String::new(), "nodes[0].workspaces[0].command_timeout_sec"),
        (ws("shell = true\n"), String::new(), "nodes[0].workspaces[0].shell"),
        (format!("{WS}{}", WS.replace("/srv/repo", "/srv/other")), String::new(), "nodes[0].workspaces[1].ref"),
        (WS.to_owned(), "[[agents]]\nname = \"m\"\nplan = \"m\"\nwork = \"m\"\nreview = \"m\"\nworkspaces = [\"repo\"]\n".to_owned(), "agents[0].name"),
        (WS.to_owned(), AGENT.replace("work = \"m\"", "work = \"nope\""), "agents[0].work"),
        (WS.to_owned(), AGENT.replace("plan = \"big\"\n", ""), "agents[0].plan"),
        (WS.to_owned(), AGENT.replace("[\"repo\"]", "[]"), "agents[0].workspaces"),
        (WS.to_owned(), AGENT.replace("[\"repo\"]", "[\"elsewhere\"]"), "agents[0].workspaces[0]"),
        (WS.to_owned(), "[[agents]]\nname = \"c\"\nplan = \"m\"\nwork = \"m\"\nreview = \"m\"\nworkspaces = [\"repo\"]\nrequest_timeout_sec = 10\nstage_timeout_sec = 20\n".to_owned(), "agents[0].stage_timeout_sec"),
        (WS.to_owned(), format!("{AGENT}{AGENT}"), "agents[1].name"),
    ];
    for (ws, agents, key) in cases {
        let err = parse(&ws, &agents).expect_err(key);
        assert_eq!(key_of(err), key, "{ws}{agents}");
    }
}
