//! The crate's error type: every failure names the file (or argument) and the problem.

use std::path::{Path, PathBuf};

/// Result alias for this crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

/// Errors from reading, writing, generating or sampling graphs.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// An operating-system error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file the format requires is absent.
    #[error("{}: file is missing", path.display())]
    Missing {
        /// The missing file.
        path: PathBuf,
    },
    /// `schema.json` is not valid JSON or does not have the expected fields.
    #[error("{}: invalid schema: {problem}", path.display())]
    Schema {
        /// The schema file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A `.npy` file is malformed (header, dtype, byte order, truncation).
    #[error("{}: invalid .npy file: {problem}", path.display())]
    Npy {
        /// The array file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A file is well-formed but disagrees with the schema or holds bad values.
    #[error("{}: {problem}", path.display())]
    Data {
        /// The file involved.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A caller passed an invalid argument (unknown type, seed out of range, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl GraphError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        GraphError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn npy(path: &Path, problem: impl Into<String>) -> Self {
        GraphError::Npy {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
    pub(crate) fn data(path: &Path, problem: impl Into<String>) -> Self {
        GraphError::Data {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
    pub(crate) fn schema(path: &Path, problem: impl Into<String>) -> Self {
        GraphError::Schema {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// Input that breaks a rule of the format (a schema entry, a name, a label
/// set): refused, with the message saying which entry and what is allowed;
/// callers add where it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<Invalid> for String {
    fn from(e: Invalid) -> String {
        e.0
    }
}
