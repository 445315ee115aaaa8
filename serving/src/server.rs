//! The HTTP/JSON server of `hetgnn serve` (axum on tokio).
//!
//! - `POST /v1/predict`, `POST /v1/embed`: answers, batched across concurrent
//!   requests (see [`crate::batcher`]).
//! - `POST /v1/score_edges`: an edge model's classes or values of given
//!   edges, from exact embeddings (one decoder pass per request).
//! - `GET /v1/model`: what the loaded model answers.
//! - `GET /healthz` (the process is up), `GET /readyz` (a model is loaded and
//!   the server is not draining), `GET /metrics` (Prometheus).
//! - `POST /admin/reload` (with the admin token) or `SIGHUP`: load the
//!   checkpoint again (the newest under a root); requests keep being answered
//!   by the old model until the new one is ready, and none is dropped.
//! - `SIGTERM` or `SIGINT`: stop accepting, answer what is in flight (for at
//!   most the request timeout and a second), exit.
//!
//! Every request is bounded: its body size, its ids, its time, and the
//! requests queued and admitted per second; beyond a bound it is refused with
//! a 4xx or 503 and a JSON `{"error": ...}` saying why.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use crate::additions::{self, Resolved};
use crate::api::{
    self, EmbedRequest, EmbedResponse, ErrorBody, PredictRequest, PredictResponse, Predictions,
    ScoreEdgesRequest, ScoreEdgesResponse,
};
use crate::batcher::{Answer, BatchLimits, Batcher, Op};
use crate::engine::{Engine, Rows, Want};
use crate::error::{Result, ServeError};
use crate::metrics::Metrics;

/// Loads (or reloads) the model; runs on a blocking thread.
pub type Loader = Arc<dyn Fn() -> Result<Engine> + Send + Sync>;

/// Where the server's events go (the CLI prints them).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Bounds on what one request, and all of them, may ask.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Most ids in one request.
    pub max_ids: usize,
    /// Longest a request may take, from receipt to answer.
    pub timeout: Duration,
    /// Requests admitted per second over all clients (0: no limit).
    pub max_rps: u32,
    /// Batching of concurrent requests.
    pub batch: BatchLimits,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body_bytes: 1 << 20,
            max_ids: 10_000,
            timeout: Duration::from_secs(10),
            max_rps: 0,
            batch: BatchLimits {
                max_wait: Duration::ZERO,
                max_nodes: 4096,
                queue: 1024,
            },
        }
    }
}

/// Everything `serve` is told.
pub struct ServerConfig {
    /// The address to listen on (port 0: any free port, printed).
    pub listen: SocketAddr,
    /// Request bounds.
    pub limits: Limits,
    /// The token `POST /admin/reload` must carry (`None`: the endpoint is off).
    pub admin_token: Option<String>,
    /// Loads the model, at start and on every reload.
    pub load: Loader,
    /// Where events are reported.
    pub log: Log,
    /// HTTPS: the TLS configuration connections are accepted with (`None`: plain HTTP).
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

/// The state every handler shares.
struct Shared {
    engine: RwLock<Option<Arc<Engine>>>,
    batcher: Batcher,
    metrics: Arc<Metrics>,
    limits: Limits,
    draining: AtomicBool,
    reloading: AtomicBool,
    admin_token: Option<String>,
    load: Loader,
    log: Log,
    bucket: Mutex<Bucket>,
    /// Questions over new nodes computing at once: one per core, so that a
    /// burst of them queues (within its timeout) instead of piling up threads.
    alone: Arc<tokio::sync::Semaphore>,
}

type St = State<Arc<Shared>>;

/// Errors answered as `{"error": ...}` with their status.
struct HttpError(StatusCode, String);

impl From<ServeError> for HttpError {
    fn from(e: ServeError) -> HttpError {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        HttpError(status, e.to_string())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(ErrorBody { error: self.1 })).into_response();
        if self.0 == StatusCode::SERVICE_UNAVAILABLE || self.0 == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// A body that failed to parse: 400 (413 when too large, 415 when not JSON).
fn rejected(e: JsonRejection) -> HttpError {
    let status = e.status();
    let what = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            "the request body is larger than the server accepts".to_string()
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            "send the request as JSON with `Content-Type: application/json`".to_string()
        }
        _ => format!("malformed request: {}", e.body_text()),
    };
    let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
        StatusCode::BAD_REQUEST
    } else {
        status
    };
    HttpError(status, what)
}

