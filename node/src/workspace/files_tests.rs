use std::{os::unix::fs::symlink, path::PathBuf};

use super::*;

/// A scratch workspace with `outside` beside it (what escapes would reach).
struct Scratch {
    base: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!("iop-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("ws/src")).unwrap();
        std::fs::create_dir_all(base.join("ws/.iop/job")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/secret"), b"outside").unwrap();
        std::fs::write(base.join("ws/src/main.rs"), b"fn main() {}").unwrap();
        Self { base }
    }

    fn ws(&self) -> PathBuf {
        self.base.join("ws")
    }

    fn root(&self) -> Root {
        Root::open(self.ws().to_str().unwrap()).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[test]
fn files_are_read_written_listed_and_deleted_inside_the_root() {
    let s = Scratch::new("ops");
    let root = s.root();
    assert_eq!(root.read("src/main.rs", 1024).unwrap(), Read { bytes: b"fn main() {}".to_vec(), truncated: false });
    assert_eq!(root.read("src/main.rs", 2).unwrap(), Read { bytes: b"fn".to_vec(), truncated: true });
    root.write("src/lib.rs", b"pub fn f() {}", 1024).unwrap();
    root.write("src/lib.rs", b"pub fn g() {}", 1024).unwrap();
    assert_eq!(std::fs::read(s.ws().join("src/lib.rs")).unwrap(), b"pub fn g() {}");
    assert_eq!(root.write("big", &[0; 2048], 1024), Err(FileError::TooLarge));
    // No temp file left behind.
    let listing = root.list("src", None, 10).unwrap();
    let names: Vec<&str> = listing.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["lib.rs", "main.rs"]);
    assert!(!listing.more);
    // The root lists without `.iop`.
    let top = root.list("", None, 10).unwrap();
    assert_eq!(top.entries, [Entry { name: "src".into(), kind: EntryKind::Directory }]);
    root.delete("src/lib.rs").unwrap();
    assert_eq!(root.read("src/lib.rs", 10), Err(FileError::NotFound));
    assert_eq!(root.delete("src"), Err(FileError::NotAFile));
    assert_eq!(root.read("src", 10), Err(FileError::NotAFile));
    assert_eq!(root.list("src/main.rs", None, 10), Err(FileError::NotADirectory));
}

#[test]
fn a_listing_goes_in_bounded_batches_by_name() {
    let s = Scratch::new("list");
    for i in 0..25 {
        std::fs::write(s.ws().join(format!("src/f{i:02}")), b"x").unwrap();
    }
    let root = s.root();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let batch = root.list("src", after.as_deref(), 10).unwrap();
        assert!(batch.entries.len() <= 10);
        seen.extend(batch.entries.iter().map(|e| e.name.clone()));
        after = batch.entries.last().map(|e| e.name.clone());
        if !batch.more {
            break;
        }
    }
    let mut expected: Vec<String> = (0..25).map(|i| format!("f{i:02}")).collect();
    expected.push("main.rs".into());
    assert_eq!(seen, expected);
}

#[test]
fn every_escape_is_refused_with_no_effect() {
    let s = Scratch::new("escape");
    let ws = s.ws();
    symlink(s.base.join("outside"), ws.join("out")).unwrap();
    symlink(s.base.join("outside/secret"), ws.join("src/link")).unwrap();
    let root = s.root();
    for (path, err) in [
        ("../outside/secret", FileError::PathInvalid),
        ("src/../../outside/secret", FileError::PathInvalid),
        ("/etc/passwd", FileError::PathInvalid),
        ("./src/main.rs", FileError::PathInvalid),
        ("src//main.rs", FileError::PathInvalid),
        ("", FileError::PathInvalid),
        (".iop/job/x", FileError::PathReserved),
        (".iop", FileError::PathReserved),
        ("out/secret", FileError::Symlink),
        ("src/link", FileError::Symlink),
    ] {
        assert_eq!(root.read(path, 100), Err(err), "read {path}");
        assert_eq!(root.write(path, b"pwned", 100), Err(err), "write {path}");
        assert_eq!(root.delete(path), Err(err), "delete {path}");
    }
    assert_eq!(root.list("out", None, 10), Err(FileError::Symlink));
    assert_eq!(root.list(".iop", None, 10), Err(FileError::PathReserved));
    // Nothing outside changed, and the links are still there.
    assert_eq!(std::fs::read(s.base.join("outside/secret")).unwrap(), b"outside");
    assert!(std::fs::symlink_metadata(ws.join("src/link")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_dir(s.base.join("outside")).unwrap().count(), 1);
}

#[test]
fn a_directory_swapped_for_a_symlink_between_two_calls_is_refused() {
    let s = Scratch::new("swap");
    let root = s.root();
    root.write("src/a.rs", b"a", 100).unwrap();
    // Between two calls, `src` becomes a link to the outside.
    std::fs::rename(s.ws().join("src"), s.ws().join("src-old")).unwrap();
    symlink(s.base.join("outside"), s.ws().join("src")).unwrap();
    assert_eq!(root.read("src/secret", 100), Err(FileError::Symlink));
    assert_eq!(root.write("src/secret", b"pwned", 100), Err(FileError::Symlink));
    assert_eq!(root.delete("src/secret"), Err(FileError::Symlink));
    assert_eq!(std::fs::read(s.base.join("outside/secret")).unwrap(), b"outside");
}

#[test]
fn special_files_are_refused_before_any_effect() {
    let s = Scratch::new("fifo");
    let fifo = s.ws().join("src/pipe");
    // coreutils' mkfifo (the workspace forbids `unsafe`, so no libc::mkfifo).
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let root = s.root();
    // A read does not block on the FIFO: it is refused.
    assert_eq!(root.read("src/pipe", 100), Err(FileError::SpecialFile));
    assert_eq!(root.write("src/pipe", b"x", 100), Err(FileError::SpecialFile));
    assert_eq!(root.delete("src/pipe"), Err(FileError::SpecialFile));
    assert!(std::fs::symlink_metadata(&fifo).is_ok(), "the FIFO is still there");
    let listing = root.list("src", None, 10).unwrap();
    assert!(listing.entries.contains(&Entry { name: "pipe".into(), kind: EntryKind::Other }));
}
