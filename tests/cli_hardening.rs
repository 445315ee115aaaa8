//! What hetgnn refuses, and how it fails: every bad input an error naming
//! the file or key, nothing hanging, no wrong run exiting 0 (see
//! docs/guide/refusals.md).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{hetgnn, hetgnn_env, killing_a_node_stops_its_peer, training_cluster};

/// A scale-0.002 graph in `d/g`.
fn graph(d: &Path) {
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
}

/// Waits for `child` at most `within`; kills it and fails if it is still running.
fn wait_within(
    child: &mut std::process::Child,
    within: Duration,
    what: &str,
) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("{what}: still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `hetgnn args` started in `d` with stdout and stderr piped.
fn spawn(d: &Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_hetgnn"))
        .args(args)
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_closed_stdout_loses_the_summary_not_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    graph(d);
    let mut child = spawn(
        d,
        &[
            "train", "--data", "g", "--epochs", "2", "--hidden", "16", "--report", "run.json",
        ],
    );
    // The reader goes away before the first line, as `| head -0` or a closed terminal.
    drop(child.stdout.take());
    let status = wait_within(
        &mut child,
        Duration::from_secs(120),
        "train with a closed stdout",
    );
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        crate::util::report(&d.join("run.json"))["epochs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn outputs_never_overwrite_inputs_and_need_force_to_replace() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    graph(d);
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "1",
            "--hidden",
            "8",
            "--checkpoint",
            "ck",
            "--report",
            "run.json",
        ],
    )
    .ok();
    let labels = std::fs::read(d.join("g/nodes/paper/labels.npy")).unwrap();
    // Into the graph it reads, onto the checkpoint it reads: refused, --force or not.
    for out in [
        "g/nodes/paper/labels.npy",
        "ck/epoch-000001/params.safetensors",
        "g",
    ] {
        hetgnn(
            d,
            &[
                "predict",
                "--checkpoint",
                "ck",
                "--data",
                "g",
                "--out",
                out,
                "--force",
            ],
        )
        .fails_with(1, &[out, "the input", "overwrite"]);
    }
    // A hard link to an input, under any output flag: refused, --force or not.
    std::fs::hard_link(d.join("g/nodes/paper/labels.npy"), d.join("linked.npy")).unwrap();
    std::fs::hard_link(d.join("g/schema.json"), d.join("linked.json")).unwrap();
    std::fs::hard_link(d.join("run.json"), d.join("linked.png")).unwrap();
    let predict = ["predict", "--checkpoint", "ck", "--data", "g", "--force"];
    for (args, flag) in [
        (
            &[&predict[..], &["--out", "linked.npy"]].concat(),
            "--out linked.npy",
        ),
        (
            &[
                &predict[..],
                &["--out", "p2.npy", "--embeddings", "linked.npy"],
            ]
            .concat(),
            "--embeddings linked.npy",
        ),
        (
            &[
                "train",
                "--data",
                "g",
                "--epochs",
                "1",
                "--report",
                "linked.json",
                "--force",
            ][..]
                .to_vec(),
            "--report linked.json",
        ),
        (
            &["plot", "run.json", "--out", "linked.png", "--force"][..].to_vec(),
            "--out linked.png",
        ),
    ] {
        hetgnn(d, args).fails_with(1, &[flag, "is a hard link to", "overwrite"]);
    }
    assert_eq!(
        std::fs::read(d.join("g/nodes/paper/labels.npy")).unwrap(),
        labels,
        "the graph is untouched"
    );
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--out",
            "g/parts",
        ],
    )
    .fails_with(1, &["is inside the input --data"]);
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--out",
            ".",
            "--force",
        ],
    )
    .fails_with(1, &["holds the input --data"]);
    assert!(d.join("g/schema.json").exists());
    // An existing output needs --force.
    hetgnn(
        d,
        &[
            "predict",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "p.npy",
        ],
    )
    .ok();
    hetgnn(
        d,
        &[
            "predict",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "p.npy",
        ],
    )
    .fails_with(1, &["p.npy", "exists", "--force"]);
    hetgnn(
        d,
        &[
            "predict",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "p.npy",
            "--force",
        ],
    )
    .ok();
    hetgnn(d, &["plot", "run.json", "--out", "run.json", "--force"])
        .fails_with(1, &["is the input"]);
    hetgnn(
        d,
        &[
            "train", "--data", "g", "--epochs", "1", "--report", "run.json",
        ],
    )
    .fails_with(1, &["run.json", "exists", "--force"]);
    // A report naming a directory is refused before training, not after.
    let run = hetgnn(
        d,
        &["train", "--data", "g", "--epochs", "1", "--report", "ck"],
    )
    .fails_with(1, &["--report ck", "is a directory"]);
    assert!(!run.stdout().contains("epoch"), "{}", run.stdout());
}