/// Runs the server until `SIGTERM` or `SIGINT`, then drains; returns the
/// address it listened on. The model loads after the socket is bound, so
/// `/healthz` answers while `/readyz` says it is not ready yet.
pub async fn run(config: ServerConfig) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| ServeError::Load(format!("cannot listen on {}: {e}", config.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Load(format!("cannot listen on {}: {e}", config.listen)))?;
    let metrics = Arc::new(Metrics::new());
    let batcher = Batcher::start(config.limits.batch, Arc::clone(&metrics))
        .map_err(|e| ServeError::Load(format!("cannot start the inference thread: {e}")))?;
    let shared = Arc::new(Shared {
        engine: RwLock::new(None),
        batcher,
        metrics,
        limits: config.limits,
        draining: AtomicBool::new(false),
        reloading: AtomicBool::new(true),
        admin_token: config.admin_token,
        load: config.load,
        log: config.log,
        bucket: Mutex::new(Bucket::new(config.limits.max_rps)),
        alone: Arc::new(tokio::sync::Semaphore::new(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        )),
    });
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    (shared.log)(&format!("listening on {scheme}://{addr}"));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<String>);
    // The first load: a failure stops the server with its error.
    {
        let shared = Arc::clone(&shared);
        let stop = stop_tx.clone();
        tokio::spawn(async move {
            if let Err(e) = reload(&shared, true).await {
                let _ = stop.send(Some(e.to_string()));
            }
        });
    }
    spawn_signals(Arc::clone(&shared), stop_tx)?;
    let app = router(Arc::clone(&shared));
    let mut stopped = stop_rx.clone();
    let shutdown = {
        let shared = Arc::clone(&shared);
        async move {
            let _ = stopped.changed().await;
            shared.draining.store(true, Ordering::SeqCst);
            shared.metrics.ready.set(0);
            (shared.log)("draining: answering the requests in flight, accepting no more");
        }
    };
    // A drain waits for requests in flight, but not forever: a client that
    // never finishes its request would hold the process up.
    let drain = shared.limits.timeout + Duration::from_secs(1);
    let mut drain_started = stop_rx.clone();
    let deadline = async move {
        let _ = drain_started.changed().await;
        tokio::time::sleep(drain).await;
    };
    let server = serve_connections(
        listener,
        app,
        config.tls,
        shared.limits.timeout,
        shutdown,
        Arc::clone(&shared.log),
    );
    tokio::select! {
        () = server => {}
        _ = deadline => (shared.log)(&format!(
            "drain: connections still open after {} ms closed",
            drain.as_millis()
        )),
    }
    let failure = stop_rx.borrow().clone();
    match failure {
        Some(e) if !e.is_empty() => Err(ServeError::Load(e)),
        _ => Ok(addr),
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the
/// connections in flight to finish their requests. A client must send a
/// request's headers within `header_timeout` of its first byte, or its
/// connection is closed: a client sending them a byte at a time cannot
/// hold a connection (and its file descriptor) for ever. With `tls`, each
/// connection's handshake must finish within the same bound.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    header_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()>,
    log: Log,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    tokio::pin!(shutdown);
    let mut refused_since: Option<Instant> = None;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, say: the clients holding
                        // them are answered or time out; try again shortly.
                        if refused_since.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                            log(&format!("accepting a connection failed: {e}; retrying"));
                            refused_since = Some(Instant::now());
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let service = app
                    .clone()
                    .map_request(|r: Request<hyper::body::Incoming>| r.map(axum::body::Body::new));
                let service = hyper_util::service::TowerToHyperService::new(service);
                let (watcher, http, tls) = (graceful.watcher(), http.clone(), tls.clone());
                tokio::spawn(async move {
                    // A client's broken connection is its own business.
                    match tls {
                        None => {
                            let conn = http.serve_connection(TokioIo::new(stream), service);
                            let _ = watcher.watch(conn).await;
                        }
                        Some(cfg) => {
                            let accept = tokio_rustls::TlsAcceptor::from(cfg).accept(stream);
                            let Ok(Ok(stream)) = tokio::time::timeout(header_timeout, accept).await
                            else {
                                return;
                            };
                            let conn = http.serve_connection(TokioIo::new(stream), service);
                            let _ = watcher.watch(conn).await;
                        }
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

/// `SIGHUP` reloads; `SIGTERM` and `SIGINT` stop (an empty message: not a failure).
fn spawn_signals(
    shared: Arc<Shared>,
    stop: tokio::sync::watch::Sender<Option<String>>,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let sig = |k: SignalKind| {
        signal(k).map_err(|e| ServeError::Load(format!("cannot handle signals: {e}")))
    };
    let (mut hup, mut term, mut int) = (
        sig(SignalKind::hangup())?,
        sig(SignalKind::terminate())?,
        sig(SignalKind::interrupt())?,
    );
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    let shared = Arc::clone(&shared);
                    tokio::spawn(async move {
                        if let Err(e) = reload(&shared, false).await {
                            (shared.log)(&format!("reload failed, still serving the previous model: {e}"));
                        }
                    });
                }
                _ = term.recv() => { let _ = stop.send(Some(String::new())); return; }
                _ = int.recv() => { let _ = stop.send(Some(String::new())); return; }
            }
        }
    });
    Ok(())
}

