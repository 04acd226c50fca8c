//! Sealed credential leases (managed mode). With a real edge: the provider
//! key reaches the provider only through a run's lease, never the node's
//! config or logs. With a scripted edge (this file's `FakeEdge`, speaking
//! the wire to a real `iop-node`): each of the seven refusals fails the run
//! closed, typed, counted, with no provider call.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::Duration,
};

use bytes::BytesMut;
use iop_core::{
    lease::{self, Issuer, Opener},
    wire::{self, pb, pb::envelope::Body},
};
use serde_json::json;

use crate::{harness::*, pki::*};

const SECRET: &str = "sk-upstream-leased-secret";
const MAX_FRAME: usize = 1 << 20;

#[test]
fn in_managed_mode_the_provider_key_travels_only_in_the_runs_lease() {
    let pki = Pki::new();
    let edge_leaf = pki.leaf(&["127.0.0.1"]);
    let mock = MockProv::start(&["--tokens", "2"]);
    let cfg = format!(
        "{}\n[node_listener.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
        edge_config(&mock.base_url(), "").replacen(
            "capacity = 16\n",
            &format!("capacity = 16\napi_key = \"{SECRET}\"\n"),
            1
        ),
        edge_leaf.cert.display(),
        edge_leaf.key.display(),
        pki.ca.display()
    );
    let edge = Edge::start(&cfg);
    let n1 = pki.leaf(&["n1"]);
    let tls = format!(
        "[edge_tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
        pki.ca.display(),
        n1.cert.display(),
        n1.key.display()
    );
    let node = edge.node_with(NODE_TOKEN, &tls, &[("IOP_LOG", "debug")]);
    edge.wait_nodes_ready(1);
    for stream in [false, true] {
        let body = json!({"model": "gpt-test", "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
        let r = post_json(edge.http, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let last = request(mock.addr, "GET", "/last", None, &[]).json();
        let auth = last["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("authorization"));
        assert_eq!(auth.map(|h| h[1].clone()), Some(json!(format!("Bearer {SECRET}"))), "{last}");
    }
    assert!(!node.log_text().contains(SECRET), "the node logged the leased secret");
}

/// A scripted edge: registers one single-link node and sends it runs.
struct FakeEdge {
    stream: TcpStream,
    buf: BytesMut,
    issuer: Issuer,
    node_key: Vec<u8>,
    generation: u64,
}

impl FakeEdge {
    fn frame(&mut self) -> pb::Envelope {
        loop {
            if let Some(env) = wire::decode(&mut self.buf, MAX_FRAME).unwrap() {
                return env;
            }
            let mut chunk = [0u8; 16384];
            let n = self.stream.read(&mut chunk).expect("read from node");
            assert!(n > 0, "the node closed the link");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(&mut self, cid: u64, body: Body) {
        let mut out = BytesMut::new();
        wire::encode(&pb::Envelope { correlation_id: cid, body: Some(body) }, &mut out, MAX_FRAME).unwrap();
        self.stream.write_all(&out).unwrap();
    }

    /// Accepts the node, registers it with providers `up` (leased, at
    /// `base_url`) and `open` (not leased), and takes its ready.
    fn accept(listener: &TcpListener, base_url: &str, ttl: Duration) -> FakeEdge {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let issuer = Issuer::generate(ttl).unwrap();
        let mut edge = FakeEdge { stream, buf: BytesMut::new(), issuer, node_key: Vec::new(), generation: 7 };
        let env = edge.frame();
        let Some(Body::RegisterRequest(req)) = env.body else { panic!("expected RegisterRequest") };
        assert_eq!(req.lease_key.len(), 32, "the node sends its lease key");
        edge.node_key = req.lease_key.to_vec();
        let provider = |id: &str, leased: bool| pb::ProviderConfig {
            id: id.into(),
            kind: pb::ProviderKind::OpenaiCompat as i32,
            base_url: base_url.into(),
            max_concurrency: 8,
            leased,
            credential_epoch: if leased { edge.issuer.epoch_of(SECRET) } else { 0 },
            ..Default::default()
        };
        let config = pb::NodeConfigPayload {
            node_id: "n1".into(),
            revision: 3,
            providers: vec![provider("up", true), provider("open", false)],
            workspaces: Vec::new(),
        };
        let resp = pb::RegisterResponse {
            accepted: true,
            config: Some(config),
            lease_verify_key: edge.issuer.verify_key().into(),
            generation: edge.generation,
            ..Default::default()
        };
        edge.send(env.correlation_id, Body::RegisterResponse(resp));
        let env = edge.frame();
        let Some(Body::NodeReadyRequest(_)) = env.body else { panic!("expected NodeReadyRequest") };
        edge.send(
            env.correlation_id,
            Body::NodeReadyResponse(pb::NodeReadyResponse { ready: true, reason: String::new() }),
        );
        edge
    }

    fn scope(&self, run_id: &str, provider: &str) -> pb::LeaseScope {
        let run = lease::Binding {
            principal: "team-a",
            provider,
            target: "mock-upstream",
            route: "chat",
            profile: "normal",
            slot: run_id,
        };
        pb::LeaseScope {
            node: "n1".into(),
            revision: 3,
            generation: self.generation,
            credential_epoch: self.issuer.epoch_of(SECRET),
            ..run.scope()
        }
    }

    fn lease(&self, scope: pb::LeaseScope) -> pb::SealedLease {
        self.issuer.issue(scope, SECRET, &self.node_key, lease::now_ms()).unwrap()
    }

    fn run(run_id: &str, provider: &str, credential: Option<pb::SealedLease>) -> pb::RunRequest {
        pb::RunRequest {
            run_id: run_id.into(),
            adapter: provider.into(),
            target: "mock-upstream".into(),
            body: br#"{"model":"mock-upstream","messages":[{"role":"user","content":"hi"}]}"#.to_vec().into(),
            whole: true,
            credential,
            profile: "normal".into(),
            principal: "team-a".into(),
            ..Default::default()
        }
    }

    /// Sends `req`; returns its terminal: `Ok(())` complete, `Err(code)`.
    fn outcome(&mut self, req: pb::RunRequest) -> Result<(), String> {
        let id = req.run_id.clone();
        self.send(0, Body::RunRequest(req));
        loop {
            let env = self.frame();
            let Some(Body::RunEvent(ev)) = env.body else { continue };
            if ev.run_id != id {
                continue;
            }
            match ev.kind {
                Some(pb::run_event::Kind::Complete(_)) => return Ok(()),
                Some(pb::run_event::Kind::Error(e)) => return Err(e.code),
                _ => {}
            }
        }
    }
}

#[test]
fn every_refused_lease_fails_the_run_closed_with_its_reason() {
    let mock = MockProv::start(&["--tokens", "2"]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = scratch("node.toml");
    std::fs::write(&cfg, format!("edge = \"{addr}\"\ntoken = \"t\"\nworkers = 1\nmetrics_listen = \"127.0.0.1:0\"\n"))
        .unwrap();
    let node = Proc::spawn("iop-node", &["--config", cfg.to_str().unwrap()], &[("IOP_LOG", "debug")]);
    let metrics: std::net::SocketAddr =
        node.line("iop-node metrics http=").trim_start_matches("iop-node metrics http=").parse().unwrap();
    let mut edge = FakeEdge::accept(&listener, &mock.base_url(), Duration::from_secs(30));
    let requests = || mock.stats()["requests"].as_u64().unwrap();

    // A good lease: the provider is called with the leased key.
    let good = edge.lease(edge.scope("r1", "up"));
    assert_eq!(edge.outcome(FakeEdge::run("r1", "up", Some(good.clone()))), Ok(()));
    let last = request(mock.addr, "GET", "/last", None, &[]).json();
    assert!(last.to_string().contains(&format!("Bearer {SECRET}")), "{last}");
    let called = requests();

    let other_node = Opener::generate().unwrap();
    let cases: Vec<(&str, pb::RunRequest)> = vec![
        // The same lease again, for the same run id.
        ("replayed", FakeEdge::run("r1", "up", Some(good))),
        // Issued under a credential the edge has since changed.
        (
            "revoked",
            FakeEdge::run(
                "r2",
                "up",
                Some(edge.lease(pb::LeaseScope { credential_epoch: 1, ..edge.scope("r2", "up") })),
            ),
        ),
        // For a provider that takes no lease on this node.
        ("disabled", FakeEdge::run("r3", "open", Some(edge.lease(edge.scope("r3", "open"))))),
        // Of another generation.
        (
            "stale",
            FakeEdge::run("r4", "up", Some(edge.lease(pb::LeaseScope { generation: 6, ..edge.scope("r4", "up") }))),
        ),
        // Sealed to another node's key.
        (
            "wrong_recipient",
            FakeEdge::run(
                "r5",
                "up",
                Some(
                    edge.issuer
                        .issue(edge.scope("r5", "up"), SECRET, &other_node.public_key(), lease::now_ms())
                        .unwrap(),
                ),
            ),
        ),
        // Issued for another run.
        ("mismatched", FakeEdge::run("r6", "up", Some(edge.lease(edge.scope("r-other", "up"))))),
        // None at all for a leased provider.
        ("mismatched", FakeEdge::run("r7", "up", None)),
    ];
    for (reason, req) in cases {
        assert_eq!(edge.outcome(req), Err(format!("credential_lease_{reason}")), "{reason}");
    }
    // Expired: issued a minute ago, valid for 30 s.
    let old = edge.issuer.issue(edge.scope("r8", "up"), SECRET, &edge.node_key, lease::now_ms() - 60_000).unwrap();
    assert_eq!(edge.outcome(FakeEdge::run("r8", "up", Some(old))), Err("credential_lease_expired".into()));

    // No refused run reached the provider.
    assert_eq!(requests(), called);
    let text = request(metrics, "GET", "/metrics", None, &[]);
    let text = String::from_utf8_lossy(&text.body).into_owned();
    let counts = [
        ("replayed", 1),
        ("revoked", 1),
        ("disabled", 1),
        ("stale", 1),
        ("wrong_recipient", 1),
        ("mismatched", 2),
        ("expired", 1),
    ];
    for (reason, n) in counts {
        let line = format!("iop_node_credential_lease_refusals_total{{reason=\"{reason}\"}} {n}");
        assert!(text.contains(&line), "no `{line}` in\n{text}");
    }
    // The log is written by its own thread: the counters can be ahead of it.
    eventually(Duration::from_secs(5), "eight refusals logged", || {
        node.log_text().matches("node_credential_lease_refused").count() == 8
    });
    let log = node.log_text();
    assert_eq!(log.matches("node_credential_lease_refused").count(), 8, "{log}");
    assert!(!log.contains(SECRET), "the node logged the secret");
}
