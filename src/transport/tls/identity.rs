//! The server's key pair: an Ed25519 key in a self-signed certificate, made on first start
//! and kept in one PEM file. Clients pin its public key ([`Fingerprint`]), so no CA is
//! involved and the certificate's names and dates mean nothing.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The SHA-256 of a server's public key (its SubjectPublicKeyInfo), written as OpenSSH
/// writes key fingerprints: `SHA256:` and unpadded base64.
///
/// # Examples
///
/// ```
/// use hsxfer::transport::tls::Fingerprint;
///
/// let f: Fingerprint = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU".parse().unwrap();
/// assert_eq!(f.to_string(), "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU");
/// assert!("MD5:00".parse::<Fingerprint>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a certificate's public key; an error for a certificate that does
    /// not parse.
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Result<Self, webpki::Error> {
        let ee = webpki::EndEntityCert::try_from(cert)?;
        let spki = ee.subject_public_key_info();
        let d = ring::digest::digest(&ring::digest::SHA256, spki.as_ref());
        Ok(Fingerprint(d.as_ref().try_into().expect("32 bytes")))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(self.0);
        write!(f, "SHA256:{b64}")
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A fingerprint that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "'{0}' is not a server fingerprint: expected SHA256: and 43 base64 characters, as `hsxfer \
     serve` prints it"
)]
pub struct BadFingerprint(pub String);

impl std::str::FromStr for Fingerprint {
    type Err = BadFingerprint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadFingerprint(s.to_string());
        let b64 = s.trim().strip_prefix("SHA256:").ok_or_else(bad)?;
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b64)
            .map_err(|_| bad())?;
        Ok(Fingerprint(bytes.try_into().map_err(|_| bad())?))
    }
}

/// A server's TLS identity: its certificate and private key.
pub struct ServerIdentity {
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    fingerprint: Fingerprint,
    /// The key and certificate in PEM, as the key file holds them.
    pem: String,
}

impl fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// Why a server's key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file cannot be read or written.
    #[error("server key {}: {source}", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The file is not a key and certificate in PEM.
    #[error(
        "server key {}: {what}; move it away and start the server again to make a new key \
         (clients that know the old key will refuse the new one until told)",
        path.display()
    )]
    Malformed {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// Making a key failed.
    #[error("making a server key: {0}")]
    Generate(String),
    /// Neither a key file nor a configuration directory to keep one in.
    #[error("no place for the server's key: set HOME or XDG_CONFIG_HOME, or give a `key_file`")]
    NoPlace,
}

impl ServerIdentity {
    /// A new key pair, kept only in memory (a one-shot server's, say).
    ///
    /// # Examples
    ///
    /// ```
    /// let id = hsxfer::transport::tls::ServerIdentity::generate().unwrap();
    /// assert!(id.fingerprint().to_string().starts_with("SHA256:"));
    /// ```
    pub fn generate() -> Result<Self, IdentityError> {
        let gen = |e: rcgen::Error| IdentityError::Generate(e.to_string());
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(gen)?;
        let cert = rcgen::CertificateParams::new(vec!["hsxfer".to_string()])
            .map_err(gen)?
            .self_signed(&key)
            .map_err(gen)?;
        Self::from_parts(
            cert.der().clone(),
            PrivatePkcs8KeyDer::from(key.serialize_der()),
            key.serialize_pem() + &cert.pem(),
        )
        .map_err(|e| IdentityError::Generate(e.to_string()))
    }

    fn from_parts(
        cert: CertificateDer<'static>,
        key: PrivatePkcs8KeyDer<'static>,
        pem: String,
    ) -> Result<Self, webpki::Error> {
        let fingerprint = Fingerprint::of_certificate(&cert)?;
        Ok(ServerIdentity {
            cert,
            key,
            fingerprint,
            pem,
        })
    }

    /// Reads the key file at `path`, or makes a new key there if there is none (mode 600,
    /// its directory made as needed). Returns the identity and whether it is new. Two
    /// servers starting at once agree on one key: the file appears whole, by a hard link.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), IdentityError> {
        let io = |source| IdentityError::Io {
            path: path.to_path_buf(),
            source,
        };
        match std::fs::read(path) {
            Ok(pem) => return Self::from_pem(path, &pem).map(|id| (id, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let id = Self::generate()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension(format!("tmp-{:016x}", rand::random::<u64>()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(id.pem.as_bytes())?;
                f.sync_all()
            });
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok((id, true)),
            // Another server made one first: use that.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let pem = std::fs::read(path).map_err(io)?;
                Self::from_pem(path, &pem).map(|id| (id, false))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The key a server keeps in `key_file`, or without one in [`default_key_path`], made
    /// there on first start ([`ServerIdentity::load_or_create`]). Returns the identity, where
    /// it is kept, and whether it is new.
    pub fn of_server(key_file: Option<PathBuf>) -> Result<(Self, PathBuf, bool), IdentityError> {
        let path = key_file
            .or_else(default_key_path)
            .ok_or(IdentityError::NoPlace)?;
        let (id, new) = Self::load_or_create(&path)?;
        Ok((id, path, new))
    }

    fn from_pem(path: &Path, pem: &[u8]) -> Result<Self, IdentityError> {
        let bad = |what: &str| IdentityError::Malformed {
            path: path.to_path_buf(),
            what: what.to_string(),
        };
        let cert = CertificateDer::from_pem_slice(pem).map_err(|_| bad("no certificate"))?;
        let key = match PrivateKeyDer::from_pem_slice(pem) {
            Ok(PrivateKeyDer::Pkcs8(k)) => k,
            _ => return Err(bad("no PKCS#8 private key")),
        };
        let pem = String::from_utf8_lossy(pem).into_owned();
        Self::from_parts(cert, key, pem).map_err(|e| bad(&format!("certificate unreadable ({e})")))
    }

    /// The fingerprint clients pin.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    pub(super) fn certificate(&self) -> CertificateDer<'static> {
        self.cert.clone()
    }

    pub(super) fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }
}

/// Where a server keeps its key unless told otherwise: `server-key.pem` in hsxfer's
/// configuration directory (`$XDG_CONFIG_HOME/hsxfer`, else `~/.config/hsxfer`).
pub fn default_key_path() -> Option<PathBuf> {
    config_dir().map(|d| d.join("server-key.pem"))
}

/// hsxfer's configuration directory: `$XDG_CONFIG_HOME/hsxfer`, else `~/.config/hsxfer`.
pub(crate) fn config_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("hsxfer"))
}

#[cfg(test)]
impl Fingerprint {
    /// A made-up fingerprint for tests.
    pub(crate) fn test_value(byte: u8) -> Self {
        Fingerprint([byte; 32])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_made_once_and_read_back_with_the_same_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key.pem");
        let (a, new_a) = ServerIdentity::load_or_create(&path).unwrap();
        let (b, new_b) = ServerIdentity::load_or_create(&path).unwrap();
        assert!(new_a && !new_b);
        assert_eq!(a.fingerprint(), b.fingerprint());
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        assert_ne!(
            ServerIdentity::generate().unwrap().fingerprint(),
            a.fingerprint()
        );
    }

    #[test]
    fn a_damaged_key_file_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(&path, "not a key").unwrap();
        let e = ServerIdentity::load_or_create(&path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("move it away"), "{e}");
    }
}
