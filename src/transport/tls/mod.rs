//! TLS 1.3 on every connection (rustls, no OpenSSL), with the server's key pinned by the
//! client instead of checked by a CA:
//!
//! - [`ServerIdentity`]: the server's key pair, made on first start;
//! - [`KnownServers`]: the client's record of the keys it met (first contact accepted);
//! - [`ClientTls`] / [`ServerTls`]: the two ends' configurations;
//! - [`Stream`]: a connection in TLS or clear text, as the layers above see it.
//!
//! Only TLS 1.3 is offered, with AES-128-GCM first: on x86 with AES-NI it is the cheapest
//! AEAD per byte (docs/security.md has the measurement). The handshake of
//! [`crate::channels::auth`] runs inside, bound to the connection by the TLS exporter.

mod identity;
mod known;
mod stream;
mod verify;

use std::net::IpAddr;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

pub(crate) use identity::config_dir;
pub use identity::{default_key_path, BadFingerprint, Fingerprint, IdentityError, ServerIdentity};
pub use known::{Known, KnownServers};
pub use stream::{ReadPart, Stream, WritePart};

/// The crypto provider: ring, TLS 1.3 suites with AES-128-GCM first.
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

/// The server's TLS configuration, and whether it also serves clients that ask for clear
/// text.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    fingerprint: Fingerprint,
    /// Clients may ask for clear text (`serve --no-encrypt`).
    pub allow_clear: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("fingerprint", &self.fingerprint)
            .field("allow_clear", &self.allow_clear)
            .finish()
    }
}

impl ServerTls {
    /// TLS 1.3 with `identity`'s key.
    pub fn new(identity: &ServerIdentity, allow_clear: bool) -> Self {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .with_no_client_auth()
            .with_single_cert(vec![identity.certificate()], identity.private_key())
            .expect("a key made or checked by ServerIdentity");
        // Sessions are not resumed: each connection is one full handshake.
        config.send_tls13_tickets = 0;
        // The server's first words go out with its handshake flight ([`ServerTls::accept`]).
        config.send_half_rtt_data = true;
        ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            fingerprint: identity.fingerprint(),
            allow_clear,
        }
    }

    /// The fingerprint of the server's key.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Runs the server's side of a TLS handshake on a connection whose first byte said TLS.
    /// `first` goes out encrypted right after the server's Finished (0.5-RTT data): the
    /// server speaks first in hsxfer's handshake, and this saves the round trip it would
    /// otherwise wait for the client's Finished. It must not depend on the client, who is not
    /// authenticated yet: the server's hello is a fresh nonce.
    pub async fn accept(&self, tcp: TcpStream, first: &[u8]) -> std::io::Result<Stream> {
        let io = tokio::io::BufReader::with_capacity(stream::READ_AHEAD, tcp);
        let mut queued = Ok(());
        let accept = self.acceptor.accept_with(io, |conn| {
            queued = std::io::Write::write_all(&mut conn.writer(), first);
        });
        queued?;
        Ok(Stream::server(accept.await?))
    }
}

/// The client's TLS configuration for one server: which key it accepts.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
    verifier: Arc<verify::PinVerifier>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("verifier", &self.verifier)
            .finish()
    }
}

/// Why a client's TLS handshake failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The server presented another key than the pinned one.
    WrongKey {
        /// The key it presented.
        seen: Fingerprint,
    },
    /// The server answered in clear text: its first bytes (a busy answer, an older hsxfer's
    /// hello, or something else).
    Clear(Vec<u8>),
    /// The handshake failed otherwise.
    Io(std::io::Error),
}

impl ClientTls {
    /// Accepts only the server key `pinned`, or any key with `None` (a first contact: the
    /// caller records [`ClientTls::seen`] once the connection succeeded).
    pub fn new(pinned: Option<Fingerprint>) -> Self {
        let provider = provider();
        let verifier = Arc::new(verify::PinVerifier::new(pinned, provider.clone()));
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            verifier,
        }
    }

    /// The key the server presented on the last handshake.
    pub fn seen(&self) -> Option<Fingerprint> {
        self.verifier.seen()
    }

    /// Runs the client's side of a TLS handshake to the server at `ip`.
    pub async fn connect(&self, tcp: TcpStream, ip: IpAddr) -> Result<Stream, ConnectError> {
        let name = ServerName::IpAddress(ip.into());
        let r = self
            .connector
            .connect(
                name,
                tokio::io::BufReader::with_capacity(stream::READ_AHEAD, stream::Tap::new(tcp)),
            )
            .into_fallible()
            .await;
        match r {
            Ok(s) => Ok(Stream::client(s)),
            Err((e, tap)) => {
                let first = tap.get_ref().first_bytes();
                // TLS records start with a content type of 20-23.
                if first.first().is_some_and(|b| !(0x14..=0x17).contains(b)) {
                    return Err(ConnectError::Clear(first.to_vec()));
                }
                let bad_key = matches!(
                    e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
                    Some(rustls::Error::InvalidCertificate(_))
                );
                match (bad_key, self.seen()) {
                    (true, Some(seen)) => Err(ConnectError::WrongKey { seen }),
                    _ => Err(ConnectError::Io(e)),
                }
            }
        }
    }
}