#[test]
fn inputs_that_are_not_regular_files_or_finite_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    graph(d);
    // A FIFO where the schema should be: an error at once, not a wait for a writer.
    std::fs::create_dir(d.join("fifo")).unwrap();
    let fifo = d.join("fifo/schema.json");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let start = Instant::now();
    hetgnn(d, &["inspect", "fifo"]).fails_with(1, &["schema.json", "a FIFO"]);
    assert!(start.elapsed() < Duration::from_secs(20));
    // A schema that is an endless device.
    std::fs::create_dir(d.join("zero")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("zero/schema.json")).unwrap();
    hetgnn(d, &["inspect", "zero"]).fails_with(1, &["schema.json", "a device"]);
    // A NaN in the features, named by row and column.
    let f = d.join("g/nodes/paper/features.npy");
    let mut bytes = std::fs::read(&f).unwrap();
    let at = bytes.len() - 4 * 3;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&f, bytes).unwrap();
    hetgnn(d, &["train", "--data", "g", "--epochs", "1"])
        .fails_with(1, &["features.npy", "is NaN", "features must be finite"]);
    hetgnn(d, &["inspect", "g"]).fails_with(1, &["features.npy", "is NaN"]);
}

#[test]
fn sizes_no_machine_can_hold_are_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    graph(d);
    // A fixed budget, so the figures do not depend on this machine.
    let env = [("HETGNN_MEMORY_BYTES", "4000000000")];
    let text = std::fs::read_to_string(d.join("g/schema.json")).unwrap();
    let mut schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    schema["node_types"]["institution"]["count"] = serde_json::json!(4_294_967_294u64);
    std::fs::create_dir_all(d.join("big")).unwrap();
    std::fs::write(d.join("big/schema.json"), schema.to_string()).unwrap();
    hetgnn_env(d, &["inspect", "big"], &env).fails_with(
        1,
        &[
            "schema.json",
            "node type 'institution' declares 4294967294 nodes",
            "more than the budget HETGNN_MEMORY_BYTES sets",
        ],
    );
    // An open-file limit no run can live with (hard and soft: `ulimit -n` sets both).
    let out = Command::new("sh")
        .args([
            "-c",
            "ulimit -n 64 && exec \"$0\" train --data g",
            env!("CARGO_BIN_EXE_hetgnn"),
        ])
        .current_dir(d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1)
            && err.contains("the open-file limit is 64")
            && err.contains("ulimit -n"),
        "{err}"
    );
    // A graph to generate that cannot fit: refused before anything is allocated or written.
    hetgnn_env(d, &["generate", "--scale", "1000", "--out", "huge"], &env).fails_with(
        1,
        &[
            "generating a mag-like graph at scale 1000 needs about",
            "more than the budget",
        ],
    );
    assert!(!d.join("huge").exists());
    // A malformed budget is refused, not ignored.
    hetgnn_env(
        d,
        &["train", "--data", "g"],
        &[("HETGNN_MEMORY_BYTES", "abc")],
    )
    .fails_with(
        1,
        &["HETGNN_MEMORY_BYTES=\"abc\" is not a positive whole number of bytes"],
    );
    hetgnn_env(d, &["train", "--data", "g", "--hidden", "65536"], &env)
        .fails_with(1, &["training.hidden 65536", "more than the budget"]);
    hetgnn_env(
        d,
        &[
            "train", "--data", "g", "--model", "rgat", "--hidden", "65536", "--heads", "65536",
        ],
        &env,
    )
    .fails_with(1, &["training.hidden 65536"]);
    hetgnn_env(
        d,
        &[
            "train",
            "--data",
            "g",
            "--batch",
            "1000000000",
            "--fanouts",
            "1000000,1000000",
            "--hidden",
            "4096",
        ],
        &env,
    )
    .fails_with(1, &["training.batch"]);
    hetgnn_env(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "meta",
            "--layers",
            "1000",
            "--out",
            "pm",
        ],
        &env,
    )
    .fails_with(1, &["--layers 1000", "metatree"]);
    // Within the budget, the same machinery lets ordinary runs through.
    hetgnn_env(
        d,
        &["train", "--data", "g", "--epochs", "1", "--hidden", "8"],
        &env,
    )
    .ok();
}

