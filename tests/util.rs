//! Runs the real binary in temporary directories and dumps everything on failure.

use std::path::Path;
use std::process::{Command, Output};

/// The outcome of one `hetgnn` invocation.
pub struct Run {
    pub args: Vec<String>,
    pub out: Output,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn dump(&self) -> String {
        format!("hetgnn {}\nexit: {:?}\n--- stdout\n{}\n--- stderr\n{}", self.args.join(" "), self.out.status.code(), self.stdout(), self.stderr())
    }
    /// Asserts success and returns self.
    pub fn ok(self) -> Self {
        assert!(self.out.status.success(), "expected success:\n{}", self.dump());
        self
    }
    /// Asserts exit code `code` and that stderr mentions every needle.
    pub fn fails_with(self, code: i32, needles: &[&str]) -> Self {
        assert_eq!(self.out.status.code(), Some(code), "wrong exit code:\n{}", self.dump());
        for n in needles {
            assert!(self.stderr().contains(n), "stderr should mention {n:?}:\n{}", self.dump());
        }
        self
    }
}

/// Runs `hetgnn args...` in `cwd`.
pub fn hetgnn(cwd: &Path, args: &[&str]) -> Run {
    hetgnn_env(cwd, args, &[])
}

/// Runs `hetgnn args...` in `cwd` with extra environment variables.
pub fn hetgnn_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hetgnn"));
    cmd.args(args).current_dir(cwd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("hetgnn runs");
    Run { args: args.iter().map(|s| s.to_string()).collect(), out }
}