/// Loads the model on a blocking thread and swaps it in. One load at a time.
async fn reload(shared: &Arc<Shared>, first: bool) -> Result<Arc<Engine>> {
    // The first load holds `reloading` from the start; a reload asked for
    // meanwhile (or during another reload) is refused.
    if !first && shared.reloading.swap(true, Ordering::SeqCst) {
        return Err(ServeError::Unavailable(
            "a load of the model is already in progress".into(),
        ));
    }
    let load = Arc::clone(&shared.load);
    let started = Instant::now();
    let result = tokio::task::spawn_blocking(move || load())
        .await
        .unwrap_or_else(|e| Err(ServeError::Load(format!("loading panicked: {e}"))));
    shared.reloading.store(false, Ordering::SeqCst);
    match result {
        Ok(engine) => {
            let engine = Arc::new(engine);
            let src = &engine.trained().source;
            shared.metrics.model_epochs.set(src.epochs_done as i64);
            shared.metrics.loads.with_label_values(&["ok"]).inc();
            (shared.log)(&format!(
                "{} model {} ({} epochs, {} inference{}) in {:.1}s",
                if first { "ready:" } else { "reloaded:" },
                src.dir.display(),
                src.epochs_done,
                engine.inference(),
                if engine.precomputed() {
                    ", layers below the last precomputed"
                } else {
                    ""
                },
                started.elapsed().as_secs_f64()
            ));
            if let Ok(mut slot) = shared.engine.write() {
                *slot = Some(Arc::clone(&engine));
            }
            if !shared.draining.load(Ordering::SeqCst) {
                shared.metrics.ready.set(1);
            }
            Ok(engine)
        }
        Err(e) => {
            shared.metrics.loads.with_label_values(&["failed"]).inc();
            Err(e)
        }
    }
}

/// The routes, with their bounds and metrics.
fn router(shared: Arc<Shared>) -> Router {
    let limits = shared.limits;
    Router::new()
        .route("/v1/predict", post(predict))
        .route("/v1/embed", post(embed))
        .route("/v1/score_edges", post(score_edges))
        .route("/v1/model", get(model))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/reload", post(admin_reload))
        .fallback(|| async {
            HttpError(
                StatusCode::NOT_FOUND,
                "no such endpoint: see /v1/predict, /v1/embed, /v1/score_edges, /v1/model, /healthz, /readyz, /metrics".into(),
            )
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&shared), guard))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .with_state(shared)
}

