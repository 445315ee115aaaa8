//! `hetgnn serve` end to end: answers equal to offline `predict` and `embed`,
//! hostile requests refused, reloads without a dropped request, and a drain
//! on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graphs::npy::{DType, NpyFile};
use serde_json::{json, Value};

use crate::util::hetgnn;

/// A running `hetgnn serve`, killed when dropped.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `serve` on a free port and waits until it is ready (60 s at most).
    fn start(dir: &Path, args: &[&str]) -> Server {
        let server = Server::launch(dir, args);
        server.wait_ready();
        server
    }

    /// Starts `serve` on a free port and waits until it listens (it loads after).
    fn launch(dir: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hetgnn"))
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("piped");
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("serve: listening on http://") {
                    let _ = tx.send(a.to_string());
                }
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("serve did not listen:\n{}", log.lock().unwrap()));
        Server { child, addr, log }
    }

    /// Waits until the server is ready (its model loaded; 120 s at most).
    fn wait_ready(&self) {
        let start = Instant::now();
        while self.get("/readyz").0 != 200 {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "serve not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn get(&self, path: &str) -> (u16, String) {
        http(&self.addr, "GET", path, &[], "")
    }

    /// POSTs JSON; the status and the parsed body.
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (code, text) = http(
            &self.addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            &body.to_string(),
        );
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: {code} not JSON ({e}): {text}"));
        (code, v)
    }

    /// Sends SIGTERM and waits for the exit status (30 s at most).
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on its own connection; the status and body.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    exchange(s, addr, method, path, headers, body)
}

/// One HTTP/1.1 request over `s`, which the server closes after answering.
fn exchange(
    mut s: impl Read + Write,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut out = Vec::new();
    // A TLS peer may close without close_notify: keep what arrived.
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).to_string();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {out}"));
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

/// A small graph with a trained checkpoint under `ck`.
fn trained(dir: &Path, extra: &[&str]) {
    hetgnn(dir, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let mut args = vec![
        "train",
        "--data",
        "g",
        "--epochs",
        "1",
        "--batch",
        "256",
        "--hidden",
        "16",
        "--checkpoint",
        "ck",
    ];
    args.extend_from_slice(extra);
    hetgnn(dir, &args).ok();
}

/// The classes a server at `addr` predicts for `ids` (asserting a 200).
fn predicted(addr: &str, ids: &[u32]) -> Vec<i64> {
    let body = json!({ "ids": ids }).to_string();
    let (code, text) = http(
        addr,
        "POST",
        "/v1/predict",
        &[("Content-Type", "application/json")],
        &body,
    );
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_i64().unwrap())
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}

