//! Mutual TLS for the QUIC transport: both ends present a certificate signed
//! by the cluster CA ([`crate::certs`]); a peer without one is refused during
//! the handshake. A peer's node id is the first DNS name of its certificate
//! other than `localhost`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocol id; a peer speaking anything else is refused.
pub const ALPN: &[u8] = b"hetgnn/1";

/// Errors loading certificates or building TLS configurations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A file is missing or unreadable.
    #[error("{path}: {msg}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        msg: String,
    },
    /// A certificate does not fit the cluster.
    #[error("{path}: {msg}")]
    BadCert {
        /// The certificate file.
        path: String,
        /// What is wrong.
        msg: String,
    },
    /// rustls or quinn refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

fn bad(path: &Path, msg: impl Into<String>) -> TlsError {
    TlsError::BadCert {
        path: path.display().to_string(),
        msg: msg.into(),
    }
}

/// Largest PEM file read (a certificate chain is a few KiB).
const MAX_PEM: u64 = 1 << 20;

/// Reads a PEM file, refusing before any read what is not a small regular
/// file (a FIFO would block, a device never end).
fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    let meta = std::fs::metadata(path)
        .map_err(|_| file_err(path, "does not exist (create it with `hetgnn certs init`)"))?;
    if !meta.is_file() {
        return Err(file_err(path, "is not a regular file"));
    }
    if meta.len() > MAX_PEM {
        return Err(file_err(
            path,
            format!("is {} bytes; PEM files are at most {MAX_PEM}", meta.len()),
        ));
    }
    std::fs::read(path).map_err(|e| file_err(path, e))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, format!("not a PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(file_err(path, "holds no certificate"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| file_err(path, format!("not a PEM private key: {e}")))
}

/// A TLS server configuration for HTTPS (`hetgnn serve --tls-cert/--tls-key`):
/// the certificate chain in `cert` and its private key in `key` (PEM),
/// TLS 1.2 and 1.3, HTTP/1.1 by ALPN, no client certificate asked. The
/// cluster's own node certificates (`hetgnn certs init`) can be given.
pub fn https_server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = read_certs(cert)?;
    let key_der = read_key(key)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| bad(key, format!("does not fit the certificate: {e}")))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// Loads the cluster CA certificate.
pub fn load_ca(path: &Path) -> Result<CertificateDer<'static>, TlsError> {
    let mut certs = read_certs(path)?;
    let ca = certs.swap_remove(0);
    let (_, parsed) = x509_parser::parse_x509_certificate(&ca)
        .map_err(|e| bad(path, format!("unparsable: {e}")))?;
    if !parsed.is_ca() {
        return Err(bad(path, "is not a CA certificate"));
    }
    Ok(ca)
}

/// The node id a certificate names: its first DNS name other than `localhost`.
pub fn cert_node_id(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    let san = parsed.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(d) if *d != "localhost" => {
            Some(d.to_string())
        }
        _ => None,
    })
}

/// Checks that `cert` exists, parses, is signed by the CA at `ca`, is valid now,
/// names node `id`, and that `key` is a readable private key.
pub fn check_node_cert(ca: &Path, cert: &Path, key: &Path, id: &str) -> Result<(), TlsError> {
    let ca_der = load_ca(ca)?;
    let (_, ca_parsed) = x509_parser::parse_x509_certificate(&ca_der)
        .map_err(|e| bad(ca, format!("unparsable: {e}")))?;
    let chain = read_certs(cert)?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&chain[0])
        .map_err(|e| bad(cert, format!("unparsable: {e}")))?;
    parsed
        .verify_signature(Some(ca_parsed.public_key()))
        .map_err(|_| {
            bad(
                cert,
                format!("is not signed by the cluster CA {}", ca.display()),
            )
        })?;
    if !parsed.validity().is_valid() {
        return Err(bad(cert, "is expired or not yet valid"));
    }
    match cert_node_id(&chain[0]) {
        Some(n) if n == id => {}
        Some(n) => return Err(bad(cert, format!("names node {n:?}, not {id:?}"))),
        None => return Err(bad(cert, "names no node")),
    }
    read_key(key)?;
    Ok(())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: CertificateDer<'static>) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(ca)
        .map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
    Ok(Arc::new(roots))
}

