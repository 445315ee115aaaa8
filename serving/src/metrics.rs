//! The server's Prometheus metrics (`GET /metrics`): requests by endpoint and
//! status, their latency, the batches inference ran and the time requests
//! waited for one.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Latency buckets in seconds: 0.25 ms to 10 s.
const SECONDS: &[f64] = &[
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// Batch sizes in nodes.
const NODES: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by endpoint and status code.
    pub requests: IntCounterVec,
    /// Request latency (receipt to answer), by endpoint.
    pub latency: HistogramVec,
    /// Nodes per inference batch.
    pub batch_nodes: Histogram,
    /// Requests per inference batch.
    pub batch_requests: Histogram,
    /// Time of one batch's inference.
    pub batch_seconds: Histogram,
    /// Time a request waited in the queue before its batch started.
    pub queue_seconds: Histogram,
    /// Requests refused because the queue was full, the rate limit hit or the timeout passed.
    pub shed: IntCounterVec,
    /// Models loaded (the first and every reload), by outcome.
    pub loads: IntCounterVec,
    /// 1 while a model is loaded and the server is not draining.
    pub ready: IntGauge,
    /// Requests in flight.
    pub in_flight: IntGauge,
    /// Epochs the loaded model was trained for.
    pub model_epochs: IntGauge,
    /// Bytes of request bodies refused as too large.
    pub too_large: IntCounter,
}

impl Metrics {
    /// A fresh set of metrics in a registry of its own.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("hetgnn_serve_requests_total", "Requests answered"),
            &["endpoint", "status"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new("hetgnn_serve_request_seconds", "Request latency")
                .buckets(SECONDS.to_vec()),
            &["endpoint"],
        )
        .expect("valid metric");
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid metric")
        };
        let batch_nodes = hist(
            "hetgnn_serve_batch_nodes",
            "Nodes per inference batch",
            NODES,
        );
        let batch_requests = hist(
            "hetgnn_serve_batch_requests",
            "Requests per inference batch",
            NODES,
        );
        let batch_seconds = hist(
            "hetgnn_serve_batch_seconds",
            "Inference time of one batch",
            SECONDS,
        );
        let queue_seconds = hist(
            "hetgnn_serve_queue_seconds",
            "Time a request waited for its batch",
            SECONDS,
        );
        let shed = IntCounterVec::new(
            Opts::new("hetgnn_serve_shed_total", "Requests refused under load"),
            &["reason"],
        )
        .expect("valid metric");
        let loads = IntCounterVec::new(
            Opts::new("hetgnn_serve_model_loads_total", "Model loads"),
            &["outcome"],
        )
        .expect("valid metric");
        let ready =
            IntGauge::new("hetgnn_serve_ready", "1 when ready to answer").expect("valid metric");
        let in_flight =
            IntGauge::new("hetgnn_serve_in_flight", "Requests in flight").expect("valid metric");
        let model_epochs = IntGauge::new("hetgnn_serve_model_epochs", "Epochs of the loaded model")
            .expect("valid metric");
        let too_large = IntCounter::new(
            "hetgnn_serve_too_large_total",
            "Requests refused as larger than the limits",
        )
        .expect("valid metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(batch_nodes.clone()),
            Box::new(batch_requests.clone()),
            Box::new(batch_seconds.clone()),
            Box::new(queue_seconds.clone()),
            Box::new(shed.clone()),
            Box::new(loads.clone()),
            Box::new(ready.clone()),
            Box::new(in_flight.clone()),
            Box::new(model_epochs.clone()),
            Box::new(too_large.clone()),
        ] {
            registry.register(c).expect("metric names are distinct");
        }
        Metrics {
            registry,
            requests,
            latency,
            batch_nodes,
            batch_requests,
            batch_seconds,
            queue_seconds,
            shed,
            loads,
            ready,
            in_flight,
            model_epochs,
            too_large,
        }
    }

    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into memory fails only on a metric the registry refused.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}
