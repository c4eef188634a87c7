//! What a connection starts with, before the handshake of [`super::auth`]: a TLS 1.3
//! ClientHello (the default), or [`CLEAR_PREFACE`] from a client that asks for clear text
//! (`--no-encrypt`). The server tells them apart by the first byte, so both share one port.
//!
//! Inside TLS, every MAC of the handshake also covers the connection's TLS exporter value
//! ([`EXPORTER_LABEL`]): a handshake relayed from another TLS connection fails, so a token
//! holder's session cannot be spliced onto a connection an attacker terminates (channel
//! binding). In clear text the binding is all zeros.
//!
//! # Examples
//!
//! ```
//! use hsxfer::channels::preface::{classify, Opening, CLEAR_PREFACE};
//!
//! assert_eq!(classify(0x16), Opening::Tls);
//! assert_eq!(classify(CLEAR_PREFACE[0]), Opening::Clear);
//! assert_eq!(classify(b'G'), Opening::Unknown);
//! ```

/// The first bytes of a clear-text connection; the server answers with its hello, or with
/// [`clear_refused`] when it does not allow clear text.
pub const CLEAR_PREFACE: [u8; 4] = *b"HXPC";

/// The tag of the server's refusal of a clear-text connection.
pub const CLEAR_REFUSED_TAG: [u8; 4] = *b"HXNE";

/// The first byte of every TLS handshake record (content type 22).
pub const TLS_HANDSHAKE: u8 = 0x16;

/// The label of the TLS exporter value that binds the handshake's MACs to their connection
/// (RFC 5705 / RFC 8446 §7.5).
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-hsxfer-channel-binding";

/// The exporter value of a clear-text connection.
pub const NO_BINDING: [u8; 32] = [0; 32];

/// How a connection opens, from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A TLS ClientHello.
    Tls,
    /// The start of [`CLEAR_PREFACE`].
    Clear,
    /// Anything else: not an hsxfer client of this version.
    Unknown,
}

/// Classifies a connection by its first byte.
pub fn classify(first: u8) -> Opening {
    match first {
        TLS_HANDSHAKE => Opening::Tls,
        b if b == CLEAR_PREFACE[0] => Opening::Clear,
        _ => Opening::Unknown,
    }
}

/// Length of [`clear_refused`]: that of the server's hello ([`super::auth::SERVER_HELLO_LEN`]),
/// whose place it takes, so a client reads it whole.
pub const CLEAR_REFUSED_LEN: usize = 36;

/// The server's answer to a clear-text client when clear text is not allowed, in place of
/// its hello.
pub fn clear_refused() -> [u8; CLEAR_REFUSED_LEN] {
    let mut b = [0u8; CLEAR_REFUSED_LEN];
    b[..4].copy_from_slice(&CLEAR_REFUSED_TAG);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_starts_with_its_tag_and_openings_differ() {
        assert_eq!(clear_refused()[..4], CLEAR_REFUSED_TAG);
        assert_ne!(classify(TLS_HANDSHAKE), classify(CLEAR_PREFACE[0]));
    }
}
