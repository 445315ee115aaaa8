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
        format!(
            "hetgnn {}\nexit: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.args.join(" "),
            self.out.status.code(),
            self.stdout(),
            self.stderr()
        )
    }
    /// Asserts success and returns self.
    pub fn ok(self) -> Self {
        assert!(
            self.out.status.success(),
            "expected success:\n{}",
            self.dump()
        );
        self
    }
    /// Asserts exit code `code` and that stderr mentions every needle.
    pub fn fails_with(self, code: i32, needles: &[&str]) -> Self {
        assert_eq!(
            self.out.status.code(),
            Some(code),
            "wrong exit code:\n{}",
            self.dump()
        );
        for n in needles {
            assert!(
                self.stderr().contains(n),
                "stderr should mention {n:?}:\n{}",
                self.dump()
            );
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
    Run {
        args: args.iter().map(|s| s.to_string()).collect(),
        out,
    }
}

/// A UDP port on loopback that was free a moment ago and that no other test
/// of this binary got (the OS may hand a just-released port out again, and
/// tests run side by side).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

/// `[[cluster.nodes]]` entries for `ids` on free loopback ports.
pub fn nodes_toml(ids: &[&str]) -> String {
    ids.iter()
        .map(|id| {
            format!(
                "[[cluster.nodes]]\nid = \"{id}\"\naddr = \"127.0.0.1:{}\"\n",
                free_port()
            )
        })
        .collect()
}

/// Writes `dir/cluster.toml` for training on `ids`: fast failure detection,
/// `extra` keys in `[cluster]`, then `training` (the `[training]` body and any later sections).
pub fn training_cluster(dir: &Path, ids: &[&str], extra: &str, training: &str) {
    let text = format!("[cluster]\ncerts_dir = \"certs\"\nheartbeat_ms = 100\nfailure_timeout_ms = 2000\n{extra}{}[training]\n{training}", nodes_toml(ids));
    std::fs::write(dir.join("cluster.toml"), text).unwrap();
}

/// A run report.
pub fn report(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Starts `hetgnn node` for `victim` and `survivor` from `dir/cluster.toml`,
/// kills the victim (SIGKILL) once both have trained a few seconds, and
/// checks the survivor exits 1 within 15 s with an error naming the victim.
pub fn killing_a_node_stops_its_peer(dir: &Path, victim: &str, survivor: &str) {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let start = |id: &str| {
        Command::new(env!("CARGO_BIN_EXE_hetgnn"))
            .args(["node", "--config", "cluster.toml", "--node", id])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut victim_proc = start(victim);
    let mut survivor_proc = start(survivor);
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        survivor_proc.try_wait().unwrap().is_none(),
        "{survivor} is still training"
    );
    victim_proc.kill().unwrap();
    victim_proc.wait().unwrap();
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = survivor_proc.try_wait().unwrap() {
            break s;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "{survivor} did not stop within 30 s of {victim}'s death"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(survivor_proc.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains(victim), "the error names the lost node: {err}");
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "stopped after {:?}: {err}",
        killed.elapsed()
    );
}

/// Runs `hetgnn node` for every id of `dir/cluster.toml`, kills `victim`
/// (SIGKILL) once the checkpoint directory `checkpoint` exists, starts it
/// again and waits for every node to finish well; returns their logs.
pub fn kill_once_after_checkpoint(
    dir: &Path,
    ids: &[&str],
    victim: &str,
    checkpoint: &str,
) -> String {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let start = |id: &str, k: usize| {
        let log = std::fs::File::create(dir.join(format!("{id}.{k}.log"))).unwrap();
        Command::new(env!("CARGO_BIN_EXE_hetgnn"))
            .args(["node", "--config", "cluster.toml", "--node", id])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let logs = || {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| {
                format!(
                    "--- {}\n{}",
                    e.path().display(),
                    std::fs::read_to_string(e.path()).unwrap()
                )
            })
            .collect::<String>()
    };
    let mut procs: Vec<(String, std::process::Child)> = ids
        .iter()
        .map(|id| (id.to_string(), start(id, 0)))
        .collect();
    let t0 = Instant::now();
    while !dir.join(checkpoint).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no checkpoint {checkpoint}:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let v = procs
        .iter()
        .position(|(id, _)| id == victim)
        .expect("the victim is one of the nodes");
    procs[v].1.kill().unwrap();
    procs[v].1.wait().unwrap();
    procs[v].1 = start(victim, 1);
    for (id, p) in &mut procs {
        let t = Instant::now();
        let status = loop {
            if let Some(s) = p.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > Duration::from_secs(150) {
                let _ = p.kill();
                panic!("{id} did not finish:\n{}", logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{id}: {status}\n{}", logs());
    }
    logs()
}

/// A running child whose stderr lines are collected with their arrival time;
/// killed when dropped.
pub struct Logged {
    pub child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, String)>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Logged {
    /// Starts `cmd` with its stderr read as it runs (stdout discarded).
    pub fn spawn(mut cmd: Command) -> Logged {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the command starts");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let err = child.stderr.take().expect("piped");
        let reader = std::thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push((std::time::Instant::now(), l));
            }
        });
        Logged {
            child,
            lines,
            reader: Some(reader),
        }
    }

    /// When a line containing `needle` arrived (after `since`), waiting up to `within`.
    pub fn wait_line(
        &self,
        needle: &str,
        since: std::time::Instant,
        within: std::time::Duration,
    ) -> std::time::Instant {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some((t, _)) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|(t, l)| *t >= since && l.contains(needle))
            {
                return *t;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} within {within:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Everything it wrote to stderr so far.
    pub fn log(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Sends it signal `sig`.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Its exit code once it exits (killed if still running after `within`),
    /// with everything it wrote to stderr.
    pub fn finish(&mut self, within: std::time::Duration) -> (Option<i32>, String) {
        let deadline = std::time::Instant::now() + within;
        while self.child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let code = self.child.wait().unwrap().code();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (code, self.log())
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
