//! The operator status page at `/admin/`, driven in headless Chromium
//! through chromedriver (W3C WebDriver over plain HTTP): it logs in, shows
//! a node ready, offline when the node is killed and ready again when it
//! restarts, and counts a request; nothing leaves the edge's origin.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/install-browser.sh).
//! `IOP_SCREENSHOT=<path>` also writes the final screenshot there (the
//! README's docs/status-page.png is made this way).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use base64::Engine;
use serde_json::{json, Value};

use crate::harness::*;

const SECS: Duration = Duration::from_secs(15);

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|dir| names.iter().map(move |n| dir.join(n))).find(|p| p.is_file())
}

/// One request to chromedriver (it checks that `Host` is local).
fn wd_request(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Value {
    let mut s = TcpStream::connect(addr).expect("connect to chromedriver");
    s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let r = parse_response(&read_answer(&mut s));
    let v: Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| {
        panic!("chromedriver {method} {path}: not JSON ({e}): {}", String::from_utf8_lossy(&r.body))
    });
    assert_eq!(r.status, 200, "chromedriver {method} {path}: {v:#}");
    v["value"].clone()
}

/// One answer, by its Content-Length (chromedriver may keep the
/// connection open despite `connection: close`).
fn read_answer(s: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if let Some(len) = len {
                if raw.len() >= end + 4 + len {
                    raw.truncate(end + 4 + len);
                    return raw;
                }
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => return raw,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("read chromedriver answer: {e}"),
        }
    }
}

