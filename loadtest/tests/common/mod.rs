//! Shared by the binary tests: a spawned `iop-mockprov` on port 0.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::SocketAddr,
    process::{Child, Command, Stdio},
};

/// A running `iop-mockprov`, killed on drop.
pub struct MockProv {
    child: Child,
    pub addr: SocketAddr,
}

impl MockProv {
    /// Starts the mock with extra CLI `args`, on the default driver.
    pub fn start(args: &[&str]) -> Self {
        Self::start_on(args, false)
    }

    /// `legacy` forces monoio's epoll driver instead of io_uring.
    pub fn start_on(args: &[&str], legacy: bool) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_iop-mockprov"));
        if legacy {
            cmd.env("MONOIO_FORCE_LEGACY_DRIVER", "1");
        } else {
            cmd.env_remove("MONOIO_FORCE_LEGACY_DRIVER");
        }
        let mut child = cmd
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn iop-mockprov");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read ready line");
        let addr = line
            .trim()
            .strip_prefix("iop-mockprov listening on ")
            .unwrap_or_else(|| panic!("unexpected ready line {line:?}"))
            .parse()
            .expect("address");
        Self { child, addr }
    }

    /// `http://addr`.
    #[allow(dead_code)] // used by one of the two test binaries
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl MockProv {
    /// `GET path` on a fresh connection: the body of a 200 answer as JSON.
    #[allow(dead_code)] // used by one of the two test binaries
    pub fn get_json(&self, path: &str) -> serde_json::Value {
        let mut s = std::net::TcpStream::connect(self.addr).expect("connect");
        write!(s, "GET {path} HTTP/1.1\r\nhost: mock\r\nconnection: close\r\n\r\n").expect("write");
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("a whole answer");
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }
}

impl Drop for MockProv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