/// Every request: the rate limit, the timeout, and the metrics.
async fn guard(State(s): St, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let start = Instant::now();
    let is_api = endpoint.starts_with("/v1/");
    let response = if is_api
        && !s
            .bucket
            .lock()
            .map(|mut b| b.take(Instant::now()))
            .unwrap_or(true)
    {
        s.metrics.shed.with_label_values(&["rate"]).inc();
        HttpError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "more than {} requests per second; retry shortly",
                s.limits.max_rps
            ),
        )
        .into_response()
    } else {
        s.metrics.in_flight.inc();
        let r = match tokio::time::timeout(s.limits.timeout, next.run(req)).await {
            Ok(r) => r,
            Err(_) => {
                s.metrics.shed.with_label_values(&["timeout"]).inc();
                HttpError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "the request took longer than the server's timeout of {} ms",
                        s.limits.timeout.as_millis()
                    ),
                )
                .into_response()
            }
        };
        s.metrics.in_flight.dec();
        r
    };
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        s.metrics.too_large.inc();
    }
    s.metrics
        .requests
        .with_label_values(&[endpoint.as_str(), response.status().as_str()])
        .inc();
    s.metrics
        .latency
        .with_label_values(&[endpoint.as_str()])
        .observe(start.elapsed().as_secs_f64());
    response
}

/// The loaded model, or 503.
fn current(s: &Shared) -> Result<Arc<Engine>, HttpError> {
    if s.draining.load(Ordering::SeqCst) {
        return Err(ServeError::Unavailable("the server is shutting down".into()).into());
    }
    s.engine.read().ok().and_then(|e| e.clone()).ok_or_else(|| {
        ServeError::Unavailable("the model is still loading; retry shortly".into()).into()
    })
}

/// A node type of the model's graph by name (the target type when `None`).
fn node_type(engine: &Engine, name: Option<&str>) -> Result<graphs::NodeTypeId, HttpError> {
    let g = &engine.trained().graph;
    match name {
        None => Ok(g.target()),
        Some(n) => g.type_id(n).ok_or_else(|| {
            let known: Vec<&str> = g.node_types().iter().map(|t| t.name.as_str()).collect();
            HttpError(
                StatusCode::BAD_REQUEST,
                format!(
                    "unknown node type {:?}; the graph's types are {}",
                    n.escape_debug().to_string(),
                    known.join(", ")
                ),
            )
        }),
    }
}

/// Checks the id count and maps the ids to dense ids (new nodes of
/// `resolved` by their request ids).
fn dense_ids(
    s: &Shared,
    engine: &Engine,
    t: graphs::NodeTypeId,
    ids: &[api::Id],
    resolved: &Resolved,
) -> Result<Vec<u32>, HttpError> {
    if ids.is_empty() {
        return Err(HttpError(
            StatusCode::BAD_REQUEST,
            "`ids` is empty: name at least one node".into(),
        ));
    }
    if ids.len() > s.limits.max_ids {
        return Err(ServeError::TooLarge(format!(
            "{} ids in one request; the server answers at most {} (split the request)",
            ids.len(),
            s.limits.max_ids
        ))
        .into());
    }
    Ok(resolved.dense(engine.trained(), t, ids)?)
}

/// A request's new nodes and edges, checked against the model's graph.
fn additions(
    s: &Shared,
    engine: &Engine,
    nodes: &[api::NewNode],
    edges: &[api::NewEdge],
) -> Result<Resolved, HttpError> {
    // New nodes and edges count against the same bound as ids.
    let max = s.limits.max_ids;
    Ok(additions::resolve(
        engine.trained(),
        nodes,
        edges,
        max,
        max,
    )?)
}

