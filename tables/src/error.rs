//! The crate's error type: a bad table names its file, row and column, so the
//! user can fix the data; nothing here is worth retrying.

use std::path::{Path, PathBuf};

use graphs::GraphError;

/// Result alias for this crate.
pub type Result<T, E = TableError> = std::result::Result<T, E>;

/// Errors from reading a table configuration, reading tables or writing the graph.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The configuration file is malformed or inconsistent: fix it and rerun.
    #[error("{}: {problem}", path.display())]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A table holds something the configuration does not allow: fix the data
    /// (or the configuration) and rerun.
    #[error("{}{}{}: {problem}", file.display(), row.map(|r| format!(", row {r}")).unwrap_or_default(), column.as_ref().map(|c| format!(", column '{c}'")).unwrap_or_default())]
    Table {
        /// The table file.
        file: PathBuf,
        /// The 1-based data row (the header is not counted), when one is at fault.
        row: Option<u64>,
        /// The column at fault, when one is.
        column: Option<String>,
        /// What is wrong.
        problem: String,
    },
    /// An operating-system error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An output file named with no format this writes: name it again.
    #[error("{}: {problem}", path.display())]
    OutputName {
        /// The output file.
        path: PathBuf,
        /// What names are allowed.
        problem: String,
    },
    /// Writing or validating the graph directory failed.
    #[error(transparent)]
    Graph(#[from] GraphError),
}

impl TableError {
    pub(crate) fn config(path: &Path, problem: impl Into<String>) -> Self {
        TableError::Config {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
    pub(crate) fn file(file: &Path, problem: impl Into<String>) -> Self {
        TableError::Table {
            file: file.to_path_buf(),
            row: None,
            column: None,
            problem: problem.into(),
        }
    }
    pub(crate) fn cell(file: &Path, row: u64, column: &str, problem: impl Into<String>) -> Self {
        TableError::Table {
            file: file.to_path_buf(),
            row: Some(row),
            column: Some(column.to_string()),
            problem: problem.into(),
        }
    }
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TableError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
