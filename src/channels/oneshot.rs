//! The line a one-shot server (`hsxfer serve --once --stdio`) prints on its standard output
//! for the client that started it over SSH: the port it listens on, the one-time token of
//! its single session and the fingerprint of its TLS key (made for this run only). The SSH
//! channel carries it, so only that client learns the token, and it learns the key from a
//! channel SSH has already authenticated.
//!
//! ```text
//! hsxfer-oneshot v2 port=PORT token=HEX key=SHA256:BASE64
//! ```

use std::fmt;

/// What every announcement starts with; a client skips other lines (a login shell's
/// greetings) until it sees one.
pub const PREFIX: &str = "hsxfer-oneshot v2 ";

/// Fewest hex digits in a one-time token (128 bits), as for token files.
pub const MIN_TOKEN_HEX: usize = 32;

/// A one-shot server's port and token.
///
/// # Examples
///
/// ```
/// use hsxfer::channels::oneshot::Announcement;
///
/// let key = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU".to_string();
/// let a = Announcement { port: 40123, token: "ab".repeat(32), key };
/// let line = a.to_string();
/// assert_eq!(Announcement::parse(&line), Ok(Some(a)));
/// assert_eq!(Announcement::parse("Welcome to host!"), Ok(None));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// The TCP port of the server's control connection and data channels.
    pub port: u16,
    /// The session's token, in hex.
    pub token: String,
    /// The fingerprint of the server's TLS key (`SHA256:` and 43 base64 characters).
    pub key: String,
}

/// Why a line that starts like an announcement is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed one-shot announcement ({0}): run the same hsxfer version on both hosts")]
pub struct BadAnnouncement(&'static str);

impl Announcement {
    /// `Ok(None)` for a line that is not an announcement at all; an error for one that
    /// starts like one but is malformed (another version's, say).
    pub fn parse(line: &str) -> Result<Option<Announcement>, BadAnnouncement> {
        let Some(rest) = line.trim_end().strip_prefix(PREFIX) else {
            return Ok(None);
        };
        let mut port = None;
        let mut token = None;
        let mut key = None;
        for field in rest.split(' ') {
            match field.split_once('=') {
                Some(("port", p)) => port = p.parse::<u16>().ok().filter(|&p| p != 0),
                Some(("token", t)) => token = Some(t),
                Some(("key", k)) => key = Some(k),
                _ => return Err(BadAnnouncement("unknown field")),
            }
        }
        let port = port.ok_or(BadAnnouncement("no valid port"))?;
        let token = token.ok_or(BadAnnouncement("no token"))?;
        if token.len() < MIN_TOKEN_HEX || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadAnnouncement("token too short or not hex"));
        }
        let key = key.ok_or(BadAnnouncement("no key"))?;
        let b64 = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
        match key.strip_prefix("SHA256:") {
            Some(k) if k.len() == 43 && k.bytes().all(b64) => {}
            _ => return Err(BadAnnouncement("key is not a SHA256 fingerprint")),
        }
        Ok(Some(Announcement {
            port,
            token: token.to_string(),
            key: key.to_string(),
        }))
    }
}

impl fmt::Display for Announcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}port={} token={} key={}",
            self.port, self.token, self.key
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_announcements_are_errors_and_other_lines_are_skipped() {
        let t = "0f".repeat(16);
        let k = "key=SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU";
        assert_eq!(Announcement::parse(""), Ok(None));
        assert_eq!(Announcement::parse("hsxfer-oneshot v1 port=1"), Ok(None));
        for bad in [
            format!("{PREFIX}port=0 token={t} {k}"),
            format!("{PREFIX}port=70000 token={t} {k}"),
            format!("{PREFIX}token={t} {k}"),
            format!("{PREFIX}port=5 {k}"),
            format!("{PREFIX}port=5 token=abc {k}"),
            format!("{PREFIX}port=5 token={} {k}", "zz".repeat(16)),
            format!("{PREFIX}port=5 token={t} {k} extra"),
            format!("{PREFIX}port=5 token={t}"),
            format!("{PREFIX}port=5 token={t} key=SHA256:short"),
            format!("{PREFIX}port=5 token={t} key=MD5:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"),
        ] {
            assert!(Announcement::parse(&bad).is_err(), "{bad}");
        }
        let ok = Announcement::parse(&format!("{PREFIX}port=5 token={t} {k}\r\n"));
        assert_eq!(ok.unwrap().unwrap().port, 5);
    }
}