/// Runs `f` on a blocking thread: a question over a request's new nodes
/// has a graph of its own, so it shares no batch. It waits for a core's
/// permit, held until `f` returns (even if the request times out meanwhile).
async fn alone<T: Send + 'static>(
    s: &Shared,
    f: impl FnOnce() -> crate::error::Result<T> + Send + 'static,
) -> Result<T, HttpError> {
    let permit = Arc::clone(&s.alone).acquire_owned().await.map_err(|_| {
        HttpError::from(ServeError::Unavailable(
            "the server is shutting down".into(),
        ))
    })?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        f()
    })
    .await
    .map_err(|_| {
        HttpError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "inference over the request's new nodes panicked".into(),
        )
    })?
    .map_err(HttpError::from)
}

/// Sends a question to the batcher and awaits its answer.
async fn ask(
    s: &Shared,
    engine: Arc<Engine>,
    op: Op,
    nodes: Vec<u32>,
) -> Result<Answer, HttpError> {
    let rx = s.batcher.submit(engine, op, nodes).inspect_err(|_| {
        s.metrics.shed.with_label_values(&["queue"]).inc();
    })?;
    let answer = rx.await.map_err(|_| {
        HttpError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the inference thread dropped the request".into(),
        )
    })??;
    Ok(answer)
}

fn nested(r: &Rows) -> Vec<Vec<f32>> {
    r.data.chunks(r.width.max(1)).map(<[f32]>::to_vec).collect()
}

async fn predict(
    State(s): St,
    body: std::result::Result<Json<PredictRequest>, JsonRejection>,
) -> Result<Json<PredictResponse>, HttpError> {
    let Json(req) = body.map_err(rejected)?;
    let engine = current(&s)?;
    let t = node_type(&engine, req.ntype.as_deref())?;
    let g = &engine.trained().graph;
    if t != g.target() {
        return Err(HttpError(
            StatusCode::BAD_REQUEST,
            format!(
                "the model classifies nodes of type '{}' only",
                g.node_type(g.target()).name
            ),
        ));
    }
    let resolved = additions(&s, &engine, &req.new_nodes, &req.new_edges)?;
    let nodes = dense_ids(&s, &engine, t, &req.ids, &resolved)?;
    let want = Want {
        probabilities: req.probabilities,
        embeddings: req.embeddings,
    };
    let c = if resolved.additions.is_empty() {
        let Answer::Classified(c) = ask(&s, Arc::clone(&engine), Op::Classify(want), nodes).await?
        else {
            return Err(HttpError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "a classification was answered with rows".into(),
            ));
        };
        c
    } else {
        let (e, add) = (Arc::clone(&engine), resolved.additions);
        alone(&s, move || e.classify_with(&add, &nodes, want)).await?
    };
    let names = engine.trained().names[t.index()].classes();
    let label_names = engine.trained().names[t.index()].labels();
    Ok(Json(PredictResponse {
        ntype: g.node_type(t).name.clone(),
        class_names: (!names.is_empty() && c.labels.is_none()).then(|| {
            c.classes
                .iter()
                .map(|&k| names.get(k as usize).cloned().unwrap_or_default())
                .collect()
        }),
        ids: req.ids,
        label_names: c
            .labels
            .as_ref()
            .filter(|_| !label_names.is_empty())
            .map(|sets| {
                sets.iter()
                    .map(|s| {
                        s.iter()
                            .map(|&j| label_names.get(j as usize).cloned().unwrap_or_default())
                            .collect()
                    })
                    .collect()
            }),
        predictions: match (c.values, c.labels) {
            (Some(v), _) => Predictions::Values(v),
            (None, Some(l)) => Predictions::Labels(l),
            (None, None) => Predictions::Classes(c.classes),
        },
        probabilities: c.probabilities.as_ref().map(nested),
        embeddings: c.embeddings.as_ref().map(nested),
    }))
}

