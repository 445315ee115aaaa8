//! The cluster's certificates: a CA created by `hetgnn certs init` and one
//! certificate per node, signed by it, valid for both ends of a mutual-TLS
//! connection. Only holders of a certificate signed by the cluster CA can
//! join (the transport checks it on both sides).
//!
//! Layout of the output directory: `ca.pem`, `ca.key`, and `<node>.pem`,
//! `<node>.key` per node. Private keys are written with mode 0600.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Errors creating certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A node id is not usable as a certificate name.
    #[error("node id {0:?}: use 1-64 characters of [a-z0-9_-], not \"ca\"")]
    BadNodeId(String),
    /// A node id is listed twice.
    #[error("node id {0:?} is listed twice")]
    DuplicateNode(String),
    /// No nodes were given.
    #[error("no nodes given (--nodes n0,n1,...)")]
    NoNodes,
    /// The output exists and may not be replaced.
    #[error("{0} already exists (use --force to replace it)")]
    Exists(PathBuf),
    /// The output path does not name a directory of its own (`.`, `..`, `/`).
    #[error("{0} does not name a new directory")]
    BadOutput(PathBuf),
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Whether `id` is a valid node id (`ca` is reserved: its files are the CA's).
pub fn valid_node_id(id: &str) -> bool {
    id != "ca"
        && !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The certificate and key paths of `node` under `dir`.
pub fn node_paths(dir: &Path, node: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{node}.pem")),
        dir.join(format!("{node}.key")),
    )
}

/// Writes `text`; private files are created with mode 0600 from the start.
fn write(path: &Path, text: &str, private: bool) -> Result<(), CertError> {
    use std::io::Write;
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    opts.open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io)
}

/// Creates a CA and one certificate per node in `out` (written to a temporary
/// directory, then renamed into place).
pub fn init(out: &Path, nodes: &[String], overwrite: bool) -> Result<(), CertError> {
    if nodes.is_empty() {
        return Err(CertError::NoNodes);
    }
    for (i, n) in nodes.iter().enumerate() {
        if !valid_node_id(n) {
            return Err(CertError::BadNodeId(n.clone()));
        }
        if nodes[..i].contains(n) {
            return Err(CertError::DuplicateNode(n.clone()));
        }
    }
    let Some(name) = out.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Err(CertError::BadOutput(out.to_path_buf()));
    };
    if out.exists() && !overwrite {
        return Err(CertError::Exists(out.to_path_buf()));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertError::Io { path, source }
    };
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = (|| {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name
            .push(DnType::CommonName, "hetgnn cluster CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        write(&tmp.join("ca.pem"), &ca_cert.pem(), false)?;
        write(&tmp.join("ca.key"), &ca_key.serialize_pem(), true)?;
        let issuer = Issuer::new(ca, ca_key);
        for n in nodes {
            let mut p = CertificateParams::new(vec![n.clone(), "localhost".to_string()])?;
            p.distinguished_name.push(DnType::CommonName, n.as_str());
            p.use_authority_key_identifier_extension = true;
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            p.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let key = KeyPair::generate()?;
            let cert = p.signed_by(&key, &issuer)?;
            let (cpath, kpath) = node_paths(&tmp, n);
            write(&cpath, &cert.pem(), false)?;
            write(&kpath, &key.serialize_pem(), true)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(io(out))?;
    }
    std::fs::rename(&tmp, out).map_err(io(out))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::pem::parse_x509_pem;

    fn cert(path: &Path) -> Vec<u8> {
        let text = std::fs::read(path).unwrap();
        let (_, pem) = parse_x509_pem(&text).unwrap();
        pem.contents
    }

    #[test]
    fn node_certificates_are_signed_by_the_cluster_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("certs");
        init(&out, &["n0".into(), "n1".into()], false).unwrap();
        let ca_der = cert(&out.join("ca.pem"));
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        assert!(ca.is_ca());
        for n in ["n0", "n1"] {
            let der = cert(&out.join(format!("{n}.pem")));
            let (_, c) = x509_parser::parse_x509_certificate(&der).unwrap();
            c.verify_signature(Some(ca.public_key()))
                .expect("signed by the CA");
            let san = c.subject_alternative_name().unwrap().unwrap();
            assert!(format!("{:?}", san.value).contains(n));
            assert!(out.join(format!("{n}.key")).exists());
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(out.join(format!("{n}.key")))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600);
            }
        }
        // A second cluster's CA does not vouch for these nodes.
        let other = tmp.path().join("other");
        init(&other, &["n0".into()], false).unwrap();
        let other_der = cert(&other.join("ca.pem"));
        let (_, other_ca) = x509_parser::parse_x509_certificate(&other_der).unwrap();
        let der = cert(&out.join("n0.pem"));
        let (_, c) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(c.verify_signature(Some(other_ca.public_key())).is_err());
    }

    #[test]
    fn bad_requests_are_refused_and_leave_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("certs");
        assert!(matches!(init(&out, &[], false), Err(CertError::NoNodes)));
        assert!(matches!(
            init(&out, &["N0".into()], false),
            Err(CertError::BadNodeId(_))
        ));
        assert!(matches!(
            init(&out, &["a".into(), "a".into()], false),
            Err(CertError::DuplicateNode(_))
        ));
        assert!(
            matches!(
                init(&out, &["ca".into()], false),
                Err(CertError::BadNodeId(_))
            ),
            "ca is reserved"
        );
        assert!(matches!(
            init(&tmp.path().join(".."), &["a".into()], true),
            Err(CertError::BadOutput(_))
        ));
        assert!(!out.exists());
        init(&out, &["a".into()], false).unwrap();
        assert!(matches!(
            init(&out, &["a".into()], false),
            Err(CertError::Exists(_))
        ));
        init(&out, &["a".into(), "b".into()], true).unwrap();
        assert!(out.join("b.pem").exists());
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            1,
            "no temporary directory left"
        );
    }
}
