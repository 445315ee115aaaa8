//! The crate's error type.

/// Result alias for this crate.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

impl TrainError {
    /// A [`TrainError::Distributed`] saying `e`.
    pub fn distributed(e: impl std::fmt::Display) -> TrainError {
        TrainError::Distributed(e.to_string())
    }
}

/// Errors from configuring or running training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The configuration is invalid; the message names the key.
    #[error("configuration: {0}")]
    Config(String),
    /// The graph could not be loaded or sampled.
    #[error(transparent)]
    Graph(#[from] graphs::GraphError),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] models::ModelError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A node could not start (the message names the configuration key).
    #[error(transparent)]
    Start(#[from] runtime::StartError),
    /// A request to an actor failed.
    #[error(transparent)]
    Ask(#[from] runtime::AskError),
    /// Distributed training failed or timed out (the message says where).
    #[error("distributed training: {0}")]
    Distributed(String),
    /// The loss became NaN or infinite: the run stops rather than train on.
    #[error("training diverged at epoch {epoch}, step {step} of the run: the loss is {loss}; lower training.lr, or check the inputs for extreme values")]
    Diverged {
        /// Epoch of the step.
        epoch: u64,
        /// The step, counted from 0 over the run.
        step: u64,
        /// The loss it reported.
        loss: f64,
    },
    /// The thread preparing batches ahead of the steps stopped without a word.
    #[error("the batch pipeline stopped unexpectedly")]
    PipelineStopped,
    /// A checkpoint is unusable (corrupted, from another run, incomplete).
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// Writing an output failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}