async fn embed(
    State(s): St,
    body: std::result::Result<Json<EmbedRequest>, JsonRejection>,
) -> Result<Json<EmbedResponse>, HttpError> {
    let Json(req) = body.map_err(rejected)?;
    let engine = current(&s)?;
    let t = node_type(&engine, req.ntype.as_deref())?;
    let resolved = additions(&s, &engine, &req.new_nodes, &req.new_edges)?;
    let nodes = dense_ids(&s, &engine, t, &req.ids, &resolved)?;
    let r = if resolved.additions.is_empty() {
        let Answer::Rows(r) = ask(&s, Arc::clone(&engine), Op::Embed(t), nodes).await? else {
            return Err(HttpError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "embeddings were answered with classes".into(),
            ));
        };
        r
    } else {
        let (e, add) = (Arc::clone(&engine), resolved.additions);
        alone(&s, move || e.embed_with(&add, t, &nodes)).await?
    };
    Ok(Json(EmbedResponse {
        ntype: engine.trained().graph.node_type(t).name.clone(),
        ids: req.ids,
        embeddings: nested(&r),
    }))
}

async fn score_edges(
    State(s): St,
    body: std::result::Result<Json<ScoreEdgesRequest>, JsonRejection>,
) -> Result<Json<ScoreEdgesResponse>, HttpError> {
    let Json(req) = body.map_err(rejected)?;
    let engine = current(&s)?;
    let tr = engine.trained();
    let g = &tr.graph;
    let relations = engine.scored_relations()?;
    let name = match &req.relation {
        Some(r) => r.clone(),
        None => relations.first().cloned().unwrap_or_default(),
    };
    let r = g.relation_id(&name).ok_or_else(|| {
        ServeError::BadRequest(format!(
            "unknown relation {:?}; the model scores the edges of {}",
            name.escape_debug().to_string(),
            relations.join(", ")
        ))
    })?;
    if req.src.is_empty() {
        return Err(ServeError::BadRequest(
            "`src` and `dst` are empty: name at least one edge".into(),
        )
        .into());
    }
    if req.src.len() != req.dst.len() {
        return Err(ServeError::BadRequest(format!(
            "{} sources and {} destinations: give one of each per edge",
            req.src.len(),
            req.dst.len()
        ))
        .into());
    }
    let rel = g.relation(r);
    let resolved = additions(&s, &engine, &req.new_nodes, &req.new_edges)?;
    let src = dense_ids(&s, &engine, rel.src, &req.src, &resolved)?;
    let dst = dense_ids(&s, &engine, rel.dst, &req.dst, &resolved)?;
    let (e, probabilities, add) = (Arc::clone(&engine), req.probabilities, resolved.additions);
    let c = alone(&s, move || {
        e.score_edges_with(&add, r, &src, &dst, probabilities)
    })
    .await?;
    let class_names = tr.edge_classes.get(rel.canonical()).map(|n| {
        c.classes
            .iter()
            .map(|&k| n.get(k as usize).cloned().unwrap_or_default())
            .collect()
    });
    Ok(Json(ScoreEdgesResponse {
        relation: rel.canonical().to_string(),
        src: req.src,
        dst: req.dst,
        class_names: class_names.filter(|_| c.values.is_none()),
        predictions: match c.values {
            Some(v) => Predictions::Values(v),
            None => Predictions::Classes(c.classes),
        },
        probabilities: c.probabilities.as_ref().map(nested),
    }))
}

/// `GET /v1/model`'s answer.
#[derive(Serialize)]
struct ModelInfo {
    checkpoint: String,
    epochs: u64,
    inference: String,
    /// Every layer but the last kept for every node (`serve --precompute`).
    precomputed: bool,
    model: String,
    target: String,
    task: &'static str,
    /// Node tasks of a multi-task model, the answered one first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tasks: Vec<&'static str>,
    classes: usize,
    class_names: Vec<String>,
    link_prediction: bool,
    /// A model with node tasks that also scores edges (`/v1/score_edges`): its task on edges.
    #[serde(skip_serializing_if = "Option::is_none")]
    edge_task: Option<&'static str>,
    fanouts: Vec<usize>,
    types: Vec<TypeInfo>,
}

#[derive(Serialize)]
struct TypeInfo {
    name: String,
    nodes: u32,
    original_ids: bool,
}