#[test]
fn runs_that_would_be_wrong_stop_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    graph(d);
    // Diverged: the step is named.
    hetgnn(
        d,
        &["train", "--data", "g", "--epochs", "2", "--lr", "1e30"],
    )
    .fails_with(1, &["training diverged at epoch 0, step", "training.lr"]);
    // Resuming with another learning rate, or from an edited manifest.
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "1",
            "--hidden",
            "8",
            "--checkpoint",
            "ck",
        ],
    )
    .ok();
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "2",
            "--hidden",
            "8",
            "--checkpoint",
            "ck",
            "--resume",
            "--lr",
            "0.02",
        ],
    )
    .fails_with(1, &["other settings"]);
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "2",
            "--hidden",
            "8",
            "--checkpoint",
            "ck",
            "--resume",
            "--batch",
            "500",
        ],
    )
    .fails_with(1, &["other settings"]);
    let m = d.join("ck/epoch-000001/manifest.json");
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, text.replace("\"epochs_done\": 1", "\"epochs_done\": 9")).unwrap();
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "2",
            "--hidden",
            "8",
            "--checkpoint",
            "ck",
            "--resume",
        ],
    )
    .fails_with(1, &["manifest.json", "was changed after it was written"]);
    // No training nodes.
    graphs::npy::write_i64(&d.join("g/nodes/paper/train.npy"), &[0], &[]).unwrap();
    hetgnn(d, &["train", "--data", "g", "--epochs", "1"])
        .fails_with(1, &["training split of 'paper' is empty"]);
}

#[test]
fn confusing_values_get_plain_messages() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    graph(d);
    hetgnn(d, &["train", "--data", "g", "--lr", "-0.01"])
        .fails_with(1, &["training.lr must be a positive number, got -0.01"]);
    hetgnn(d, &["doctor", "--config", "none.toml", "--timeout", "1e30"])
        .fails_with(1, &["--timeout must be a number of seconds"]);
    let run = hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "1",
            "--hidden",
            "8",
            "--seed",
            "18446744073709551615",
            "--report",
            "r.json",
        ],
    )
    .ok();
    assert!(run.stdout().contains("done"), "{}", run.stdout());
    assert_eq!(
        crate::util::report(&d.join("r.json"))["config"]["training"]["seed"],
        serde_json::json!(18446744073709551615u64)
    );
    use std::os::unix::ffi::OsStrExt;
    let odd = std::ffi::OsStr::from_bytes(b"g\xff");
    let out = Command::new(env!("CARGO_BIN_EXE_hetgnn"))
        .arg("train")
        .arg("--data")
        .arg(odd)
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not valid UTF-8"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_mapped_input_truncated_under_a_run_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    graph(d);
    let mut child = spawn(
        d,
        &["train", "--data", "g", "--epochs", "10000", "--hidden", "8"],
    );
    // Truncate once training reads the features (its first epoch line).
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.starts_with("epoch"))),
        "training started"
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("g/nodes/paper/features.npy"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    std::thread::spawn(move || lines.for_each(drop));
    let status = wait_within(
        &mut child,
        Duration::from_secs(60),
        "train on a truncated file",
    );
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("features.npy: the file changed (truncated?)"),
        "{err}"
    );
}

/// Starts `hetgnn launch` on `cluster.toml` in `d`; returns it and its nodes' pids.
fn launch_two(d: &Path) -> (std::process::Child, Vec<i32>) {
    let mut launch = Command::new(env!("CARGO_BIN_EXE_hetgnn"))
        .args(["launch", "--config", "cluster.toml"])
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(launch.stderr.take().unwrap()));
    let mut pids = Vec::new();
    while pids.len() < 2 {
        let line = lines.next().expect("launch reports its nodes").unwrap();
        if let Some(rest) = line.split("(pid ").nth(1) {
            pids.push(rest.split(')').next().unwrap().parse::<i32>().unwrap());
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    (launch, pids)
}

/// Waits (at most 20 s) until none of `pids` is alive (a zombie is not).
fn all_gone(pids: &[i32]) {
    let start = Instant::now();
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nodes {pids:?} outlived their launcher"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn launch_killed_takes_its_nodes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    // Nodes of a single-mode file serve until stopped: only their launcher's death can end them here.
    training_cluster(d, &["n0", "n1"], "", "");
    let (mut launch, pids) = launch_two(d);
    // A stopped node keeps SIGTERM pending: the parent-death signal must end it too.
    assert_eq!(unsafe { libc::kill(pids[1], libc::SIGSTOP) }, 0);
    launch.kill().unwrap();
    launch.wait().unwrap();
    all_gone(&pids);
    // Interrupted, the launcher stops its nodes and exits as a shell expects (128 + SIGTERM).
    let (mut launch, pids) = launch_two(d);
    assert_eq!(unsafe { libc::kill(launch.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(launch.wait().unwrap().code(), Some(143));
    all_gone(&pids);
}

#[test]
fn a_node_whose_coordinator_is_gone_for_good_stops_soon() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.01", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    // The default rejoin timeout (10 minutes), no checkpoints: nothing could resume the run.
    training_cluster(
        d,
        &["n0", "n1"],
        "",
        "mode = \"data-parallel\"\npartitions = \"parts\"\nepochs = 50\n",
    );
    killing_a_node_stops_its_peer(d, "n0", "n1");
}