/// The kind of path a connection crosses, which decides its datagram sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// A real network: quinn's MTU discovery from 1200 bytes up to a jumbo
    /// frame's payload ([`JUMBO_UDP_PAYLOAD`]; it settles at what the path
    /// carries, 1452 bytes on plain Ethernet), with UDP segmentation offload
    /// batching the packets.
    Network,
    /// The loopback interface (a cluster tried on one machine): datagrams grow
    /// to 64 KiB. Segmentation offload is off because the kernel refuses GSO
    /// batches over 64 KiB, which quinn would read as a black hole.
    Loopback,
}

impl PathKind {
    /// The path to a peer at `addr` (IPv4 addresses mapped into IPv6, as a
    /// dual-stack socket reports them, count as what they map).
    pub fn of(addr: &std::net::SocketAddr) -> PathKind {
        if addr.ip().to_canonical().is_loopback() {
            PathKind::Loopback
        } else {
            PathKind::Network
        }
    }
}

/// Largest UDP payload an endpoint accepts (loopback's 64 KiB MTU less the IP and UDP headers).
pub const MAX_UDP_PAYLOAD: u16 = 65_487;

/// Largest UDP payload MTU discovery tries on a network path: a 9000-byte
/// jumbo frame less the IPv6 and UDP headers. Cluster networks often carry
/// jumbo frames, and each packet costs the same CPU (QUIC framing,
/// encryption, a trip through the kernel) whatever its size: at 0.5 CPU per
/// machine, data-parallel training spent about half its CPU there with
/// 1452-byte packets (docs/guide/emulation.md). Probes that a path drops are
/// not congestion, and the search settles below them.
pub const JUMBO_UDP_PAYLOAD: u16 = 8952;

/// The round trip assumed before the first is measured. Nodes of a cluster
/// start in any order and dial peers that are not listening yet; the
/// handshake's first packet is then lost and sent again one probe timeout
/// later, about three of these. quinn's default (333 ms, for the internet)
/// held every node of a 4-node `embed` about a second waiting for its
/// peers; on a cluster's network a round trip is well under this one, and
/// on a longer path the cost of too small a guess is a few handshake
/// packets sent twice.
const INITIAL_RTT: Duration = Duration::from_millis(20);

/// Transport settings tuned for bulk tensors: large flow-control windows, datagram
/// sizes for `path`, an idle timeout well past the failure detector's.
pub fn transport_config(idle: Duration, path: PathKind) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_uni_streams(1024u32.into())
        .max_concurrent_bidi_streams(0u32.into())
        .stream_receive_window((64u32 << 20).into())
        .receive_window((256u32 << 20).into())
        .send_window(256 << 20)
        .keep_alive_interval(Some(Duration::from_secs(1)))
        .max_idle_timeout(quinn::IdleTimeout::try_from(idle).ok())
        .initial_rtt(INITIAL_RTT);
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    match path {
        PathKind::Loopback => {
            mtu.upper_bound(MAX_UDP_PAYLOAD);
            t.enable_segmentation_offload(false);
        }
        PathKind::Network => {
            mtu.upper_bound(JUMBO_UDP_PAYLOAD);
        }
    }
    t.mtu_discovery_config(Some(mtu));
    Arc::new(t)
}

/// Client and server configurations of one identity for both kinds of path.
#[derive(Clone)]
pub struct QuicConfigs {
    client: [quinn::ClientConfig; 2],
    server: [Arc<quinn::ServerConfig>; 2],
}

impl QuicConfigs {
    /// Both kinds of path for `identity`, with connections idle for at most `idle`.
    pub fn new(identity: &Identity, idle: Duration) -> Result<QuicConfigs, TlsError> {
        // In `slot` order.
        let kinds = [PathKind::Network, PathKind::Loopback];
        let [c0, c1] = kinds.map(|k| identity.client_config(idle, k));
        let [s0, s1] = kinds.map(|k| identity.server_config(idle, k));
        Ok(QuicConfigs {
            client: [c0?, c1?],
            server: [Arc::new(s0?), Arc::new(s1?)],
        })
    }

    /// The client configuration for dialing `addr`.
    pub fn client(&self, addr: &std::net::SocketAddr) -> quinn::ClientConfig {
        self.client[Self::slot(addr)].clone()
    }

    /// The server configuration for a connection from `addr`.
    pub fn server(&self, addr: &std::net::SocketAddr) -> Arc<quinn::ServerConfig> {
        self.server[Self::slot(addr)].clone()
    }

