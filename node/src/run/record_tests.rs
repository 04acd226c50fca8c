#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use iop_core::{
    config::StoreSettings,
    exec::{codes, FailureSource, RunFailure, Usage},
    rt::frames::FrameWriter,
    tunnel::TunnelItem,
    wire::pb,
};
use serde_json::Value;

use super::{Origin, Record};
use crate::{
    adapter::{mock::MockSettings, Adapter, MockAdapter},
    run::{Emitter, Gates, RunManager},
    store::{Path, Query, Store, Tuning},
};

fn store(name: &str) -> (Store, std::path::PathBuf) {
    let d = std::env::temp_dir().join(format!("iop-record-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let settings = StoreSettings { path: d.join("iop.db").to_str().unwrap().to_owned(), ..StoreSettings::default() };
    (Store::open_with(&settings, Tuning { batch_window: Duration::ZERO, ..Tuning::default() }).unwrap(), d)
}

/// A writer no edge reads: its frames only queue.
fn writer() -> FrameWriter {
    FrameWriter::new(64 << 20, 64 << 20, 256 << 20)
}

async fn row(store: &Store, id: &str) -> Value {
    serde_json::from_slice(&store.query(Query::Run { run_id: id.into() }).await.unwrap()).unwrap()
}

/// Waits (yielding to the streams' tasks) until `n` rows are committed.
async fn committed(store: &Store, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        // Blocks this reactor briefly: a test with nothing else to run.
        store.flush().unwrap();
        if store.stats().written >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}", store.stats());
        iop_core::rt::time::sleep(Duration::from_millis(2)).await;
    }
}

#[test]
fn runs_are_recorded_at_their_end_complete_refused_or_cancelled() {
    let (store, dir) = store("manager");
    iop_core::rt::block_on_current(async {
        let fast = MockSettings { tokens: 3, ..Default::default() };
        let slow = MockSettings { tokens: 1000, token_interval: Duration::from_millis(50), ..Default::default() };
        let adapters = vec![
            Adapter::Mock(MockAdapter::new("fast".into(), 4, fast)),
            Adapter::Mock(MockAdapter::new("slow".into(), 4, slow)),
        ];
        let manager = RunManager::new(adapters, Gates::new(), writer());
        manager.set_store(store.clone());
        let body =
            Bytes::from_static(br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there"}]}"#);
        let run = |id: &str, adapter: &str, session: &str| pb::RunRequest {
            run_id: id.into(),
            adapter: adapter.into(),
            target: "m".into(),
            session_id: session.into(),
            body: body.clone(),
            ..Default::default()
        };
        manager.start(run("r1", "fast", "sess-1"));
        manager.start(run("r2", "nowhere", ""));
        manager.start(run("r3", "slow", "sess-1"));
        manager.start_tunnel(pb::ProviderTunnelRequest {
            tunnel_id: "t1".into(),
            adapter: "fast".into(),
            target: "m".into(),
            method: "POST".into(),
            path: "/chat/completions".into(),
            body: body.clone(),
            session_id: "sess-2".into(),
            ..Default::default()
        });
        // A duplicate of a run in flight is ignored: no row for it.
        manager.start(run("r3", "slow", "dup"));
        committed(&store, 3).await;
        manager.cancel("r3");
        committed(&store, 4).await;

        let r1 = row(&store, "r1").await;
        assert_eq!(
            (r1["status"].as_str(), r1["code"].as_i64(), r1["path"].as_str(), r1["operation"].as_str()),
            (Some("complete"), Some(200), Some("normalized"), Some("chat"))
        );
        assert_eq!(
            (r1["session_id"].as_str(), r1["adapter"].as_str(), r1["target"].as_str()),
            (Some("sess-1"), Some("fast"), Some("m"))
        );
        assert_eq!(r1["usage"]["output"].as_i64(), Some(3), "{r1}");
        assert_eq!(r1["error_class"], Value::Null);
        let q = r1["queued_at_ms"].as_i64().unwrap();
        let (s, f, e) = (
            r1["started_at_ms"].as_i64().unwrap(),
            r1["first_byte_at_ms"].as_i64().unwrap(),
            r1["ended_at_ms"].as_i64().unwrap(),
        );
        assert!(q <= s && s <= f && f <= e, "{r1}");

        let r2 = row(&store, "r2").await;
        assert_eq!(
            (r2["status"].as_str(), r2["code"].as_i64(), r2["error_class"].as_str()),
            (Some("error"), Some(404), Some(codes::UNKNOWN_ADAPTER))
        );
        assert_eq!(
            (r2["session_id"].clone(), r2["started_at_ms"].clone()),
            (Value::Null, Value::Null),
            "refused: never started"
        );

        // The mock takes no tunnels: an error, on the tunnel path.
        let t1 = row(&store, "t1").await;
        assert_eq!(
            (t1["status"].as_str(), t1["code"].as_i64(), t1["path"].as_str(), t1["operation"].clone()),
            (Some("error"), Some(501), Some("tunnel"), Value::Null)
        );
        assert_eq!(t1["session_id"].as_str(), Some("sess-2"));

        let r3 = row(&store, "r3").await;
        assert_eq!(
            (r3["status"].as_str(), r3["code"].clone(), r3["session_id"].as_str()),
            (Some("cancelled"), Value::Null, Some("sess-1"))
        );
        assert!(r3["started_at_ms"].is_i64(), "{r3}");
        assert_eq!(store.stats().written, 4, "one row each, none for the duplicate");
    })
    .unwrap();
    store.close();
    let _ = std::fs::remove_dir_all(&dir);
}

fn origin(id: &str) -> Origin<'_> {
    Origin { run_id: id, session_id: "", adapter: "p", target: "m", path: Path::Tunnel, operation: None }
}

