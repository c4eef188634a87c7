//! The client's check of the server's key: by fingerprint, never by a CA. It accepts the
//! pinned key only, or, when no key is pinned (a first contact), any key, which it records
//! for the caller to write into the known-servers file once the connection succeeded.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

use super::identity::Fingerprint;

/// Checks that the server's certificate carries the pinned key; TLS itself checks that the
/// server holds the private key (its signature over the handshake).
#[derive(Debug)]
pub(super) struct PinVerifier {
    pinned: Option<Fingerprint>,
    seen: Mutex<Option<Fingerprint>>,
    provider: Arc<CryptoProvider>,
}

impl PinVerifier {
    pub(super) fn new(pinned: Option<Fingerprint>, provider: Arc<CryptoProvider>) -> Self {
        PinVerifier {
            pinned,
            seen: Mutex::new(None),
            provider,
        }
    }

    /// The key the server presented last, if any.
    pub(super) fn seen(&self) -> Option<Fingerprint> {
        *self.seen.lock().expect("verifier lock")
    }
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let key = Fingerprint::of_certificate(end_entity)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        *self.seen.lock().expect("verifier lock") = Some(key);
        match self.pinned {
            Some(p) if p != key => Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            )),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        // Only TLS 1.3 is offered; kept correct all the same.
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