    fn slot(addr: &std::net::SocketAddr) -> usize {
        match PathKind::of(addr) {
            PathKind::Network => 0,
            PathKind::Loopback => 1,
        }
    }
}

/// The certificate chain and key of one identity, with the CA.
pub struct Identity {
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Loads from files.
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Identity, TlsError> {
        Ok(Identity {
            ca: load_ca(ca)?,
            chain: read_certs(cert)?,
            key: read_key(key)?,
        })
    }

    /// From PEM text already in memory.
    pub fn from_pem(ca: &str, cert: &str, key: &str) -> Result<Identity, TlsError> {
        let p = |e: rustls::pki_types::pem::Error| TlsError::Config(e.to_string());
        Ok(Identity {
            ca: CertificateDer::from_pem_slice(ca.as_bytes()).map_err(p)?,
            chain: vec![CertificateDer::from_pem_slice(cert.as_bytes()).map_err(p)?],
            key: PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(p)?,
        })
    }

    /// Server side: requires a client certificate from the cluster CA.
    pub fn server_config(
        &self,
        idle: Duration,
        path: PathKind,
    ) -> Result<quinn::ServerConfig, TlsError> {
        let cfg = |e: rustls::Error| TlsError::Config(e.to_string());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots(self.ca.clone())?,
            provider(),
        )
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(cfg)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(cfg)?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(quic));
        server.transport_config(transport_config(idle, path));
        Ok(server)
    }

    /// Client side: trusts only the cluster CA and presents our certificate.
    pub fn client_config(
        &self,
        idle: Duration,
        path: PathKind,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let cfg = |e: rustls::Error| TlsError::Config(e.to_string());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(cfg)?
            .with_root_certificates(roots(self.ca.clone())?)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(cfg)?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut client = quinn::ClientConfig::new(Arc::new(quic));
        client.transport_config(transport_config(idle, path));
        Ok(client)
    }
}

/// The node id of the peer on `conn`, from its verified certificate.
pub fn peer_id(conn: &quinn::Connection) -> Option<String> {
    let any = conn.peer_identity()?;
    let chain = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    cert_node_id(chain.first()?)
}

/// An identity for `name` with a short-lived client certificate minted from the
/// cluster CA's files (for `hetgnn doctor`, which is no node of the cluster).
pub fn mint_client(ca_cert: &Path, ca_key: &Path, name: &str) -> Result<Identity, TlsError> {
    let text = |path: &Path| {
        read_pem(path)
            .and_then(|b| String::from_utf8(b).map_err(|_| file_err(path, "is not PEM text")))
    };
    let ca_pem = text(ca_cert)?;
    let key_pem = text(ca_key).map_err(|e| {
        file_err(
            ca_key,
            format!("{e} (doctor needs the CA key to mint its client certificate)"),
        )
    })?;
    let gen = |e: rcgen::Error| TlsError::Config(e.to_string());
    let ca_key = rcgen::KeyPair::from_pem(&key_pem).map_err(gen)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(gen)?;
    let mut p = rcgen::CertificateParams::new(vec![name.to_string()]).map_err(gen)?;
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    ];
    let now = std::time::SystemTime::now();
    p.not_before = (now - Duration::from_secs(300)).into();
    p.not_after = (now + Duration::from_secs(24 * 3600)).into();
    let key = rcgen::KeyPair::generate().map_err(gen)?;
    let cert = p.signed_by(&key, &issuer).map_err(gen)?;
    Identity::from_pem(&ca_pem, &cert.pem(), &key.serialize_pem())
}

#[cfg(test)]
mod tests {
    use super::PathKind;

    #[test]
    fn loopback_peers_are_told_from_network_ones() {
        let kind = |a: &str| PathKind::of(&a.parse().expect("an address"));
        assert_eq!(kind("127.0.0.1:7000"), PathKind::Loopback);
        assert_eq!(kind("127.3.2.1:7000"), PathKind::Loopback);
        assert_eq!(kind("[::1]:7000"), PathKind::Loopback);
        // What a dual-stack socket reports for an IPv4 loopback peer.
        assert_eq!(kind("[::ffff:127.0.0.1]:7000"), PathKind::Loopback);
        assert_eq!(kind("10.0.0.2:7000"), PathKind::Network);
        assert_eq!(kind("[::ffff:10.0.0.2]:7000"), PathKind::Network);
        assert_eq!(kind("[2001:db8::1]:7000"), PathKind::Network);
    }
}
