use std::{os::unix::fs::symlink, path::PathBuf};

use super::*;

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!("iop-jobs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("ws/src")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/keep"), b"keep").unwrap();
        std::fs::write(base.join("ws/src/user.rs"), b"user").unwrap();
        Self(base)
    }

    fn ws(&self) -> PathBuf {
        self.0.join("ws")
    }

    fn root(&self) -> Root {
        Root::open(self.ws().to_str().unwrap()).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_job_holds_its_artifacts_and_its_cleanup_removes_only_them() {
    let s = Scratch::new("one");
    let root = s.root();
    let job = Job::create(&root, "req-1").unwrap();
    let other = Job::create(&root, "req-2").unwrap();
    job.write(Artifact::Plan, b"# plan", 1024).unwrap();
    job.write(Artifact::Review, b"approve", 1024).unwrap();
    other.write(Artifact::Plan, b"# other", 1024).unwrap();
    assert_eq!(job.read(Artifact::Plan, 1024).unwrap().bytes, b"# plan");
    assert_eq!(job.write(Artifact::Plan, &[0; 100], 10), Err(FileError::TooLarge));
    // A request opens its workspace once.
    assert_eq!(Job::create(&root, "req-1").unwrap_err(), FileError::Io);
    assert_eq!(Job::create(&root, "../x").unwrap_err(), FileError::PathInvalid);
    // The job is invisible to the request's own tools.
    assert_eq!(root.read(".iop/job/req-1/plan.md", 100), Err(FileError::PathReserved));
    cleanup(&root, "req-1").unwrap();
    assert!(!s.ws().join(".iop/job/req-1").exists());
    // Another request's state and the user's files are untouched.
    assert_eq!(std::fs::read(s.ws().join(".iop/job/req-2/plan.md")).unwrap(), b"# other");
    assert_eq!(std::fs::read(s.ws().join("src/user.rs")).unwrap(), b"user");
    // A second cleanup (or one of a request that never opened) is a no-op.
    cleanup(&root, "req-1").unwrap();
    cleanup(&root, "never").unwrap();
}

#[test]
fn a_cleanup_follows_no_link_out_of_the_job() {
    let s = Scratch::new("links");
    let root = s.root();
    let _job = Job::create(&root, "req").unwrap();
    let dir = s.ws().join(".iop/job/req");
    // Whatever got into the job directory, links included, goes as links.
    symlink(s.0.join("outside"), dir.join("to-outside")).unwrap();
    symlink(s.0.join("outside/keep"), dir.join("to-file")).unwrap();
    std::fs::create_dir_all(dir.join("deep/er")).unwrap();
    std::fs::write(dir.join("deep/er/x"), b"x").unwrap();
    cleanup(&root, "req").unwrap();
    assert!(!dir.exists());
    assert_eq!(std::fs::read(s.0.join("outside/keep")).unwrap(), b"keep");
}

#[test]
fn a_link_in_place_of_the_job_tree_is_refused() {
    let s = Scratch::new("swap");
    let root = s.root();
    std::fs::create_dir_all(s.ws().join(".iop")).unwrap();
    // `.iop/job` replaced by a link to the outside: nothing is created or
    // removed through it.
    symlink(s.0.join("outside"), s.ws().join(".iop/job")).unwrap();
    assert_eq!(Job::create(&root, "req").unwrap_err(), FileError::Symlink);
    assert_eq!(cleanup(&root, "keep"), Err(FileError::Symlink));
    assert_eq!(std::fs::read(s.0.join("outside/keep")).unwrap(), b"keep");
}

#[test]
fn the_jobs_a_crash_left_are_cleaned_at_start() {
    let s = Scratch::new("crash");
    let root = s.root();
    for id in ["a", "b", "c"] {
        Job::create(&root, id).unwrap().write(Artifact::Plan, b"p", 10).unwrap();
    }
    assert_eq!(cleanup_all(&root).unwrap(), 3);
    assert_eq!(std::fs::read_dir(s.ws().join(".iop/job")).unwrap().count(), 0);
    assert_eq!(std::fs::read(s.ws().join("src/user.rs")).unwrap(), b"user");
    // A workspace that never had a job.
    let fresh = Scratch::new("fresh");
    assert_eq!(cleanup_all(&fresh.root()).unwrap(), 0);
}
