//! The crate's error type.

/// Result alias for this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Errors from building, running, saving or loading models.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The graph refused a request (a seed out of range, malformed picks): the caller's input is wrong.
    #[error(transparent)]
    Graph(#[from] graphs::GraphError),
    /// A configuration value is invalid.
    #[error("invalid model configuration: {0}")]
    Config(String),
    /// A checkpoint cannot be used.
    #[error("checkpoint {path}: {problem}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// Another run holds the checkpoint directory: wait for it or choose another.
    #[error("checkpoint directory {path} is in use by {holder}: wait for that run to end, or choose another checkpoint directory")]
    InUse {
        /// The checkpoint directory.
        path: String,
        /// Who holds it (process id, command line, since when).
        holder: String,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}