#[test]
fn served_answers_equal_offline_predict_and_embed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &[]);
    let model = ["--checkpoint", "ck", "--data", "g"];
    let predict = |extra: &[&str]| {
        let mut a = vec!["predict"];
        a.extend_from_slice(&model);
        a.extend_from_slice(extra);
        hetgnn(dir, &a).ok()
    };
    // Offline answers, and their independence of the batch size. Every
    // target node: layer 1 of every node is computed first (the server
    // below computes it per request, and answers the same).
    let all = predict(&["--out", "p.npy", "--embeddings", "e.npy"]);
    assert!(
        all.stderr()
            .contains("the layers below the last over every node first"),
        "{}",
        all.stderr()
    );
    predict(&["--out", "p7.npy", "--batch", "7"]);
    predict(&[
        "--out",
        "px.npy",
        "--embeddings",
        "ex.npy",
        "--inference",
        "exact",
    ]);
    let mut a = vec!["embed"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--out", "emb"]);
    hetgnn(dir, &a).ok();
    let classes = |f: &str| {
        let p = NpyFile::open(&dir.join(f), DType::I64).unwrap();
        (0..p.len()).map(|i| p.i64_at(i)).collect::<Vec<_>>()
    };
    let rows = |f: &str| {
        NpyFile::open(&dir.join(f), DType::F32)
            .unwrap()
            .to_f32_vec()
    };
    let (p, p7, px) = (classes("p.npy"), classes("p7.npy"), classes("px.npy"));
    assert_eq!(p, p7, "sampled predictions depend on --batch");
    let (e, ex) = (rows("e.npy"), rows("ex.npy"));
    let width = e.len() / p.len();

    let ids = [5u32, 0, 1000, 5, 77, 1472];
    let sampled = Server::start(dir, &model);
    let (code, r) = sampled.post(
        "/v1/predict",
        &json!({"ids": ids, "probabilities": true, "embeddings": true}),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["type"], "paper");
    let got: Vec<i64> = r["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_i64().unwrap())
        .collect();
    let want: Vec<i64> = ids.iter().map(|&i| p[i as usize]).collect();
    assert_eq!(got, want, "served classes differ from predict's");
    let want_e: Vec<f32> = ids
        .iter()
        .flat_map(|&i| e[i as usize * width..][..width].to_vec())
        .collect();
    assert!(
        close(&floats(&r["embeddings"]), &want_e),
        "served embeddings differ from predict's"
    );
    for (k, probs) in r["probabilities"].as_array().unwrap().iter().enumerate() {
        let probs: Vec<f64> = probs
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-4);
        let best = (0..probs.len()).fold(0, |b, i| if probs[i] > probs[b] { i } else { b });
        assert_eq!(
            best as i64, want[k],
            "the most probable class is the prediction"
        );
    }
    // Concurrent requests, of 20 nodes and of 1-3, share batches and get
    // the answers they get alone.
    let addr = sampled.addr.clone();
    let mut clients: Vec<Vec<Vec<u32>>> = (0..8u32)
        .map(|t| vec![(0..20).map(|i| (t * 131 + i * 17) % 1473).collect()])
        .collect();
    clients.extend((0..6u32).map(|t| {
        (0..5u32)
            .map(|k| {
                (0..1 + k % 3)
                    .map(|i| (t * 97 + k * 31 + i * 7) % 1473)
                    .collect()
            })
            .collect()
    }));
    let handles: Vec<_> = clients
        .into_iter()
        .map(|requests| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                requests
                    .into_iter()
                    .map(|ids| {
                        let got = predicted(&addr, &ids);
                        (ids, got)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        for (ids, got) in h.join().unwrap() {
            assert_eq!(got, ids.iter().map(|&i| p[i as usize]).collect::<Vec<_>>());
        }
    }
    // Sampled inference embeds the target type only, and says how to get the rest.
    let (code, r) = sampled.post("/v1/embed", &json!({"type": "author", "ids": [0]}));
    assert_eq!(code, 400);
    assert!(r["error"].as_str().unwrap().contains("exact"), "{r}");
    let metrics = sampled.get("/metrics").1;
    assert!(
        metrics.contains("hetgnn_serve_requests_total{endpoint=\"/v1/predict\",status=\"200\"} 39"),
        "{metrics}"
    );
    assert!(sampled.stop().success(), "SIGTERM ends serve with 0");

    let exact = Server::start(dir, &[&model[..], &["--inference", "exact"]].concat());
    let (code, r) = exact.post("/v1/predict", &json!({"ids": ids, "embeddings": true}));
    assert_eq!(code, 200, "{r}");
    let got: Vec<i64> = r["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_i64().unwrap())
        .collect();
    assert_eq!(
        got,
        ids.iter().map(|&i| px[i as usize]).collect::<Vec<_>>(),
        "exact classes differ from predict --inference exact"
    );
    let want_e: Vec<f32> = ids
        .iter()
        .flat_map(|&i| ex[i as usize * width..][..width].to_vec())
        .collect();
    assert!(close(&floats(&r["embeddings"]), &want_e));
    let authors = rows("emb/author.npy");
    let aw = NpyFile::open(&dir.join("emb/author.npy"), DType::F32)
        .unwrap()
        .shape()[1] as usize;
    let (code, r) = exact.post("/v1/embed", &json!({"type": "author", "ids": [3, 0, 3]}));
    assert_eq!(code, 200, "{r}");
    let want_a: Vec<f32> = [3usize, 0, 3]
        .iter()
        .flat_map(|&i| authors[i * aw..][..aw].to_vec())
        .collect();
    assert!(
        close(&floats(&r["embeddings"]), &want_a),
        "served embeddings differ from embed's"
    );
    assert!(exact.stop().success());
}

#[test]
fn sampled_inference_over_whole_neighbourhoods_is_exact_inference() {
    // With fanouts above every degree, sampling draws every neighbour: the two
    // inferences (two code paths) must agree.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &["--fanouts", "100000,100000"]);
    for (out, emb, how) in [("s.npy", "se.npy", "sampled"), ("x.npy", "xe.npy", "exact")] {
        hetgnn(
            dir,
            &[
                "predict",
                "--checkpoint",
                "ck",
                "--data",
                "g",
                "--out",
                out,
                "--embeddings",
                emb,
                "--inference",
                how,
            ],
        )
        .ok();
    }
    let c = |f: &str| {
        let p = NpyFile::open(&dir.join(f), DType::I64).unwrap();
        (0..p.len()).map(|i| p.i64_at(i)).collect::<Vec<_>>()
    };
    let r = |f: &str| {
        NpyFile::open(&dir.join(f), DType::F32)
            .unwrap()
            .to_f32_vec()
    };
    assert!(close(&r("se.npy"), &r("xe.npy")), "embeddings differ");
    let (s, x) = (c("s.npy"), c("x.npy"));
    let same = s.iter().zip(&x).filter(|(a, b)| a == b).count();
    // Near-ties may flip in the last bit of a sum's order; nearly all must agree.
    assert!(
        same * 1000 >= s.len() * 999,
        "{same} of {} classes agree",
        s.len()
    );
}

#[test]
fn serve_refuses_hostile_requests_and_keeps_answering() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &[]);
    std::fs::write(dir.join("token"), "s3cret-token-of-enough-length\n").unwrap();
    let s = Server::start(
        dir,
        &[
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--max-ids",
            "100",
            "--max-body-bytes",
            "20000",
            "--admin-token-file",
            "token",
            "--timeout-ms",
            "2000",
        ],
    );
    let json_h = [("Content-Type", "application/json")];
    // (method, path, headers, body, status, what the error says)
    type Case<'a> = (
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        String,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            "{\"ids\": [1,".into(),
            400,
            "malformed",
        ),
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            "{\"ids\": [1], \"colour\": 1}".into(),
            400,
            "unknown field",
        ),
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            "{\"ids\": [1.5]}".into(),
            400,
            "malformed",
        ),
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            "{\"ids\": []}".into(),
            400,
            "empty",
        ),
        (
            "POST",
            "/v1/predict",
            vec![],
            "{\"ids\": [1]}".into(),
            415,
            "Content-Type",
        ),
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            json!({"ids": (0..101).collect::<Vec<_>>()}).to_string(),
            413,
            "at most 100",
        ),
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            format!("{{\"ids\": [{}]}}", vec!["1"; 20000].join(",")),
            413,
            "larger",
        ),
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            "{\"ids\": [1, 99999, -3, \"x\"]}".into(),
            404,
            "3 id(s)",
        ),
        (
            "POST",
            "/v1/predict",
            json_h.to_vec(),
            "{\"type\": \"author\", \"ids\": [1]}".into(),
            400,
            "classifies nodes of type 'paper' only",
        ),
        (
            "POST",
            "/v1/embed",
            json_h.to_vec(),
            "{\"type\": \"\\u001b[31mx\", \"ids\": [1]}".into(),
            400,
            "unknown node type",
        ),
        (
            "GET",
            "/v1/nothing",
            vec![],
            String::new(),
            404,
            "no such endpoint",
        ),
        (
            "POST",
            "/admin/reload",
            vec![],
            String::new(),
            401,
            "Bearer",
        ),
        (
            "POST",
            "/admin/reload",
            vec![("Authorization", "Bearer wrong")],
            String::new(),
            401,
            "Bearer",
        ),
    ];
    for (method, path, headers, body, code, needle) in &cases {
        let (got, text) = http(&s.addr, method, path, headers, body);
        assert_eq!(got, *code, "{method} {path} {body:.80}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let msg = v["error"].as_str().unwrap();
        assert!(
            msg.contains(needle),
            "{path}: {msg:?} should mention {needle:?}"
        );
        assert!(
            !msg.contains('\u{1b}'),
            "escape sequences are not echoed raw: {msg:?}"
        );
    }
    let (code, _) = http(&s.addr, "GET", "/v1/predict", &[], "");
    assert_eq!(code, 405);
    // After all that, a good request is answered.
    let (code, r) = s.post("/v1/predict", &json!({"ids": [1, 2]}));
    assert_eq!(code, 200, "{r}");
    // A reload with the token: a newer checkpoint is picked up.
    hetgnn(
        dir,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "2",
            "--batch",
            "256",
            "--hidden",
            "16",
            "--checkpoint",
            "ck",
            "--resume",
        ],
    )
    .ok();
    let (code, text) = http(
        &s.addr,
        "POST",
        "/admin/reload",
        &[("Authorization", "Bearer s3cret-token-of-enough-length")],
        "",
    );
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["epochs"], 2, "{v}");
    let (_, info) = s.get("/v1/model");
    assert!(info.contains("\"epochs\":2"), "{info}");
    // A client sending its headers slowly is cut off after the request
    // timeout (2 s here) instead of holding its connection for ever.
    let mut loris = TcpStream::connect(&s.addr).unwrap();
    loris
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let began = Instant::now();
    loris
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut loris, &mut rest);
    let held = began.elapsed();
    assert!(
        held >= Duration::from_millis(1500) && held < Duration::from_secs(10),
        "a half-sent request held its connection {held:?}"
    );
    // A client that never finishes its request does not hold SIGTERM up
    // beyond the request timeout (stop() allows 30 s).
    let mut slow = TcpStream::connect(&s.addr).unwrap();
    slow.write_all(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        .unwrap();
    let stopping = Instant::now();
    assert!(s.stop().success());
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "drained in {:?}",
        stopping.elapsed()
    );
}

