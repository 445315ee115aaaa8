//! Checksums and seals of the manifests hetgnn writes (checkpoints,
//! partitions): hex SHA-256, and a seal that catches a manifest edited after
//! it was written.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Hex SHA-256 of `bytes` (the checksums manifests record).
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex of a digest.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A manifest sealed against edits: its seal is the SHA-256 of its JSON with
/// the seal field empty. Not a signature (anyone can compute it again): it
/// catches edits by hand or by tools, which would otherwise be believed.
pub trait Sealed: Serialize {
    /// The manifest's seal field.
    fn seal_field(&mut self) -> &mut String;

    /// Sets the seal from the rest of the manifest.
    fn seal(&mut self) {
        self.seal_field().clear();
        let digest = sha256(
            serde_json::to_string(self)
                .expect("manifests serialise")
                .as_bytes(),
        );
        *self.seal_field() = digest;
    }

    /// Whether the seal matches the rest of the manifest.
    fn seal_holds(&mut self) -> bool {
        let recorded = std::mem::take(self.seal_field());
        self.seal();
        std::mem::replace(self.seal_field(), recorded.clone()) == recorded
    }
}
