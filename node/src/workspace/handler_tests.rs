use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use pb::{WorkspaceArtifactKind as Kind, WorkspaceArtifactOperation as ArtOp};

use super::*;
use crate::workspace::{cleanup::CleanupStart, requests::Limits};

/// A scratch workspace (`ws`, with a user file) and `outside` beside it.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!("iop-handler-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("ws/src")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("ws/src/user.rs"), b"user").unwrap();
        Self(base)
    }

    fn ws(&self) -> PathBuf {
        self.0.join("ws")
    }

    fn job(&self, id: &str) -> PathBuf {
        self.ws().join(".iop/job").join(id)
    }

    fn entry(&self) -> pb::WorkspaceConfig {
        let sh = |id: &str, script: &str| pb::WorkspaceCommand {
            id: id.into(),
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        };
        pb::WorkspaceConfig {
            workspace_ref: "ws".into(),
            host: pb::WorkspaceHost::Linux as i32,
            root: self.ws().to_str().unwrap().into(),
            operations: [Op::Read, Op::List, Op::Write, Op::Delete, Op::Command].map(|o| o as i32).to_vec(),
            commands: vec![sh("hello", "echo hello"), sh("sleep", "sleep 30")],
            env: vec!["PATH".into(), "HOME".into()],
            max_read_bytes: 1024,
            max_write_bytes: 1024,
            max_list_entries: 10,
            command_timeout_ms: 60_000,
            max_output_bytes: 4096,
        }
    }

    fn workspaces(&self, limits: Limits) -> Arc<Workspaces> {
        let ws = Workspaces::new(limits);
        ws.install(&[self.entry()]);
        ws
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An open of `ws` asking for `ops` and `commands`, with the entry's limits.
fn open_req(id: &str, ops: &[Op], commands: &[&str]) -> pb::WorkspaceOpenRequest {
    pb::WorkspaceOpenRequest {
        request_id: id.into(),
        workspace_ref: "ws".into(),
        operations: ops.iter().map(|o| *o as i32).collect(),
        command_ids: commands.iter().map(|c| (*c).to_owned()).collect(),
        env: vec!["PATH".into()],
        max_read_bytes: 1024,
        max_write_bytes: 1024,
        max_list_entries: 10,
        command_timeout_ms: 60_000,
        max_output_bytes: 4096,
    }
}

fn tool_req(id: &str, tool_id: &str, op: Op, path: &str) -> pb::WorkspaceToolRequest {
    pb::WorkspaceToolRequest {
        request_id: id.into(),
        stage_id: "stage-1".into(),
        tool_id: tool_id.into(),
        operation: op as i32,
        path: path.into(),
        ..Default::default()
    }
}

fn write_req(id: &str, tool_id: &str, path: &str, content: &[u8]) -> pb::WorkspaceToolRequest {
    pb::WorkspaceToolRequest { content: Bytes::copy_from_slice(content), ..tool_req(id, tool_id, Op::Write, path) }
}

fn command_req(id: &str, tool_id: &str, command_id: &str) -> pb::WorkspaceToolRequest {
    pb::WorkspaceToolRequest { command_id: command_id.into(), ..tool_req(id, tool_id, Op::Command, "") }
}

fn cleanup_req(id: &str) -> pb::WorkspaceCleanupRequest {
    pb::WorkspaceCleanupRequest { request_id: id.into() }
}

fn status(s: i32) -> Status {
    Status::try_from(s).unwrap()
}

const ALL: [Op; 5] = [Op::Read, Op::List, Op::Write, Op::Delete, Op::Command];

#[test]
fn an_open_within_the_catalog_is_served_and_one_beyond_it_refused() {
    let s = Scratch::new("open");
    let ws = s.workspaces(Limits::default());
    let ok = ws.open(&open_req("req-1", &[Op::Read, Op::Write], &["hello"]));
    assert_eq!((status(ok.status), ok.error.as_str()), (Status::Ok, ""));
    assert_eq!(ok.request_id, "req-1");
    assert!(s.job("req-1").is_dir());
    let again = ws.open(&open_req("req-1", &[Op::Read], &[]));
    assert_eq!((status(again.status), again.error.as_str()), (Status::Refused, label::ALREADY_OPEN));

    let beyond = |f: &dyn Fn(&mut pb::WorkspaceOpenRequest)| {
        let mut req = open_req("req-2", &[Op::Read], &[]);
        f(&mut req);
        let r = ws.open(&req);
        (status(r.status), r.error)
    };
    let exceeds = (Status::Refused, label::AUTHORITY_EXCEEDS_CATALOG.to_owned());
    assert_eq!(beyond(&|r| r.command_ids.push("rm-rf".into())), exceeds);
    assert_eq!(beyond(&|r| r.env.push("AWS_SECRET_ACCESS_KEY".into())), exceeds);
    assert_eq!(beyond(&|r| r.operations.push(Op::Unspecified as i32)), exceeds);
    assert_eq!(beyond(&|r| r.operations.push(99)), exceeds);
    assert_eq!(beyond(&|r| r.max_read_bytes = 1025), exceeds);
    assert_eq!(beyond(&|r| r.max_write_bytes = 0), exceeds);
    assert_eq!(beyond(&|r| r.max_list_entries = 11), exceeds);
    assert_eq!(beyond(&|r| r.command_timeout_ms = 60_001), exceeds);
    assert_eq!(beyond(&|r| r.max_output_bytes = 0), exceeds);
    assert_eq!(beyond(&|r| r.workspace_ref = "other".into()), (Status::Refused, label::UNKNOWN_WORKSPACE.into()));
    for bad in ["", "a/b", "..", "a.b", &"x".repeat(129)] {
        assert_eq!(beyond(&|r| r.request_id = bad.into()), (Status::Invalid, label::REQUEST_ID_INVALID.into()));
    }
    // None of them reserved anything.
    assert_eq!(ws.table().open.len(), 1);
    assert!(!s.job("req-2").exists());

    // An operation the entry lacks is beyond it too.
    let mut narrow = s.entry();
    narrow.operations = vec![Op::Read as i32];
    ws.install(&[narrow]);
    assert_eq!(beyond(&|r| r.operations.push(Op::Write as i32)), exceeds);
    // The latest catalog wins; a request opened before keeps its authority.
    ws.install(&[]);
    assert_eq!(beyond(&|_| {}), (Status::Refused, label::UNKNOWN_WORKSPACE.into()));
    let write = ws.tool(&write_req("req-1", "t1", "kept.txt", b"x"));
    assert_eq!(status(write.status), Status::Ok);
}

#[test]
fn tools_need_an_open_request_and_a_granted_operation_and_command() {
    let s = Scratch::new("deny");
    let ws = s.workspaces(Limits::default());
    let before = ws.tool(&tool_req("req-1", "t0", Op::Read, "src/user.rs"));
    assert_eq!((status(before.status), before.error.as_str()), (Status::Refused, label::NOT_OPEN));
    assert_eq!(status(ws.open(&open_req("req-1", &[Op::Read, Op::Command], &["hello"])).status), Status::Ok);
    let write = ws.tool(&write_req("req-1", "t1", "new.txt", b"x"));
    assert_eq!((status(write.status), write.error.as_str()), (Status::Denied, label::OPERATION_DENIED));
    assert!(!s.ws().join("new.txt").exists());
    let unspecified = ws.tool(&tool_req("req-1", "t2", Op::Unspecified, "src/user.rs"));
    assert_eq!(status(unspecified.status), Status::Denied);
    let sleep = ws.tool(&command_req("req-1", "t3", "sleep"));
    assert_eq!((status(sleep.status), sleep.error.as_str()), (Status::Denied, label::COMMAND_DENIED));
    let hello = ws.tool(&command_req("req-1", "t4", "hello"));
    assert_eq!(status(hello.status), Status::Ok);
    assert_eq!((&hello.content[..], hello.exit_code, hello.timed_out), (&b"hello\n"[..], Some(0), false));
    // The identities are echoed.
    assert_eq!(
        (hello.request_id.as_str(), hello.stage_id.as_str(), hello.tool_id.as_str(), hello.operation),
        ("req-1", "stage-1", "t4", Op::Command as i32)
    );
}

#[test]
fn files_are_written_read_listed_and_deleted_through_the_tools() {
    let s = Scratch::new("files");
    let ws = s.workspaces(Limits::default());
    assert_eq!(status(ws.open(&open_req("req-1", &ALL, &[])).status), Status::Ok);
    assert_eq!(status(ws.tool(&write_req("req-1", "w", "src/new.rs", b"fn f() {}")).status), Status::Ok);
    let read = ws.tool(&tool_req("req-1", "r", Op::Read, "src/new.rs"));
    assert_eq!((status(read.status), &read.content[..], read.truncated), (Status::Ok, &b"fn f() {}"[..], false));
    let mut list = tool_req("req-1", "l", Op::List, "src");
    list.after = "a".into();
    let listed = ws.tool(&list);
    let names: Vec<(&str, i32)> = listed.entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    let file = pb::WorkspaceEntryKind::File as i32;
    assert_eq!(names, [("new.rs", file), ("user.rs", file)]);
    assert!(!listed.more);
    let top = ws.tool(&tool_req("req-1", "l2", Op::List, ""));
    assert_eq!(top.entries.len(), 1, "the root lists without .iop");
    assert_eq!(status(ws.tool(&tool_req("req-1", "d", Op::Delete, "src/new.rs")).status), Status::Ok);
    let gone = ws.tool(&tool_req("req-1", "r2", Op::Read, "src/new.rs"));
    assert_eq!((status(gone.status), gone.error.as_str()), (Status::Failed, "not_found"));
    let dir = ws.tool(&tool_req("req-1", "r3", Op::Read, "src"));
    assert_eq!((status(dir.status), dir.error.as_str()), (Status::Invalid, "not_a_file"));
}

#[test]
fn bad_paths_sizes_and_tool_ids_are_refused_with_no_effect() {
    let s = Scratch::new("paths");
    let ws = s.workspaces(Limits::default());
    assert_eq!(status(ws.open(&open_req("req-1", &ALL, &[])).status), Status::Ok);
    let outside = s.0.join("outside/x");
    let bad = [
        ("../outside/x", "path_invalid"),
        (outside.to_str().unwrap(), "path_invalid"),
        (".iop/job/req-1/plan.md", "path_reserved"),
        ("src/../../outside/x", "path_invalid"),
    ];
    for (n, (path, err)) in bad.iter().enumerate() {
        let w = ws.tool(&write_req("req-1", &format!("w{n}"), path, b"pwned"));
        assert_eq!((status(w.status), w.error.as_str()), (Status::Invalid, *err), "write {path}");
        let d = ws.tool(&tool_req("req-1", &format!("d{n}"), Op::Delete, path));
        assert_eq!((status(d.status), d.error.as_str()), (Status::Invalid, *err), "delete {path}");
    }
    assert!(!outside.exists());
    assert_eq!(std::fs::read_dir(s.job("req-1")).unwrap().count(), 0);
    let big = ws.tool(&write_req("req-1", "big", "big.bin", &[0; 1025]));
    assert_eq!((status(big.status), big.error.as_str()), (Status::Invalid, label::TOO_LARGE));
    assert!(!s.ws().join("big.bin").exists());
    // A refused call does not use its tool id up; a served one does.
    assert_eq!(status(ws.tool(&write_req("req-1", "big", "small.bin", b"x")).status), Status::Ok);
    let dup = ws.tool(&tool_req("req-1", "big", Op::Read, "small.bin"));
    assert_eq!((status(dup.status), dup.error.as_str()), (Status::Refused, label::DUPLICATE_TOOL_ID));
    let empty = ws.tool(&tool_req("req-1", "", Op::Read, "small.bin"));
    assert_eq!((status(empty.status), empty.error.as_str()), (Status::Invalid, label::TOOL_ID_INVALID));
}

#[test]
fn a_request_uses_a_bounded_number_of_tool_ids() {
    let s = Scratch::new("toolids");
    let ws = s.workspaces(Limits { max_tool_ids: 2, ..Limits::default() });
    assert_eq!(status(ws.open(&open_req("req-1", &ALL, &[])).status), Status::Ok);
    for t in ["a", "b"] {
        assert_eq!(status(ws.tool(&tool_req("req-1", t, Op::List, "")).status), Status::Ok);
    }
    let third = ws.tool(&tool_req("req-1", "c", Op::List, ""));
    assert_eq!((status(third.status), third.error.as_str()), (Status::Refused, label::TOO_MANY_TOOLS));
}

#[test]
fn a_call_dropped_unrun_gives_its_reservation_back() {
    let s = Scratch::new("unrun");
    let ws = s.workspaces(Limits::default());
    assert_eq!(status(ws.open(&open_req("req-1", &ALL, &["hello"])).status), Status::Ok);
    // As when no thread could be started for them.
    drop(ws.begin_tool(&command_req("req-1", "t1", "hello")).unwrap());
    {
        let table = ws.table();
        let slot = &table.open["req-1"];
        assert_eq!((slot.in_flight, slot.running.len(), slot.tool_ids.len()), (0, 0, 0));
    }
    assert_eq!(status(ws.tool(&command_req("req-1", "t1", "hello")).status), Status::Ok);
    drop(ws.begin_open(&open_req("req-2", &ALL, &[])).unwrap());
    assert!(!ws.table().open.contains_key("req-2"));
    let CleanupStart::First(ticket) = ws.begin_cleanup("req-1") else { panic!("first cleanup") };
    drop(ticket);
    assert!(!ws.table().open["req-1"].closing, "a later cleanup may run");
    assert_eq!(status(ws.cleanup(&cleanup_req("req-1")).status), Status::Ok);
}

#[test]
fn artifacts_are_written_and_read_by_kind() {
    let s = Scratch::new("artifact");
    let ws = s.workspaces(Limits::default());
    let art = |kind: Kind, op: ArtOp, content: &[u8]| pb::WorkspaceArtifactRequest {
        request_id: "req-1".into(),
        stage_id: "plan".into(),
        kind: kind as i32,
        operation: op as i32,
        content: Bytes::copy_from_slice(content),
    };
    let before = ws.artifact(&art(Kind::Plan, ArtOp::Read, b""));
    assert_eq!((status(before.status), before.error.as_str()), (Status::Refused, label::NOT_OPEN));
    assert_eq!(status(ws.open(&open_req("req-1", &[Op::Read], &[])).status), Status::Ok);
    let missing = ws.artifact(&art(Kind::Plan, ArtOp::Read, b""));
    assert_eq!((status(missing.status), missing.error.as_str()), (Status::Failed, "not_found"));
    let wrote = ws.artifact(&art(Kind::Plan, ArtOp::Write, b"# plan"));
    assert_eq!(
        (status(wrote.status), wrote.kind, wrote.operation),
        (Status::Ok, Kind::Plan as i32, ArtOp::Write as i32)
    );
    let read = ws.artifact(&art(Kind::Plan, ArtOp::Read, b""));
    assert_eq!((status(read.status), &read.content[..], read.truncated), (Status::Ok, &b"# plan"[..], false));
    assert_eq!(std::fs::read(s.job("req-1").join("plan.md")).unwrap(), b"# plan");
    for (kind, op) in [(Kind::Unspecified, ArtOp::Read), (Kind::Review, ArtOp::Unspecified)] {
        let r = ws.artifact(&art(kind, op, b""));
        assert_eq!((status(r.status), r.error.as_str()), (Status::Invalid, label::ARTIFACT_INVALID));
    }
    let big = ws.artifact(&art(Kind::Review, ArtOp::Write, &[b'x'; 1025]));
    assert_eq!((status(big.status), big.error.as_str()), (Status::Invalid, label::TOO_LARGE));
    assert!(!s.job("req-1").join("review.md").exists());
}

/// Runs the `sleep` template as tool `t` on a thread; returns once it runs.
fn start_sleep(ws: &Arc<Workspaces>, id: &str, t: &str) -> std::thread::JoinHandle<pb::WorkspaceToolResponse> {
    let (ws2, req) = (ws.clone(), command_req(id, t, "sleep"));
    let handle = std::thread::spawn(move || ws2.tool(&req));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ws.table().open.get(id).is_none_or(|s| !s.running.contains_key(t)) {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Past its start, most likely: the cancel then kills a running process.
    std::thread::sleep(Duration::from_millis(200));
    handle
}

#[test]
fn a_cancelled_command_ends_at_once_as_cancelled() {
    let s = Scratch::new("cancel");
    let ws = s.workspaces(Limits::default());
    assert_eq!(status(ws.open(&open_req("req-1", &[Op::Command], &["sleep"])).status), Status::Ok);
    let running = start_sleep(&ws, "req-1", "t1");
    let began = Instant::now();
    let other = ws.cancel(&pb::WorkspaceCancelRequest { request_id: "req-1".into(), tool_id: "t9".into() });
    assert_eq!((status(other.status), other.cancelled), (Status::Ok, 0));
    let cancel = ws.cancel(&pb::WorkspaceCancelRequest { request_id: "req-1".into(), tool_id: "t1".into() });
    assert_eq!((status(cancel.status), cancel.cancelled), (Status::Ok, 1));
    let ended = running.join().unwrap();
    assert!(began.elapsed() < Duration::from_secs(5), "took {:?}", began.elapsed());
    assert_eq!((status(ended.status), ended.timed_out), (Status::Cancelled, false));
    assert!(ws.table().open["req-1"].running.is_empty());
    let closed = ws.cancel(&pb::WorkspaceCancelRequest { request_id: "nope".into(), tool_id: String::new() });
    assert_eq!(status(closed.status), Status::Refused);
}

#[test]
fn cleanup_removes_the_job_once_and_closes_the_request() {
    let s = Scratch::new("cleanup");
    let ws = s.workspaces(Limits::default());
    // Never opened here: nothing to clean.
    assert_eq!(status(ws.cleanup(&cleanup_req("never")).status), Status::Ok);
    assert_eq!(status(ws.open(&open_req("req-1", &ALL, &["sleep"])).status), Status::Ok);
    assert_eq!(status(ws.tool(&write_req("req-1", "w", "src/made.rs", b"x")).status), Status::Ok);
    let plan = pb::WorkspaceArtifactRequest {
        request_id: "req-1".into(),
        kind: Kind::Plan as i32,
        operation: ArtOp::Write as i32,
        content: Bytes::from_static(b"p"),
        ..Default::default()
    };
    assert_eq!(status(ws.artifact(&plan).status), Status::Ok);
    // A running command is cancelled and waited for; a concurrent cleanup
    // gets the same answer.
    let running = start_sleep(&ws, "req-1", "t1");
    let began = Instant::now();
    let CleanupStart::First(ticket) = ws.begin_cleanup("req-1") else { panic!("first cleanup") };
    assert!(matches!(ws.begin_cleanup("req-1"), CleanupStart::Pending));
    let late = ws.tool(&tool_req("req-1", "late", Op::Read, "src/user.rs"));
    assert_eq!((status(late.status), late.error.as_str()), (Status::Refused, label::NOT_OPEN));
    let second = {
        let ws = ws.clone();
        std::thread::spawn(move || ws.wait_cleaned("req-1"))
    };
    let first = ticket.run();
    assert_eq!((status(first.status), first.error.as_str()), (Status::Ok, ""));
    assert_eq!(second.join().unwrap(), first);
    assert_eq!(status(running.join().unwrap().status), Status::Cancelled);
    assert!(began.elapsed() < Duration::from_secs(5), "took {:?}", began.elapsed());

    assert!(!s.job("req-1").exists());
    assert_eq!(std::fs::read(s.ws().join("src/user.rs")).unwrap(), b"user");
    assert_eq!(std::fs::read(s.ws().join("src/made.rs")).unwrap(), b"x");
    assert!(ws.table().open.is_empty());
    assert_eq!(ws.cleanup(&cleanup_req("req-1")), first, "a second cleanup gets the first one's result");
    let after = ws.tool(&tool_req("req-1", "t2", Op::Read, "src/user.rs"));
    assert_eq!((status(after.status), after.error.as_str()), (Status::Refused, label::NOT_OPEN));
    let reopen = ws.open(&open_req("req-1", &ALL, &[]));
    assert_eq!((status(reopen.status), reopen.error.as_str()), (Status::Refused, label::ALREADY_OPEN));
}

#[test]
fn the_open_table_and_the_operation_threads_are_bounded() {
    let s = Scratch::new("busy");
    let ws = s.workspaces(Limits { max_open: 1, max_threads: 2, ..Limits::default() });
    assert_eq!(status(ws.open(&open_req("req-1", &ALL, &[])).status), Status::Ok);
    let full = ws.open(&open_req("req-2", &ALL, &[]));
    assert_eq!((status(full.status), full.error.as_str()), (Status::Busy, label::BUSY));
    assert!(!s.job("req-2").exists());
    assert_eq!(status(ws.cleanup(&cleanup_req("req-1")).status), Status::Ok);
    assert_eq!(status(ws.open(&open_req("req-2", &ALL, &[])).status), Status::Ok);

    let (a, b) = (ws.permit().unwrap(), ws.permit().unwrap());
    assert!(ws.permit().is_none());
    drop(a);
    assert_eq!(ws.threads(), 1);
    let c = ws.permit();
    assert!(c.is_some());
    drop((b, c));
    assert_eq!(ws.threads(), 0);
}

#[test]
fn a_failed_open_takes_its_reservation_back() {
    let s = Scratch::new("failed");
    let ws = s.workspaces(Limits::default());
    std::fs::remove_dir_all(s.ws()).unwrap();
    let failed = ws.open(&open_req("req-1", &ALL, &[]));
    assert_eq!((status(failed.status), failed.error.as_str()), (Status::Failed, "not_found"));
    assert!(ws.table().open.is_empty());
    std::fs::create_dir_all(s.ws()).unwrap();
    assert_eq!(status(ws.open(&open_req("req-1", &ALL, &[])).status), Status::Ok);
}

#[test]
fn calls_served_on_a_reactor_are_answered_off_it_with_their_correlation_id() {
    use bytes::BytesMut;
    use iop_core::{
        rt::frames::{FrameReader, FrameWriter},
        wire::{pb::envelope::Body, DEFAULT_MAX_FRAME_BYTES},
    };
    use monoio::net::{TcpListener, TcpStream};

    let s = Scratch::new("serve");
    let ws = s.workspaces(Limits::default());
    let job2 = s.job("req-2");
    iop_core::rt::block_on_current(async move {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (edge_side, _) = listener.accept().await.unwrap();
        let writer = FrameWriter::new(DEFAULT_MAX_FRAME_BYTES, 1 << 20, 1 << 24);
        monoio::spawn(writer.clone().run(conn));
        let mut reader = FrameReader::new(edge_side, DEFAULT_MAX_FRAME_BYTES, BytesMut::new());
        let mut next = async || reader.next().await.unwrap().unwrap();
        let opened = crate::workspace::Opened::default();

        crate::workspace::serve(
            7,
            Body::WorkspaceOpenRequest(open_req("req-1", &ALL, &["sleep"])),
            &ws,
            &writer,
            &opened,
        );
        let env = next().await;
        let Some(Body::WorkspaceOpenResponse(open)) = env.body else { panic!("open answer") };
        assert_eq!((env.correlation_id, status(open.status)), (7, Status::Ok));

        crate::workspace::serve(
            8,
            Body::WorkspaceToolRequest(command_req("req-1", "t1", "sleep")),
            &ws,
            &writer,
            &opened,
        );
        // The reactor is free while the command runs: the cancel is answered first.
        while ws.table().open["req-1"].running.is_empty() {
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        let cancel = pb::WorkspaceCancelRequest { request_id: "req-1".into(), tool_id: String::new() };
        crate::workspace::serve(9, Body::WorkspaceCancelRequest(cancel), &ws, &writer, &opened);
        let env = next().await;
        let Some(Body::WorkspaceCancelResponse(c)) = env.body else { panic!("cancel answer") };
        assert_eq!((env.correlation_id, c.cancelled), (9, 1));
        let env = next().await;
        let Some(Body::WorkspaceToolResponse(t)) = env.body else { panic!("tool answer") };
        assert_eq!((env.correlation_id, status(t.status), t.tool_id.as_str()), (8, Status::Cancelled, "t1"));

        crate::workspace::serve(10, Body::WorkspaceCleanupRequest(cleanup_req("req-1")), &ws, &writer, &opened);
        let env = next().await;
        let Some(Body::WorkspaceCleanupResponse(c)) = env.body else { panic!("cleanup answer") };
        assert_eq!((env.correlation_id, status(c.status)), (10, Status::Ok));
        assert_eq!(ws.threads(), 0);

        // A request opened through a session that then ends is cleaned up
        // by it: no cleanup call would ever come on another link.
        crate::workspace::serve(
            11,
            Body::WorkspaceOpenRequest(open_req("req-2", &ALL, &["sleep"])),
            &ws,
            &writer,
            &opened,
        );
        let env = next().await;
        assert_eq!(env.correlation_id, 11);
        assert!(job2.exists());
        opened.clean_all(&ws);
        for _ in 0..1000 {
            if !job2.exists() {
                break;
            }
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .unwrap();
    assert!(!s.job("req-1").exists());
    assert!(!s.job("req-2").exists(), "the ended session's request is cleaned");
}