#[test]
fn a_tunnel_row_keeps_its_provider_status_usage_and_first_byte() {
    let (store, dir) = store("tunnel");
    iop_core::rt::block_on_current(async {
        let usage =
            Usage { input_tokens: 7, output_tokens: 5, reasoning_tokens: Some(2), cached_input_tokens: Some(4) };
        let mut e = Emitter::<TunnelItem>::new(writer(), "ok".into())
            .with_record(Some(Record::new(std::rc::Rc::new(store.clone()), origin("ok"))));
        e.send(TunnelItem::Start { status: 200, headers: vec![] }).await.unwrap();
        e.send(TunnelItem::Body(Bytes::from_static(b"data: {}\n\n"))).await.unwrap();
        e.send(TunnelItem::End { usage: Some(usage) }).await.unwrap();
        // Failed after the provider's head: its status stays.
        let mut e2 = Emitter::<TunnelItem>::new(writer(), "broke".into())
            .with_record(Some(Record::new(std::rc::Rc::new(store.clone()), origin("broke"))));
        e2.send(TunnelItem::Start { status: 200, headers: vec![] }).await.unwrap();
        let f = RunFailure::new(codes::UPSTREAM_PROTOCOL, 502, FailureSource::Provider, "cut");
        e2.send(TunnelItem::Error(f)).await.unwrap();
        // Gone without a terminal: cancelled.
        let e3 = Emitter::<TunnelItem>::new(writer(), "gone".into())
            .with_record(Some(Record::new(std::rc::Rc::new(store.clone()), origin("gone"))));
        drop(e3);
        committed(&store, 3).await;

        let ok = row(&store, "ok").await;
        assert_eq!((ok["status"].as_str(), ok["code"].as_i64()), (Some("complete"), Some(200)));
        assert_eq!(ok["usage"], serde_json::json!({"input": 7, "output": 5, "reasoning": 2, "cached": 4}));
        assert!(ok["first_byte_at_ms"].is_i64(), "{ok}");
        assert_eq!(ok["started_at_ms"], Value::Null, "started is the manager's to note");
        let broke = row(&store, "broke").await;
        assert_eq!(
            (
                broke["status"].as_str(),
                broke["code"].as_i64(),
                broke["error_class"].as_str(),
                broke["first_byte_at_ms"].clone()
            ),
            (Some("error"), Some(200), Some(codes::UPSTREAM_PROTOCOL), Value::Null)
        );
        let gone = row(&store, "gone").await;
        assert_eq!((gone["status"].as_str(), gone["code"].clone()), (Some("cancelled"), Value::Null));
    })
    .unwrap();
    store.close();
    let _ = std::fs::remove_dir_all(&dir);
}
