//! The client's choice of TLS or clear text, and how it trusts a server's key: the
//! known-servers file (a first contact recorded, a changed key refused, as OpenSSH's
//! `accept-new`) or a fingerprint pinned by the caller.

use std::path::PathBuf;

use tokio::net::TcpStream;

use super::handshake::{OpenError, Opener};
use crate::error::{Error, Result};
use crate::transport::tls::{ClientTls, Fingerprint, Known, KnownServers, Stream};

/// Whether a client encrypts, and which server keys it accepts.
///
/// # Examples
///
/// ```
/// use hsxfer::session::secure::{Security, Trust};
///
/// // The default: TLS 1.3, keys checked against the known-servers file.
/// assert!(matches!(Security::default(), Security::Tls(Trust::KnownServers(_))));
/// let pinned = Security::Tls(Trust::Pinned(
///     "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU".parse().unwrap(),
/// ));
/// # let _ = pinned;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Security {
    /// TLS 1.3, the server's key checked as the [`Trust`] says.
    Tls(Trust),
    /// Clear text (`--no-encrypt`): still authenticated, but readable on the path. The server
    /// must allow it.
    Clear,
}

/// Which server keys a client accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Those in this known-servers file; a server met for the first time is recorded.
    KnownServers(KnownServers),
    /// Only this one (`--server-fingerprint`); no file is read or written.
    Pinned(Fingerprint),
}

impl Security {
    /// From the choices a caller makes: whether to encrypt, a pinned key, another
    /// known-servers file (the default one without either). Clear text checks no key, so it
    /// takes neither of the others.
    pub fn choose(
        encrypt: bool,
        pinned: Option<Fingerprint>,
        known_servers: Option<PathBuf>,
    ) -> Result<Security> {
        Ok(match (encrypt, pinned, known_servers) {
            (false, None, None) => Security::Clear,
            (false, _, _) => {
                return Err(Error::Usage(
                    "clear text (`Security::Clear`) checks no server key: drop the pinned key and \
                     the known-servers file"
                        .into(),
                ))
            }
            (true, Some(fp), _) => Security::Tls(Trust::Pinned(fp)),
            (true, None, Some(file)) => Security::Tls(Trust::KnownServers(KnownServers::at(file))),
            (true, None, None) => Security::default(),
        })
    }
}

impl Default for Security {
    /// TLS, with the known-servers file in hsxfer's configuration directory (or
    /// `/etc/hsxfer/known_servers` when neither `XDG_CONFIG_HOME` nor `HOME` is set).
    fn default() -> Self {
        let file = KnownServers::default_location()
            .unwrap_or_else(|| KnownServers::at("/etc/hsxfer/known_servers"));
        Security::Tls(Trust::KnownServers(file))
    }
}

/// A control connection opened as the [`Security`] says.
pub(crate) struct OpenedControl {
    /// The connection.
    pub stream: Stream,
    /// How the session's data channels open: in TLS they accept exactly the control
    /// connection's key.
    pub opener: Opener,
    /// A server met for the first time, to record once it has proved it holds the token.
    pub first_contact: Option<FirstContact>,
}

/// A server whose key the known-servers file does not hold yet. Its key is recorded only
/// once the server has proved it holds the session's token ([`FirstContact::record`]): one
/// that cannot (anyone who got to the port or the path first) recorded its own key, and the
/// real server was refused as a changed key from then on.
#[derive(Debug)]
pub(crate) struct FirstContact {
    file: KnownServers,
    server: String,
    key: Fingerprint,
}

impl FirstContact {
    /// Records the key; returns what to tell the user.
    pub(crate) fn record(self) -> String {
        let FirstContact { file, server, key } = self;
        match file.record(&server, key) {
            Ok(()) => format!(
                "client: first contact with {server}: its key {key} is now recorded in {}",
                file.path().display()
            ),
            Err(e) => format!(
                "client: first contact with {server} (key {key}); recording it in {} failed: {e}",
                file.path().display()
            ),
        }
    }
}

/// Opens the control connection to `server` (`HOST:PORT`, the known-servers name) over
/// `tcp`; `peer` names the address in messages.
pub(crate) async fn open_control(
    security: &Security,
    server: &str,
    tcp: TcpStream,
    peer: &str,
) -> Result<OpenedControl> {
    let trust = match security {
        Security::Clear => {
            let stream = Opener::Clear
                .open(tcp, peer)
                .await
                .map_err(data_channel_error)?;
            return Ok(OpenedControl {
                stream,
                opener: Opener::Clear,
                first_contact: None,
            });
        }
        Security::Tls(t) => t,
    };
    let (pinned, expected, fix) = match trust {
        Trust::Pinned(fp) => (
            Some(*fp),
            format!("`Trust::Pinned` pins {fp}"),
            "pin the new key".to_string(),
        ),
        Trust::KnownServers(file) => {
            let known = file
                .lookup(server)
                .map_err(Error::io(format!("reading {}", file.path().display())))?;
            match known {
                Known::Unknown => (None, String::new(), String::new()),
                Known::Key { fingerprint, line } => (
                    Some(fingerprint),
                    format!(
                        "line {line} of {} holds {fingerprint}",
                        file.path().display()
                    ),
                    "delete that line and connect again".to_string(),
                ),
            }
        }
    };
    let tls = ClientTls::new(pinned);
    let stream = match Opener::Tls(tls.clone()).open(tcp, peer).await {
        Ok(s) => s,
        Err(OpenError::WrongKey(seen)) => {
            return Err(Error::ServerKeyChanged {
                server: server.to_string(),
                seen,
                expected,
                fix,
            })
        }
        Err(OpenError::Other(e)) => return Err(e),
    };
    let seen = tls
        .seen()
        .expect("a TLS handshake checked the server's key");
    let first_contact = match (pinned, trust) {
        (None, Trust::KnownServers(file)) => Some(FirstContact {
            file: file.clone(),
            server: server.to_string(),
            key: seen,
        }),
        _ => None,
    };
    Ok(OpenedControl {
        stream,
        opener: Opener::Tls(ClientTls::new(Some(seen))),
        first_contact,
    })
}

/// A data channel's open error: a key other than the control connection's is an attack or a
/// server restarted with a new key in between.
pub(crate) fn data_channel_error(e: OpenError) -> Error {
    match e {
        OpenError::WrongKey(seen) => Error::Refused(format!(
            "a data channel's server presented the key {seen}, not the control connection's"
        )),
        OpenError::Other(e) => e,
    }
}
