//! A trained hetgnn model answering questions: loading a checkpoint
//! ([`trained`]), computing answers by sampled or exact inference
//! ([`engine`]), and the HTTP/JSON server of `hetgnn serve` ([`server`]).

pub mod additions;
pub mod api;
pub mod batcher;
pub mod cpu_latency;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod server;
pub mod trained;

pub use engine::{Classified, Engine, Inference, Rows, Want};
pub use error::{Result, ServeError};
pub use trained::Trained;
