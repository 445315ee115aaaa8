//! `hetgnn node`, `launch` and `doctor` as separate processes on loopback.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{free_port, hetgnn, nodes_toml, Logged};

/// Starts `hetgnn node` for `id` of `dir/cluster.toml`, its stderr collected.
fn start_node(dir: &Path, id: &str) -> Logged {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hetgnn"));
    cmd.args(["node", "--config", "cluster.toml", "--node", id])
        .current_dir(dir)
        .env("RUST_LOG", "info");
    Logged::spawn(cmd)
}

const HEARTBEAT_MS: u64 = 100;
const TIMEOUT_MS: u64 = 1000;

fn write_cluster(dir: &Path, body: &str) {
    std::fs::write(dir.join("cluster.toml"), body).unwrap();
}

fn cluster_header() -> String {
    format!("[cluster]\ncerts_dir = \"certs\"\nheartbeat_ms = {HEARTBEAT_MS}\nfailure_timeout_ms = {TIMEOUT_MS}\n")
}

#[test]
fn three_processes_answer_doctor_and_report_a_killed_peer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(
        d,
        &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
    )
    .ok();
    write_cluster(
        d,
        &format!(
            "{}{}[placement]\nreducer = \"n1\"\n",
            cluster_header(),
            nodes_toml(&["n0", "n1", "n2"])
        ),
    );
    let t0 = Instant::now();
    let n0 = start_node(d, "n0");
    let _n1 = start_node(d, "n1");
    let mut n2 = start_node(d, "n2");
    n0.wait_line("peer n2 up", t0, Duration::from_secs(20));

    // Status and pings of every node, through the authenticated transport.
    let run = hetgnn(
        d,
        &["doctor", "--config", "cluster.toml", "--timeout", "10"],
    )
    .ok();
    let out = run.stdout();
    assert!(out.contains("all 3 nodes answered"), "{out}");
    for id in ["n0", "n1", "n2"] {
        assert!(
            out.lines().any(|l| l.starts_with(id) && l.contains(" up ")),
            "{id}: {out}"
        );
    }

    // A killed peer is reported down within the failure timeout (plus one heartbeat tick of detection).
    n2.child.kill().unwrap();
    let killed = Instant::now();
    let down = n0.wait_line("peer n2 down", killed, Duration::from_secs(10));
    let took = down - killed;
    assert!(
        took <= Duration::from_millis(TIMEOUT_MS + 2 * HEARTBEAT_MS + 400),
        "reported after {took:?}"
    );
    hetgnn(d, &["doctor", "--config", "cluster.toml", "--timeout", "1"]).fails_with(1, &["n2"]);

    // Restarted with the same configuration, it is reported up again and answers.
    let restarted = Instant::now();
    n2 = start_node(d, "n2");
    n0.wait_line("peer n2 up", restarted, Duration::from_secs(20));
    let out = hetgnn(
        d,
        &["doctor", "--config", "cluster.toml", "--timeout", "10"],
    )
    .ok()
    .stdout();
    assert!(out.contains("all 3 nodes answered"), "{out}");
    drop(n2);
}

#[test]
fn bad_cluster_configs_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let h = cluster_header();
    let two = nodes_toml(&["n0", "n1"]);
    let cases: Vec<(String, &[&str])> = vec![
        (
            format!("{h}heartbeat = 5\n{two}"),
            &["unknown field `heartbeat`"],
        ),
        (
            format!(
                "{h}{two}[[cluster.nodes]]\nid = \"n1\"\naddr = \"127.0.0.1:{}\"\n",
                free_port()
            ),
            &["cluster.nodes[2].id", "twice"],
        ),
        (
            format!("{h}{two}[placement]\nreducer = \"n9\"\n"),
            &["placement.\"reducer\"", "n9"],
        ),
        (
            format!("{h}[[cluster.nodes]]\nid = \"n0\"\naddr = \"no-such-host.invalid:4000\"\n"),
            &["cluster.nodes[0].addr"],
        ),
        (
            format!("{h}[[cluster.nodes]]\nid = \"n0\"\naddr = \"192.0.2.1:4000\"\n"),
            &["cluster.nodes[0].addr", "cannot listen"],
        ),
        (
            format!("[cluster]\ncerts_dir = \"elsewhere\"\n{two}"),
            &["cluster.certs_dir", "does not exist"],
        ),
        (format!("{h}{two}[chaos]\ndrop = 2\n"), &["chaos.drop"]),
    ];
    for (text, needles) in cases {
        write_cluster(d, &text);
        let run = hetgnn(d, &["node", "--config", "cluster.toml", "--node", "n0"]);
        run.fails_with(1, needles);
    }
    write_cluster(d, &format!("{h}{two}"));
    hetgnn(d, &["node", "--config", "cluster.toml", "--node", "n9"])
        .fails_with(1, &["n9", "not in cluster.nodes"]);
    hetgnn(
        d,
        &[
            "node",
            "--config",
            "cluster.toml",
            "--node",
            "n0",
            "--set",
            "cluster.failure_timeout_ms=10",
        ],
    )
    .fails_with(1, &["cluster.failure_timeout_ms"]);
    hetgnn(d, &["doctor", "--config", "missing.toml"]).fails_with(1, &["missing.toml"]);
    // A certificate signed by another CA is refused before any connection.
    hetgnn(d, &["certs", "init", "--out", "other", "--nodes", "n1"]).ok();
    std::fs::copy(d.join("other/n1.pem"), d.join("certs/n1.pem")).unwrap();
    hetgnn(d, &["doctor", "--config", "cluster.toml"])
        .fails_with(1, &["n1.pem", "not signed by the cluster CA"]);
}

#[test]
fn launch_stops_every_node_when_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(
        d,
        &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
    )
    .ok();
    // n1's address cannot be bound here: it fails at start, and launch stops n0 and n2.
    let body = format!(
        "{}[[cluster.nodes]]\nid = \"n0\"\naddr = \"127.0.0.1:{}\"\n[[cluster.nodes]]\nid = \"n1\"\naddr = \"192.0.2.1:4000\"\n[[cluster.nodes]]\nid = \"n2\"\naddr = \"127.0.0.1:{}\"\n",
        cluster_header(),
        free_port(),
        free_port()
    );
    write_cluster(d, &body);
    let run = hetgnn(d, &["launch", "--config", "cluster.toml"])
        .fails_with(1, &["[n1]", "cluster.nodes[1].addr", "node n1 failed"]);
    let err = run.stderr();
    let pids: Vec<u32> = err
        .lines()
        .filter_map(|l| l.split("(pid ").nth(1)?.split(')').next()?.parse().ok())
        .collect();
    assert_eq!(pids.len(), 3, "{err}");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} still running:\n{err}"
        );
    }
}
