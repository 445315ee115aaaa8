//! placeholder during build