/// A chromedriver process and one browser session of it.
struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    /// The browser's profile, removed on drop.
    profile: PathBuf,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    fn start(driver: &PathBuf, chromium: Option<PathBuf>) -> Browser {
        // A free port for chromedriver (it prints none for port 0).
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = scratch("chromedriver.log");
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", driver.display()));
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut browser = Browser { driver: child, addr, session: String::new(), profile: scratch("chromium-profile") };
        eventually(SECS, "chromedriver answers /status", || {
            TcpStream::connect(addr).is_ok() && wd_request(addr, "GET", "/status", None)["ready"] == true
        });
        let mut options = json!({"args": [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", "--window-size=1200,800",
            format!("--user-data-dir={}", browser.profile.display()),
        ]});
        if let Some(bin) = chromium {
            options["binary"] = json!(bin);
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}});
        let v = wd_request(addr, "POST", "/session", Some(&caps));
        browser.session = v["sessionId"].as_str().expect("session id").to_owned();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        wd_request(self.addr, method, &format!("/session/{}{path}", self.session), body)
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page; its return value.
    fn eval(&self, script: &str) -> Value {
        self.call("POST", "/execute/sync", Some(&json!({"script": script, "args": []})))
    }

    fn element(&self, css: &str) -> String {
        let v = self.call("POST", "/element", Some(&json!({"using": "css selector", "value": css})));
        v[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {v}")).to_owned()
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.call("POST", &format!("/element/{id}/clear"), Some(&json!({})));
        self.call("POST", &format!("/element/{id}/value"), Some(&json!({ "text": text })));
    }

    fn click(&self, css: &str) {
        let id = self.element(css);
        self.call("POST", &format!("/element/{id}/click"), Some(&json!({})));
    }

    /// Polls `script` until `check` holds on its value; returns that value.
    fn wait(&self, what: &str, script: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + SECS;
        loop {
            let v = self.eval(script);
            if check(&v) {
                return v;
            }
            if Instant::now() >= deadline {
                let text = self.eval("return document.body.innerText;");
                panic!("timed out waiting for: {what}; last value {v}; page text:\n{}", text.as_str().unwrap_or(""));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD.decode(b64.as_str().expect("base64 PNG")).expect("valid base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            // Best effort: the driver may already be gone.
            if let Ok(mut s) = TcpStream::connect(self.addr) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let head = format!("DELETE {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n", self.addr);
                let _ = s.write_all(head.as_bytes());
                let _ = s.read(&mut [0u8; 4096]);
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

const NODE_STATE: &str =
    r#"const r = document.querySelector('tr.node[data-node="n1"]'); return r ? r.dataset.state : null;"#;
const PROVIDER_STATUS: &str =
    r#"const r = document.querySelector('tr.provider[data-node="n1"]'); return r ? r.dataset.status : null;"#;
const REQUESTS: &str = r#"const c = document.querySelector('tr[data-model="m"] [data-role="requests"]');
    return c ? Number(c.textContent.replace(/,/g, '')) : null;"#;

#[test]
#[ignore = "needs chromium and chromium-driver (scripts/install-browser.sh)"]
fn the_status_page_shows_nodes_going_and_coming_and_requests_counted() {
    let driver = on_path(&["chromedriver"]).expect("chromedriver on PATH (scripts/install-browser.sh)");
    let chromium = on_path(&["chromium", "chromium-browser"]);
    let config = pool_config(
        &[mock_node("n1", 4, 1, 3, 150), mock_node("n2", 2, 0, 3, 0)],
        &[mock_model("m", &["n1", "n2"], "")],
        "",
    );
    let edge = Edge::start(&config);
    let mut n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    // The page's files need no token and carry the strict policy.
    let origin = format!("http://{}", edge.http);
    for path in ["/admin/", "/admin/app.js", "/admin/style.css"] {
        let r = request(edge.http, "GET", path, None, &[]);
        assert_eq!(r.status, 200, "{path}: {}", String::from_utf8_lossy(&r.body));
        let csp = r.header("content-security-policy").unwrap_or_default();
        for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
            assert!(csp.contains(directive), "{path}: CSP {csp:?} lacks {directive}");
        }
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"), "{path}");
        assert_eq!(r.header("cache-control"), Some("no-store"), "{path}");
    }

    let browser = Browser::start(&driver, chromium);
    browser.open(&format!("{origin}/admin/"));
    browser.wait("the login form", "return !document.getElementById('login').hidden;", |v| v == true);
    // The style sheet applied under the policy.
    let collapse = browser.eval("return getComputedStyle(document.querySelector('table')).borderCollapse;");
    assert_eq!(collapse, "collapse");

    // A wrong token is refused and the form stays.
    browser.type_into("#token", "not-the-token");
    browser.click("#login-submit");
    browser.wait(
        "the refusal",
        "return document.getElementById('login').hidden ? '' : document.getElementById('login-error').textContent;",
        |v| v.as_str().is_some_and(|s| s.contains("refused")),
    );
    browser.type_into("#token", ADMIN_TOKEN);
    browser.click("#login-submit");
    browser.wait("the live indicator", "return document.getElementById('conn').dataset.state;", |v| v == "on");
    browser.wait("n1 ready", NODE_STATE, |v| v == "ready");
    browser.wait("n1's provider available", PROVIDER_STATUS, |v| v == "available");
    let n2 = browser.eval(r#"return document.querySelector('tr.node[data-node="n2"]').dataset.state;"#);
    assert_eq!(n2, "offline");
    // The token is in the tab's session storage, never in the URL.
    let url = browser.call("GET", "/url", None);
    assert!(!url.as_str().unwrap_or("").contains(ADMIN_TOKEN), "{url}");

    n1.kill9();
    browser.wait("n1 offline", NODE_STATE, |v| v == "offline");
    browser.wait("n1's provider unavailable", PROVIDER_STATUS, |v| v == "unavailable");
    let events = browser.eval("return document.getElementById('events').innerText;");
    assert!(events.as_str().is_some_and(|t| t.contains("n1 link 0 ended")), "{events}");

    let _n1 = edge.start_node("n1", "");
    browser.wait("n1 ready again", NODE_STATE, |v| v == "ready");
    browser.wait("n1's provider available again", PROVIDER_STATUS, |v| v == "available");

    let before = browser.wait("the request count", REQUESTS, Value::is_u64).as_u64().unwrap();
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    browser.wait("the request counted", REQUESTS, |v| v.as_u64() == Some(before + 1));

    // Under load the page shows a request rate and the leases in use.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..3)
        .map(|_| {
            let (stop, addr) = (stop.clone(), edge.http);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = post_json(
                        addr,
                        "/v1/chat/completions",
                        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                    );
                    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                }
            })
        })
        .collect();
    let rate = r#"const c = document.querySelector('tr[data-model="m"] [data-role="rate"]');
        return c ? Number(c.textContent) : null;"#;
    browser.wait("a request rate", rate, |v| v.as_f64().is_some_and(|r| r > 0.0));
    let leases = r#"const c = document.querySelector('tr.provider[data-node="n1"] [data-role="leases"]');
        return c ? Number(c.textContent) : null;"#;
    browser.wait("n1's leases in use", leases, |v| v.as_u64().is_some_and(|n| n > 0));
    let png = browser.screenshot();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }

    // Everything the page loaded or asked for came from the edge itself.
    let resources = browser.eval(
        "return [location.href].concat(performance.getEntriesByType('resource').map(e => e.name), \
         Array.from(document.querySelectorAll('[src],[href]')).map(e => e.src || e.href));",
    );
    for url in resources.as_array().expect("urls") {
        let url = url.as_str().unwrap_or("");
        assert!(url.starts_with(&format!("{origin}/")) || url.starts_with("data:"), "left the origin: {url}");
    }

    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    std::fs::write(scratch("status-page.png"), &png).unwrap();
    if let Some(path) = std::env::var_os("IOP_SCREENSHOT") {
        std::fs::write(&path, &png).unwrap_or_else(|e| panic!("write {}: {e}", PathBuf::from(&path).display()));
    }
}