async fn model(State(s): St) -> Result<Json<ModelInfo>, HttpError> {
    let engine = current(&s)?;
    let tr = engine.trained();
    let g = &tr.graph;
    Ok(Json(ModelInfo {
        checkpoint: tr.source.dir.display().to_string(),
        epochs: tr.source.epochs_done,
        inference: engine.inference().to_string(),
        precomputed: engine.precomputed(),
        model: format!("{:?}", tr.source.spec.kind).to_lowercase(),
        target: g.node_type(g.target()).name.clone(),
        task: match (engine.classifies(), engine.regresses()) {
            (false, _) if tr.source.spec.edge.as_ref().is_some_and(|e| e.values) => {
                "edge-regression"
            }
            (false, _) if tr.source.spec.edge.is_some() => "edge-classification",
            (false, _) => "link-prediction",
            (true, true) => "node-regression",
            (true, false) if engine.multi_label() => "multi-label",
            (true, false) => "node-classification",
        },
        classes: if engine.regresses() {
            0
        } else {
            engine.outputs()
        },
        tasks: Some(engine.tasks())
            .filter(|t| t.len() > 1)
            .unwrap_or_default(),
        class_names: tr.names[g.target().index()].classes().to_vec(),
        link_prediction: tr.source.spec.link.is_some(),
        edge_task: match &tr.source.spec {
            s if !s.is_mixed() => None,
            s if s.link.is_some() => Some("link-prediction"),
            s if s.edge.as_ref().is_some_and(|e| e.values) => Some("edge-regression"),
            _ => Some("edge-classification"),
        },
        fanouts: tr.source.fanouts.clone(),
        types: g
            .node_types()
            .iter()
            .zip(&tr.names)
            .map(|(t, n)| TypeInfo {
                name: t.name.clone(),
                nodes: t.count,
                original_ids: n.original(),
            })
            .collect(),
    }))
}

async fn readyz(State(s): St) -> Response {
    if s.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    match s.engine.read().map(|e| e.is_some()) {
        Ok(true) => (StatusCode::OK, "ready\n").into_response(),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "loading the model\n").into_response(),
    }
}

async fn metrics(State(s): St) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

#[derive(Serialize)]
struct Reloaded {
    checkpoint: String,
    epochs: u64,
}

async fn admin_reload(State(s): St, headers: HeaderMap) -> Result<Json<Reloaded>, HttpError> {
    let Some(token) = &s.admin_token else {
        return Err(HttpError(
            StatusCode::NOT_FOUND,
            "the admin endpoint is off: start serve with --admin-token-file".into(),
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
        return Err(HttpError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong `Authorization: Bearer <token>`".into(),
        ));
    }
    let engine = reload(&s, false).await.map_err(|e| match e {
        ServeError::Unavailable(m) => HttpError(StatusCode::CONFLICT, m),
        e => HttpError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reload failed, still serving the previous model: {e}"),
        ),
    })?;
    Ok(Json(Reloaded {
        checkpoint: engine.trained().source.dir.display().to_string(),
        epochs: engine.trained().source.epochs_done,
    }))
}

/// Compares secrets in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token bucket: `rate` requests per second, bursts of one second's worth.
struct Bucket {
    rate: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    fn new(rate: u32) -> Bucket {
        Bucket {
            rate: f64::from(rate),
            tokens: f64::from(rate),
            last: None,
        }
    }

    /// Whether a request arriving at `now` is admitted.
    fn take(&mut self, now: Instant) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + refill).min(self.rate);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_admits_its_rate_and_refills() {
        let t0 = Instant::now();
        let mut b = Bucket::new(3);
        assert!((0..3).all(|_| b.take(t0)));
        assert!(!b.take(t0), "a fourth request in the same instant");
        assert!(
            b.take(t0 + Duration::from_millis(400)),
            "refilled 1.2 tokens"
        );
        assert!(!b.take(t0 + Duration::from_millis(450)));
        let mut off = Bucket::new(0);
        assert!((0..1000).all(|_| off.take(t0)));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
