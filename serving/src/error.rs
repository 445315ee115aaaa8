//! The crate's error type: what went wrong, and whose fault it is (the
//! request's, the files', or the server's), which decides the HTTP status.

/// Result alias for this crate.
pub type Result<T, E = ServeError> = std::result::Result<T, E>;

/// Errors of loading a model or answering a request.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The checkpoint or graph cannot be used: fix the files, then load again.
    #[error("{0}")]
    Load(String),
    /// The request is malformed or asks for what the model cannot give:
    /// the caller must change it (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    /// The request names nodes the graph does not hold (HTTP 404).
    #[error("{0}")]
    UnknownNodes(String),
    /// The request is larger than the server accepts (HTTP 413).
    #[error("{0}")]
    TooLarge(String),
    /// The server is overloaded, draining or not ready: retry later (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// Inference itself failed: a defect or a broken model (HTTP 500).
    #[error("inference failed: {0}")]
    Inference(String),
}

impl ServeError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> u16 {
        match self {
            ServeError::BadRequest(_) => 400,
            ServeError::UnknownNodes(_) => 404,
            ServeError::TooLarge(_) => 413,
            ServeError::Unavailable(_) => 503,
            ServeError::Load(_) | ServeError::Inference(_) => 500,
        }
    }
}

impl From<models::ModelError> for ServeError {
    fn from(e: models::ModelError) -> ServeError {
        ServeError::Inference(e.to_string())
    }
}

impl From<candle_core::Error> for ServeError {
    fn from(e: candle_core::Error) -> ServeError {
        ServeError::Inference(e.to_string())
    }
}

impl From<actors::TrainError> for ServeError {
    fn from(e: actors::TrainError) -> ServeError {
        ServeError::Inference(e.to_string())
    }
}

impl From<graphs::GraphError> for ServeError {
    fn from(e: graphs::GraphError) -> ServeError {
        ServeError::Inference(e.to_string())
    }
}
