//! The crate's error type.

/// Result alias for this crate.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

impl TrainError {
    /// A [`TrainError::PeerLost`] saying `e`.
    pub fn peer_lost(e: impl std::fmt::Display) -> TrainError {
        TrainError::PeerLost(e.to_string())
    }

    /// A [`TrainError::Protocol`] saying `e`.
    pub fn protocol(e: impl std::fmt::Display) -> TrainError {
        TrainError::Protocol(e.to_string())
    }

    /// A [`TrainError::Internal`] saying `e`.
    pub fn internal(e: impl std::fmt::Display) -> TrainError {
        TrainError::Internal(e.to_string())
    }

    /// The error with `what` said first, of the same kind (errors that carry
    /// no message of their own are returned as they are).
    pub fn context(self, what: impl std::fmt::Display) -> TrainError {
        match self {
            TrainError::PeerLost(m) => TrainError::PeerLost(format!("{what}: {m}")),
            TrainError::Protocol(m) => TrainError::Protocol(format!("{what}: {m}")),
            TrainError::Internal(m) => TrainError::Internal(format!("{what}: {m}")),
            TrainError::Failed(m) => TrainError::Failed(format!("{what}: {m}")),
            TrainError::Config(m) => TrainError::Config(format!("{what}: {m}")),
            TrainError::Checkpoint(m) => TrainError::Checkpoint(format!("{what}: {m}")),
            other => other,
        }
    }

    /// Whether the failure may be a lost node or message, worth a restart of
    /// the run from its last checkpoint once every node is back; bad input, a
    /// protocol violation or a bug would only happen again.
    pub fn is_recoverable(&self) -> bool {
        matches!(
            self,
            TrainError::PeerLost(_) | TrainError::Ask(_) | TrainError::PipelineStopped
        )
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
    /// A peer is gone or silent, or the run stopped because one is (the
    /// message says which and where): retry once every node is back (the
    /// coordinator does, from the last checkpoint).
    #[error("distributed training: {0}")]
    PeerLost(String),
    /// A peer sent what the protocol does not allow (a malformed or
    /// inconsistent message): stop the run; a restart would repeat it.
    #[error("distributed training stopped, a peer broke the protocol: {0}")]
    Protocol(String),
    /// This process broke one of its own invariants, a thread of it
    /// panicked, or it could not start one: stop the run with the message (a
    /// bug to report, or a machine out of resources).
    #[error("distributed training stopped: {0}")]
    Internal(String),
    /// A node stopped the run on an error a restart would repeat (the
    /// message says which node and what: a bug, a protocol violation, bad
    /// input, a diverged loss): fix the cause, then resume from the last
    /// checkpoint.
    #[error("distributed training stopped: {0}")]
    Failed(String),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_peer_is_worth_a_restart() {
        let timeout = runtime::AskError::Timeout {
            actor: "store/paper/1".into(),
            kind: "pull".into(),
            after: std::time::Duration::from_secs(1),
        };
        for e in [
            TrainError::peer_lost("no stats within 30s"),
            TrainError::Ask(timeout),
            TrainError::PipelineStopped,
        ] {
            assert!(e.is_recoverable(), "{e}");
        }
        for e in [
            TrainError::protocol("worker 1 sent 3 values for 4 rows"),
            TrainError::internal("worker 0 panicked: index out of bounds"),
            TrainError::Config("training.lr must be positive".into()),
            TrainError::Diverged {
                epoch: 0,
                step: 3,
                loss: f64::NAN,
            },
            TrainError::Checkpoint("corrupted".into()),
            TrainError::Failed("trainer 1: training diverged".into()),
        ] {
            assert!(!e.is_recoverable(), "{e}");
        }
        // What a caller reads says which.
        assert!(TrainError::protocol("x")
            .to_string()
            .contains("a peer broke the protocol"));
    }
}
