//! Printing that survives a closed stdout or stderr (`hetgnn train | head`, a
//! terminal that went away): a run's output is a courtesy, its report and
//! checkpoints are the product, so a failed write is dropped, never a panic.

/// As `println!`, ignoring write errors (EPIPE included).
macro_rules! sayln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// As `print!`, ignoring write errors.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// As `eprintln!`, ignoring write errors.
macro_rules! warnln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}
