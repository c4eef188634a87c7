//! The line a one-shot server (`hsxfer serve --once --stdio`) prints on its standard output
//! for the client that started it over SSH: the port it listens on and the one-time token
//! of its single session. The SSH channel carries it, so only that client learns the token.
//!
//! ```text
//! hsxfer-oneshot v1 port=PORT token=HEX
//! ```

use std::fmt;

/// What every announcement starts with; a client skips other lines (a login shell's
/// greetings) until it sees one.
pub const PREFIX: &str = "hsxfer-oneshot v1 ";

/// Fewest hex digits in a one-time token (128 bits), as for token files.
pub const MIN_TOKEN_HEX: usize = 32;

/// A one-shot server's port and token.
///
/// # Examples
///
/// ```
/// use hsxfer::channels::oneshot::Announcement;
///
/// let a = Announcement { port: 40123, token: "ab".repeat(32) };
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
        for field in rest.split(' ') {
            match field.split_once('=') {
                Some(("port", p)) => port = p.parse::<u16>().ok().filter(|&p| p != 0),
                Some(("token", t)) => token = Some(t),
                _ => return Err(BadAnnouncement("unknown field")),
            }
        }
        let port = port.ok_or(BadAnnouncement("no valid port"))?;
        let token = token.ok_or(BadAnnouncement("no token"))?;
        if token.len() < MIN_TOKEN_HEX || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadAnnouncement("token too short or not hex"));
        }
        Ok(Some(Announcement {
            port,
            token: token.to_string(),
        }))
    }
}

impl fmt::Display for Announcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}port={} token={}", self.port, self.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_announcements_are_errors_and_other_lines_are_skipped() {
        let t = "0f".repeat(16);
        assert_eq!(Announcement::parse(""), Ok(None));
        assert_eq!(Announcement::parse("hsxfer-oneshot v2 port=1"), Ok(None));
        for bad in [
            format!("{PREFIX}port=0 token={t}"),
            format!("{PREFIX}port=70000 token={t}"),
            format!("{PREFIX}token={t}"),
            format!("{PREFIX}port=5"),
            format!("{PREFIX}port=5 token=abc"),
            format!("{PREFIX}port=5 token={}", "zz".repeat(16)),
            format!("{PREFIX}port=5 token={t} extra"),
        ] {
            assert!(Announcement::parse(&bad).is_err(), "{bad}");
        }
        let ok = Announcement::parse(&format!("{PREFIX}port=5 token={t}\r\n"));
        assert_eq!(ok.unwrap().unwrap().port, 5);
    }
}
