//! Shared helpers of the benchmark programs.

use std::path::{Path, PathBuf};

use anyhow::Context;
use graphs::generate::{generate, Like};
use graphs::NoProgress;

/// Returns a mag-like graph directory at `scale` for `seed`, generating it once
/// under `target/bench-data/` (reused by later runs).
pub fn mag_like(scale: f64, seed: u64) -> anyhow::Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    let dir = root.join(format!("mag-v{}-s{scale}-seed{seed}", graphs::generate::VERSION));
    if !dir.join("schema.json").exists() {
        eprintln!("generating mag-like S={scale} seed={seed} into {}", dir.display());
        generate(Like::Mag, scale, seed, &dir, true, &mut NoProgress).with_context(|| format!("generating {}", dir.display()))?;
    }
    Ok(dir)
}

/// `n` distinct free UDP ports on loopback (the sockets are held together
/// while choosing, so the OS cannot hand one out twice).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let sockets = (0..n).map(|_| std::net::UdpSocket::bind("127.0.0.1:0")).collect::<std::io::Result<Vec<_>>>()?;
    Ok(sockets.iter().map(|s| s.local_addr().map(|a| a.port())).collect::<std::io::Result<_>>()?)
}

/// Peak resident memory of this process in bytes (Linux), if known.
pub use actors::report::peak_rss_bytes;
