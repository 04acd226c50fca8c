use super::*;

const ALL: [WorkspaceOp; 5] =
    [WorkspaceOp::Read, WorkspaceOp::List, WorkspaceOp::Write, WorkspaceOp::Delete, WorkspaceOp::Command];

fn ids() -> Vec<String> {
    vec!["test".to_owned()]
}

#[test]
fn calls_decode_strictly() {
    let d = |n: &str, a: &str| ToolCall::decode(n, a, &ALL, &ids());
    assert_eq!(d("workspace_read", r#"{"path":"a.txt"}"#), Ok(ToolCall::Read { path: "a.txt".into() }));
    assert_eq!(
        d("workspace_list", r#"{"path":"","after":null}"#),
        Ok(ToolCall::List { path: String::new(), after: None })
    );
    assert_eq!(
        d("workspace_write", r#"{"path":"a","content":"x"}"#),
        Ok(ToolCall::Write { path: "a".into(), content: "x".into() })
    );
    assert_eq!(d("workspace_command", r#"{"command":"test"}"#), Ok(ToolCall::Command { command: "test".into() }));
    assert_eq!(d("workspace_command", r#"{"command":"rm"}"#), Err(Refused::CommandDenied));
    assert_eq!(d("workspace_read", r#"{"path":"a","extra":1}"#), Err(Refused::BadArguments));
    assert_eq!(d("workspace_read", r#"{}"#), Err(Refused::BadArguments));
    assert_eq!(d("workspace_read", r#"{"path":1}"#), Err(Refused::BadArguments));
    assert_eq!(d("workspace_read", "not json"), Err(Refused::BadArguments));
    assert_eq!(d("shell", r#"{"cmd":"ls"}"#), Err(Refused::UnknownTool));
    // A tool of an operation not admitted is not there.
    let read_only = ToolCall::decode("workspace_write", r#"{"path":"a","content":"x"}"#, &[WorkspaceOp::Read], &[]);
    assert_eq!(read_only, Err(Refused::UnknownTool));
}

#[test]
fn schemas_offer_only_what_was_admitted() {
    let s = schemas(&[WorkspaceOp::Read, WorkspaceOp::Command], &ids());
    let names: Vec<&str> = s.iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["workspace_read", "workspace_command"]);
    assert_eq!(s[1]["function"]["parameters"]["properties"]["command"]["enum"], json!(["test"]));
    assert_eq!(s[0]["function"]["parameters"]["additionalProperties"], json!(false));
}

#[test]
fn requests_carry_the_identities_and_results_project_typed() {
    let r = ToolCall::Write { path: "a".into(), content: "x".into() }.request("req", "work-1", "t1");
    assert_eq!((r.request_id.as_str(), r.stage_id.as_str(), r.tool_id.as_str()), ("req", "work-1", "t1"));
    assert_eq!(r.operation, pb::WorkspaceOperation::Write as i32);
    assert_eq!(&r.content[..], b"x");
    let ok = pb::WorkspaceToolResponse {
        operation: pb::WorkspaceOperation::Command as i32,
        status: pb::WorkspaceStatus::Ok as i32,
        content: b"1 passed".to_vec().into(),
        exit_code: Some(1),
        ..Default::default()
    };
    let v = project(&ok).unwrap();
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["output"], "1 passed");
    assert_eq!(output_bytes(&ok), 8);
    let refused = pb::WorkspaceToolResponse {
        status: pb::WorkspaceStatus::Invalid as i32,
        error: "symlink".into(),
        ..Default::default()
    };
    assert_eq!(project(&refused), Err((pb::WorkspaceStatus::Invalid, "symlink".into())));
}