#[test]
fn serve_refuses_bad_options_before_listening() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    hetgnn(dir, &["serve", "--checkpoint", "nowhere", "--data", "g"])
        .fails_with(1, &["--checkpoint nowhere", "no such file"]);
    std::fs::write(dir.join("short"), "abc").unwrap();
    std::fs::create_dir(dir.join("ck")).unwrap();
    // Options refused before the checkpoint is read.
    for (extra, why) in [
        (
            &["--admin-token-file", "short"][..],
            "at least 16 characters",
        ),
        (&["--max-ids", "0"][..], "--max-ids must be at least 1"),
        (
            &["--inference", "exact", "--precompute"][..],
            "--precompute is for sampled inference",
        ),
    ] {
        let args = [&["serve", "--checkpoint", "ck", "--data", "ck"][..], extra].concat();
        hetgnn(dir, &args).fails_with(1, &[why]);
    }
    // A checkpoint that cannot be loaded ends serve with its error (not a server that never gets ready).
    hetgnn(dir, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    hetgnn(
        dir,
        &[
            "serve",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .fails_with(1, &["ck"]);
}

#[test]
fn served_answers_equal_predict_for_every_relational_model() {
    for kind in ["rgat", "hgt"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        trained(dir, &["--model", kind]);
        let model = ["--checkpoint", "ck", "--data", "g"];
        for (how, out, emb) in [("sampled", "p.npy", "e.npy"), ("exact", "px.npy", "ex.npy")] {
            let mut a = vec!["predict"];
            a.extend_from_slice(&model);
            a.extend_from_slice(&["--out", out, "--embeddings", emb, "--inference", how]);
            hetgnn(dir, &a).ok();
        }
        let ids = [3u32, 900, 3, 41];
        // Precomputed layers below the last answer as sampling every layer per request does.
        for (how, out, emb) in [
            (&["--inference", "sampled"][..], "p.npy", "e.npy"),
            (
                &["--inference", "sampled", "--precompute"][..],
                "p.npy",
                "e.npy",
            ),
            (&["--inference", "exact"][..], "px.npy", "ex.npy"),
        ] {
            let p = NpyFile::open(&dir.join(out), DType::I64).unwrap();
            let e = NpyFile::open(&dir.join(emb), DType::F32).unwrap();
            let width = e.shape()[1] as usize;
            let e = e.to_f32_vec();
            let s = Server::start(dir, &[&model[..], how].concat());
            let (_, info) = s.get("/v1/model");
            let info: Value = serde_json::from_str(&info).unwrap();
            assert_eq!(info["precomputed"], how.contains(&"--precompute"), "{info}");
            let how = how.join(" ");
            let (code, r) = s.post("/v1/predict", &json!({"ids": ids, "embeddings": true}));
            assert_eq!(code, 200, "{kind} {how}: {r}");
            let got: Vec<i64> = r["predictions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_i64().unwrap())
                .collect();
            let want: Vec<i64> = ids.iter().map(|&i| p.i64_at(i as usize)).collect();
            assert_eq!(got, want, "{kind} {how}: classes differ from predict's");
            let want_e: Vec<f32> = ids
                .iter()
                .flat_map(|&i| e[i as usize * width..][..width].to_vec())
                .collect();
            assert!(
                close(&floats(&r["embeddings"]), &want_e),
                "{kind} {how}: embeddings differ from predict's"
            );
            assert!(s.stop().success());
        }
    }
}

#[test]
fn a_regression_model_predicts_and_serves_values() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &["--task", "node-regression"]);
    let model = ["--checkpoint", "ck", "--data", "g"];
    for (out, how) in [
        ("v.npy", "sampled"),
        ("vx.npy", "exact"),
        ("v.csv", "sampled"),
    ] {
        let mut a = vec!["predict"];
        a.extend_from_slice(&model);
        a.extend_from_slice(&["--out", out, "--inference", how]);
        hetgnn(dir, &a).ok();
    }
    let v = NpyFile::open(&dir.join("v.npy"), DType::F32).unwrap();
    let papers = v.shape()[0] as usize;
    let v = v.to_f32_vec();
    let vx = NpyFile::open(&dir.join("vx.npy"), DType::F32)
        .unwrap()
        .to_f32_vec();
    assert_eq!(vx.len(), papers);
    assert!(v.iter().chain(&vx).all(|x| x.is_finite()));
    // Values, not classes: they vary and are not all integers.
    assert!(v.iter().any(|x| x.fract() != 0.0));
    // The table holds the same values under the node ids.
    let csv = std::fs::read_to_string(dir.join("v.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("id,value"));
    let row: Vec<&str> = lines.nth(7).unwrap().split(',').collect();
    assert_eq!(row[0], "7");
    assert!((row[1].parse::<f32>().unwrap() - v[7]).abs() <= 1e-5 * (1.0 + v[7].abs()));

    let ids = [7u32, 0, 7, 300];
    for (how, want) in [("sampled", &v), ("exact", &vx)] {
        let s = Server::start(dir, &[&model[..], &["--inference", how]].concat());
        let (code, r) = s.post("/v1/predict", &json!({"ids": ids}));
        assert_eq!(code, 200, "{how}: {r}");
        let got: Vec<f32> = r["predictions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let want: Vec<f32> = ids.iter().map(|&i| want[i as usize]).collect();
        assert!(close(&got, &want), "{how}: {got:?} vs predict's {want:?}");
        let (code, info) = s.get("/v1/model");
        assert_eq!(code, 200);
        let info: Value = serde_json::from_str(&info).unwrap();
        assert_eq!(info["task"], "node-regression");
        assert!(s.stop().success());
    }
}

#[test]
fn a_multi_label_model_predicts_and_serves_label_sets() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &["--task", "multi-label", "--lr", "0.05"]);
    let model = ["--checkpoint", "ck", "--data", "g"];
    for out in ["s.npy", "s.csv"] {
        let mut a = vec!["predict"];
        a.extend_from_slice(&model);
        a.extend_from_slice(&["--out", out]);
        hetgnn(dir, &a).ok();
    }
    // int8 [papers, 16] of 0/1, in node order.
    let s = NpyFile::open(&dir.join("s.npy"), DType::I8).unwrap();
    let papers = s.shape()[0] as usize;
    assert_eq!(s.shape(), &[papers as u64, 16]);
    let bits: Vec<i8> = s.data().iter().map(|&b| b as i8).collect();
    assert!(bits.iter().all(|&b| b == 0 || b == 1));
    let set = |n: usize| -> Vec<u32> {
        (0..16u32)
            .filter(|&j| bits[n * 16 + j as usize] == 1)
            .collect()
    };
    // Some labels are predicted, not every one everywhere.
    let ones = bits.iter().filter(|&&b| b == 1).count();
    assert!(ones > 0 && ones < bits.len(), "{ones} of {}", bits.len());
    // The table lists the same labels joined by ';' under the node ids.
    let csv = std::fs::read_to_string(dir.join("s.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("id,labels"));
    for (n, line) in lines.enumerate().take(50) {
        let (id, labels) = line.split_once(',').unwrap();
        assert_eq!(id, n.to_string());
        let got: Vec<u32> = labels
            .split(';')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(got, set(n), "node {n}");
    }

    let ids = [7u32, 0, 7, 300];
    let s = Server::start(dir, &model);
    let (code, r) = s.post("/v1/predict", &json!({"ids": ids, "probabilities": true}));
    assert_eq!(code, 200, "{r}");
    let probabilities = floats(&r["probabilities"]);
    assert_eq!(probabilities.len(), ids.len() * 16);
    for (i, &n) in ids.iter().enumerate() {
        let got: Vec<u32> = r["predictions"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got, set(n as usize), "node {n}: served vs predict's");
        // A label is predicted exactly where its probability is above 0.5.
        let p = &probabilities[i * 16..(i + 1) * 16];
        let above: Vec<u32> = (0..16u32).filter(|&j| p[j as usize] > 0.5).collect();
        assert_eq!(above, got, "node {n}: {p:?}");
    }
    let (code, info) = s.get("/v1/model");
    assert_eq!(code, 200);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["task"], "multi-label");
    assert_eq!(info["classes"], 16);
    assert!(s.stop().success());
}

#[test]
fn an_edge_model_scores_given_edges_as_its_evaluation_did() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rel = "author__writes__paper";
    trained(
        dir,
        &[
            "--task",
            "edge-classification",
            "--target-relations",
            rel,
            "--report",
            "r.json",
        ],
    );
    // The test edges, as (source, destination) pairs, from the graph's files.
    let edges = NpyFile::open(&dir.join(format!("g/edges/{rel}.npy")), DType::I64).unwrap();
    let n = edges.shape()[1] as usize;
    let test = NpyFile::open(&dir.join(format!("g/edges/{rel}/test.npy")), DType::I64).unwrap();
    let labels = NpyFile::open(&dir.join(format!("g/edges/{rel}/labels.npy")), DType::I64).unwrap();
    let pos: Vec<usize> = (0..test.len()).map(|i| test.i64_at(i) as usize).collect();
    let mut pairs: Vec<i64> = pos.iter().map(|&p| edges.i64_at(p)).collect();
    pairs.extend(pos.iter().map(|&p| edges.i64_at(n + p)));
    graphs::npy::write_i64(&dir.join("test-edges.npy"), &[2, pos.len() as u64], &pairs).unwrap();
    let model = ["--checkpoint", "ck", "--data", "g"];
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--edges", "test-edges.npy", "--out", "c.npy"]);
    hetgnn(dir, &a).ok();
    let c = NpyFile::open(&dir.join("c.npy"), DType::I64).unwrap();
    assert_eq!(c.len(), pos.len());
    let right = (0..pos.len())
        .filter(|&i| c.i64_at(i) == labels.i64_at(pos[i]))
        .count();
    // The share right is the report's test accuracy: the same model, the same exact inference.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    let want = report["epochs"][0]["test_acc"].as_f64().unwrap();
    let got = right as f64 / pos.len() as f64;
    assert!(
        (got - want).abs() < 1e-9,
        "predict {got} vs the report's {want}"
    );
    // A table of original ids gives the same classes.
    std::fs::write(
        dir.join("e.csv"),
        format!(
            "src,dst\n{},{}\n{},{}\n",
            pairs[0],
            pairs[pos.len()],
            pairs[1],
            pairs[pos.len() + 1]
        ),
    )
    .unwrap();
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--edges", "e.csv", "--out", "c.csv"]);
    hetgnn(dir, &a).ok();
    let csv = std::fs::read_to_string(dir.join("c.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], "src,dst,class");
    assert_eq!(
        rows[1],
        format!("{},{},{}", pairs[0], pairs[pos.len()], c.i64_at(0))
    );

    // Refused: no --edges for an edge model, --edges for a node model, ids out of range.
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--out", "x.npy"]);
    hetgnn(dir, &a).fails_with(1, &["--edges", "edge task"]);
    graphs::npy::write_i64(&dir.join("bad.npy"), &[2, 1], &[0, 1 << 30]).unwrap();
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--edges", "bad.npy", "--out", "y.npy"]);
    hetgnn(dir, &a).fails_with(1, &["destination id 1073741824 is out of range"]);
    // serve answers embeddings, not per-node predictions, and names the task.
    let s = Server::start(dir, &model);
    let (code, info) = s.get("/v1/model");
    assert_eq!(code, 200);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["task"], "edge-classification");
    let (code, r) = s.post("/v1/predict", &json!({"ids": [0]}));
    assert_eq!(code, 400, "{r}");
    // Edges are scored from exact embeddings only.
    let (code, r) = s.post("/v1/score_edges", &json!({"src": [0], "dst": [0]}));
    assert_eq!(code, 400, "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("--inference exact"),
        "{r}"
    );
    assert!(s.stop().success());
    // With them, the served classes of the test edges are `predict`'s.
    let mut exact = model.to_vec();
    exact.extend_from_slice(&["--inference", "exact"]);
    let s = Server::start(dir, &exact);
    let k = pos.len().min(200);
    let body = json!({
        "src": &pairs[..k],
        "dst": &pairs[pos.len()..pos.len() + k],
        "probabilities": true,
    });
    let (code, r) = s.post("/v1/score_edges", &body);
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["relation"], rel);
    let served: Vec<i64> = r["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let offline: Vec<i64> = (0..k).map(|i| c.i64_at(i)).collect();
    assert_eq!(served, offline);
    assert_eq!(r["probabilities"].as_array().unwrap().len(), k);
    for (body, want) in [
        (
            json!({"src": [0, 1], "dst": [0]}),
            "2 sources and 1 destinations",
        ),
        (json!({"src": [], "dst": []}), "name at least one edge"),
        (
            json!({"relation": "paper__cites__paper", "src": [0], "dst": [0]}),
            "trained on the edges of author__writes__paper",
        ),
    ] {
        let (code, r) = s.post("/v1/score_edges", &body);
        assert_eq!(code, 400, "{r}");
        assert!(r["error"].as_str().unwrap().contains(want), "{r}");
    }
    let (code, r) = s.post("/v1/score_edges", &json!({"src": [1 << 30], "dst": [0]}));
    assert_eq!(code, 404, "{r}");
    assert!(s.stop().success());
}

#[test]
fn a_link_predictor_scores_given_edges_offline_and_served_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rel = "paper__cites__paper";
    trained(
        dir,
        &["--task", "link-prediction", "--target-relations", rel],
    );
    let model = ["--checkpoint", "ck", "--data", "g"];
    // Every node's exact embeddings, and edges to score: some of the graph's, some not.
    let mut a = vec!["embed"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--out", "emb"]);
    hetgnn(dir, &a).ok();
    let emb = NpyFile::open(&dir.join("emb/paper.npy"), DType::F32).unwrap();
    let width = emb.shape()[1] as usize;
    let emb = emb.to_f32_vec();
    let row = |v: i64| emb[v as usize * width..(v as usize + 1) * width].to_vec();
    let (src, dst): (Vec<i64>, Vec<i64>) = (0..40).map(|i| (i, (i * 7 + 3) % 50)).unzip();
    let mut pairs = src.clone();
    pairs.extend(&dst);
    graphs::npy::write_i64(&dir.join("pairs.npy"), &[2, src.len() as u64], &pairs).unwrap();
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--edges", "pairs.npy", "--out", "s.npy"]);
    hetgnn(dir, &a).ok();
    let offline = NpyFile::open(&dir.join("s.npy"), DType::F32)
        .unwrap()
        .to_f32_vec();
    assert_eq!(offline.len(), src.len());
    // A dot decoder's score is the dot product of the ends' embeddings.
    let want: Vec<f32> = src
        .iter()
        .zip(&dst)
        .map(|(&u, &v)| row(u).iter().zip(row(v)).map(|(a, b)| a * b).sum())
        .collect();
    assert!(close(&offline, &want), "{offline:?} vs {want:?}");
    // A table names the score and its probability.
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--edges", "pairs.npy", "--out", "s.csv"]);
    hetgnn(dir, &a).ok();
    let csv = std::fs::read_to_string(dir.join("s.csv")).unwrap();
    assert!(csv.starts_with("src,dst,score,probability\n"), "{csv}");
    // Without --edges: refused, naming the task.
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--out", "x.npy"]);
    hetgnn(dir, &a).fails_with(1, &["--edges", "link prediction"]);
    // Served: the same scores, and their sigmoid as probabilities.
    let mut exact = model.to_vec();
    exact.extend_from_slice(&["--inference", "exact"]);
    let server = Server::start(dir, &exact);
    let body = json!({"src": src, "dst": dst, "probabilities": true});
    let (code, r) = server.post("/v1/score_edges", &body);
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["relation"], rel);
    let served: Vec<f32> = r["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert!(close(&served, &offline), "{served:?} vs {offline:?}");
    let p = floats(&r["probabilities"]);
    let sigmoid: Vec<f32> = offline.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
    assert!(close(&p, &sigmoid), "{p:?}");
    let (code, r) = server.post(
        "/v1/score_edges",
        &json!({"relation": "author__writes__paper", "src": [0], "dst": [0]}),
    );
    assert_eq!(code, 400, "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("trained on the edges of paper__cites__paper"),
        "{r}"
    );
    assert!(server.stop().success());
}

#[test]
fn names_imported_from_tables_come_back_in_predictions_and_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    // Every node has "bio", so a trained model predicts it; edges are fraud or legit.
    let mut nodes = String::from("id,x,topics,split\n");
    let mut edges = String::from("s,d,kind,split\n");
    for i in 0..24 {
        let split = ["train", "train", "valid", "test"][i % 4];
        let extra = ["", ";chem", ";phys"][i % 3];
        nodes += &format!("n{i},{},bio{extra},{split}\n", i % 5);
        for j in [1, 5] {
            let kind = if (i + j) % 2 == 0 { "fraud" } else { "legit" };
            edges += &format!("n{i},n{},{kind},{split}\n", (i + j) % 24);
        }
    }
    write("n.csv", &nodes);
    write("e.csv", &edges);
    write(
        "g.toml",
        "[[nodes]]\ntype = \"p\"\nfiles = [\"n.csv\"]\nid = \"id\"\n[[nodes.features]]\ncolumns = [\"x\"]\n[nodes.label_set]\ncolumn = \"topics\"\n[nodes.split]\ncolumn = \"split\"\n[[edges]]\nrelation = [\"p\", \"cites\", \"p\"]\nfiles = [\"e.csv\"]\nsource = \"s\"\ndestination = \"d\"\nlabel = \"kind\"\nsplit = \"split\"\n",
    );
    hetgnn(
        dir,
        &["import", "tables", "--config", "g.toml", "--out", "g"],
    )
    .ok();
    let train = |ck: &str, extra: &[&str]| {
        let mut a = vec![
            "train",
            "--data",
            "g",
            "--epochs",
            "20",
            "--lr",
            "0.05",
            "--checkpoint",
            ck,
        ];
        a.extend_from_slice(extra);
        hetgnn(dir, &a).ok();
    };

    // Multi-label: the table and the server name the labels.
    train("ml", &["--task", "multi-label"]);
    hetgnn(
        dir,
        &[
            "predict",
            "--checkpoint",
            "ml",
            "--data",
            "g",
            "--out",
            "s.csv",
        ],
    )
    .ok();
    let csv = std::fs::read_to_string(dir.join("s.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("id,labels"));
    let first = lines.next().unwrap();
    assert!(first.starts_with("n0,") && first.contains("bio"), "{first}");
    let s = Server::start(dir, &["--checkpoint", "ml", "--data", "g"]);
    let (code, r) = s.post("/v1/predict", &json!({"ids": ["n0", "n1"]}));
    assert_eq!(code, 200, "{r}");
    let names = ["bio", "chem", "phys"];
    for i in 0..2 {
        let by_index: Vec<&str> = r["predictions"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| names[j.as_u64().unwrap() as usize])
            .collect();
        let by_name: Vec<&str> = r["label_names"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        assert_eq!(by_index, by_name);
        assert!(by_name.contains(&"bio"), "{r}");
    }
    assert!(r.get("class_names").is_none(), "{r}");
    // A new node given by its raw columns (through the import's saved
    // transforms) is answered as the same node given by its feature row.
    let (_, before) = s.post("/v1/predict", &json!({"ids": ["n0"]}));
    let ask = |node: Value| {
        s.post(
            "/v1/predict",
            &json!({
                "ids": ["new", "n0"], "probabilities": true,
                "new_nodes": [node],
                "new_edges": [
                    {"relation": "cites", "src": "new", "dst": "n0"},
                    {"relation": "p__cites__p", "src": "n2", "dst": "new"}
                ]
            }),
        )
    };
    let (code, by_columns) = ask(json!({"type": "p", "id": "new", "columns": {"x": 3}}));
    assert_eq!(code, 200, "{by_columns}");
    let (code, by_row) = ask(json!({"type": "p", "id": "new", "features": [3.0]}));
    assert_eq!(code, 200, "{by_row}");
    assert_eq!(by_columns, by_row);
    assert_eq!(by_row["ids"], json!(["new", "n0"]));
    assert_eq!(by_row["predictions"].as_array().unwrap().len(), 2);
    // The stored graph is unchanged: n0 alone is answered as before.
    let (_, after) = s.post("/v1/predict", &json!({"ids": ["n0"]}));
    assert_eq!(before, after);
    for (node, code, says) in [
        (
            json!({"type": "p", "id": "new", "columns": {"y": 1}}),
            400,
            "not a feature column",
        ),
        (
            json!({"type": "p", "id": "n4", "features": [1.0]}),
            400,
            "already a node",
        ),
        (
            json!({"type": "p", "id": "new", "features": [1.0, 2.0]}),
            400,
            "feature values",
        ),
    ] {
        let (c, r) = ask(node);
        assert_eq!(c, code, "{r}");
        assert!(r["error"].as_str().unwrap().contains(says), "{r}");
    }
    let (c, r) = s.post(
        "/v1/predict",
        &json!({"ids": ["n0"], "new_edges": [{"relation": "cites", "src": "zz", "dst": "n0"}]}),
    );
    assert_eq!(c, 404, "{r}");
    assert!(s.stop().success());

    // Edge classes: predict --edges and /v1/score_edges name them.
    let rel = "p__cites__p";
    train(
        "ec",
        &["--task", "edge-classification", "--target-relations", rel],
    );
    write("pairs.csv", "src,dst\nn0,n1\nn3,n8\n");
    hetgnn(
        dir,
        &[
            "predict",
            "--checkpoint",
            "ec",
            "--data",
            "g",
            "--edges",
            "pairs.csv",
            "--out",
            "c.csv",
        ],
    )
    .ok();
    let csv = std::fs::read_to_string(dir.join("c.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("src,dst,class,class_name"));
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(
            f[3],
            ["fraud", "legit"][f[2].parse::<usize>().unwrap()],
            "{line}"
        );
    }
    let s = Server::start(
        dir,
        &["--checkpoint", "ec", "--data", "g", "--inference", "exact"],
    );
    let (code, r) = s.post(
        "/v1/score_edges",
        &json!({"src": ["n0", "n3"], "dst": ["n1", "n8"]}),
    );
    assert_eq!(code, 200, "{r}");
    for i in 0..2 {
        let k = r["predictions"][i].as_u64().unwrap() as usize;
        assert_eq!(r["class_names"][i], ["fraud", "legit"][k], "{r}");
    }
    assert!(s.stop().success());
}

#[test]
fn serve_answers_over_https_with_a_given_certificate() {
    use rustls::pki_types::pem::PemObject;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &[]);
    hetgnn(dir, &["certs", "init", "--out", "certs", "--nodes", "api"]).ok();
    let serve = |tls: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hetgnn"));
        c.args([
            "serve",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(tls)
        .current_dir(dir);
        c
    };
    // A key that is no key, or a certificate without its key, is refused before listening.
    std::fs::write(dir.join("bad.key"), "not a key").unwrap();
    let out = serve(&["--tls-cert", "certs/api.pem", "--tls-key", "bad.key"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not a PEM private key"),
        "{err}"
    );
    let out = serve(&["--tls-cert", "certs/api.pem"]).output().unwrap();
    assert!(!out.status.success(), "a certificate without its key");

    let mut child = serve(&["--tls-cert", "certs/api.pem", "--tls-key", "certs/api.key"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("serve: listening on https://") {
                let _ = tx.send(a.to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("listens on https");
    let ca = std::fs::read(dir.join("certs/ca.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(&ca).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let https = |method: &str, path: &str, body: &str| {
        let tcp = TcpStream::connect(&addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(Arc::clone(&client), name).unwrap();
        let headers = [("Content-Type", "application/json")];
        exchange(
            rustls::StreamOwned::new(conn, tcp),
            &addr,
            method,
            path,
            &headers,
            body,
        )
    };
    let start = Instant::now();
    while https("GET", "/readyz", "").0 != 200 {
        assert!(start.elapsed() < Duration::from_secs(120), "not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, body) = https("POST", "/v1/predict", r#"{"ids": [0, 3]}"#);
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["predictions"].as_array().unwrap().len(), 2, "{v}");
    // Plain HTTP on the HTTPS port gets no answer, and the server keeps serving.
    let mut plain = TcpStream::connect(&addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!String::from_utf8_lossy(&got).contains("200 OK"));
    assert_eq!(https("GET", "/healthz", "").0, 200);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_multi_task_model_predicts_each_task_and_serves_the_primary_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(
        dir,
        &[
            "--set",
            "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]",
        ],
    );
    let model = ["--checkpoint", "ck", "--data", "g"];
    for (out, task) in [("c.npy", None), ("v.npy", Some("node-regression"))] {
        let mut a = vec!["predict"];
        a.extend_from_slice(&model);
        a.extend_from_slice(&["--out", out]);
        if let Some(t) = task {
            a.extend_from_slice(&["--task", t]);
        }
        hetgnn(dir, &a).ok();
    }
    // The primary task by default: classes of the graph's range.
    let g = graphs::load(&dir.join("g"), &Default::default()).unwrap();
    let c = NpyFile::open(&dir.join("c.npy"), DType::I64).unwrap();
    let papers = c.shape()[0] as usize;
    let classes: Vec<i64> = (0..papers).map(|i| c.i64_at(i)).collect();
    assert!(classes
        .iter()
        .all(|&k| (0..i64::from(g.num_classes())).contains(&k)));
    // The regression head: values, one per paper.
    let v = NpyFile::open(&dir.join("v.npy"), DType::F32)
        .unwrap()
        .to_f32_vec();
    assert_eq!(v.len(), papers);
    assert!(v.iter().all(|x| x.is_finite()) && v.iter().any(|x| x.fract() != 0.0));
    // A task it was not trained for is refused, naming those it was.
    let mut a = vec!["predict"];
    a.extend_from_slice(&model);
    a.extend_from_slice(&["--out", "m.npy", "--task", "multi-label"]);
    hetgnn(dir, &a).fails_with(
        1,
        &["not trained for task 'multi-label' (it predicts: node-classification, node-regression)"],
    );
    // The server answers the primary task, as predict does.
    let s = Server::start(dir, &model);
    let ids = [7u32, 0, 300];
    let (code, r) = s.post("/v1/predict", &json!({"ids": ids}));
    assert_eq!(code, 200, "{r}");
    let got: Vec<i64> = r["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    let want: Vec<i64> = ids.iter().map(|&i| classes[i as usize]).collect();
    assert_eq!(got, want);
    let (code, info) = s.get("/v1/model");
    assert_eq!(code, 200);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["task"], "node-classification");
    assert_eq!(
        info["tasks"],
        json!(["node-classification", "node-regression"])
    );
    assert_eq!(info["classes"], json!(g.num_classes()));
    assert!(s.stop().success());
    // `serve --task` answers another of its tasks, as `predict --task` does.
    let s = Server::start(dir, &[&model[..], &["--task", "node-regression"]].concat());
    let (code, r) = s.post("/v1/predict", &json!({"ids": ids}));
    assert_eq!(code, 200, "{r}");
    let got: Vec<f32> = r["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let want: Vec<f32> = ids.iter().map(|&i| v[i as usize]).collect();
    assert!(close(&got, &want), "{got:?} vs predict's {want:?}");
    let (_, info) = s.get("/v1/model");
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["task"], "node-regression");
    assert!(s.stop().success());
}

#[test]
fn nodes_serving_partitions_answer_as_a_whole_graph_server_and_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    trained(d, &[]);
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let topology = format!(
        "[cluster]\ncerts_dir = \"certs\"\nheartbeat_ms = 100\nfailure_timeout_ms = 2000\n{}",
        crate::util::nodes_toml(&["n0", "n1"])
    );
    std::fs::write(d.join("cluster.toml"), topology).unwrap();
    // Node `id` of the topology, with `extra` flags.
    let node_with = |id: &str, extra: &[&str]| {
        let mut args = vec![
            "--checkpoint",
            "ck",
            "--partitions",
            "parts",
            "--config",
            "cluster.toml",
            "--node",
            id,
            "--timeout-ms",
            "4000",
        ];
        args.extend_from_slice(extra);
        Server::launch(d, &args)
    };
    let node = |id: &str| node_with(id, &[]);
    let whole = Server::start(d, &["--checkpoint", "ck", "--data", "g"]);
    let (n0, n1) = (node("n0"), node("n1"));
    n0.wait_ready();
    n1.wait_ready();
    let ask = json!({"ids": (0..60).rev().collect::<Vec<u32>>(), "probabilities": true});
    let answer = |s: &Server| {
        let (code, r) = s.post("/v1/predict", &ask);
        assert_eq!(code, 200, "{r}\n{}", s.log());
        r
    };
    let want = answer(&whole);
    for (name, s) in [("n0", &n0), ("n1", &n1)] {
        let got = answer(s);
        assert_eq!(got["predictions"], want["predictions"], "{name}");
        assert!(
            close(
                &floats(&got["probabilities"]),
                &floats(&want["probabilities"])
            ),
            "{name}: probabilities differ"
        );
    }
    assert!(n0.log().contains("partition 0 of 2"), "{}", n0.log());
    // Partition 1's node is killed: its rows are missing, so n0 says to
    // retry; once its failure detector holds n1 down, at once.
    drop(n1);
    let start = Instant::now();
    loop {
        let (code, r) = n0.post("/v1/predict", &ask);
        assert_eq!(code, 503, "{r}");
        if r.to_string().contains("partition 1's node is down") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{r}");
    }
    // Restarted, it serves its partition again, and n0 answers as before.
    let n1 = node("n1");
    n1.wait_ready();
    let start = Instant::now();
    let again = loop {
        let (code, r) = n0.post("/v1/predict", &ask);
        if code == 200 || start.elapsed() > Duration::from_secs(30) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        again["predictions"],
        want["predictions"],
        "{again}\n{}",
        n0.log()
    );
    // With --take-over, n0 loads the partition of a node that is down and
    // answers for it: the same answers, without n1.
    drop(n0);
    let taker = node_with("n0", &["--take-over"]);
    taker.wait_ready();
    drop(n1);
    let start = Instant::now();
    let served = loop {
        let (code, r) = taker.post("/v1/predict", &ask);
        if code == 200 {
            break r;
        }
        assert_eq!(code, 503, "{r}");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{r}\n{}",
            taker.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        served["predictions"],
        want["predictions"],
        "{}",
        taker.log()
    );
    assert!(
        close(
            &floats(&served["probabilities"]),
            &floats(&want["probabilities"])
        ),
        "taken over: probabilities differ"
    );
    assert!(
        taker
            .log()
            .contains("partition 1's node is down: serving its partition here"),
        "{}",
        taker.log()
    );
    // A whole-graph server's features are refused with what to use instead.
    hetgnn(
        d,
        &[
            "serve",
            "--checkpoint",
            "ck",
            "--partitions",
            "parts",
            "--inference",
            "exact",
        ],
    )
    .fails_with(1, &["--inference exact", "embed --partitions"]);
}
