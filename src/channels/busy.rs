//! The server's answer to a connection past one of its caps: in place of its hello (a
//! connection still to authenticate) or of its welcome (a session), the tag [`BUSY_TAG`] and
//! which cap it hit, padded to [`SERVER_HELLO_LEN`] bytes so that a client of any version
//! reads a whole message before it gives up.

use super::auth::SERVER_HELLO_LEN;

/// Tag of a busy answer.
pub const BUSY_TAG: [u8; 4] = *b"HXBZ";

/// What a cap counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Connections still in their handshake.
    Handshakes,
    /// Authenticated sessions.
    Sessions,
    /// Data channels joined to sessions.
    Channels,
    /// A cap of a later version, by its code.
    Other(u8),
}

impl Cap {
    fn code(self) -> u8 {
        match self {
            Cap::Handshakes => 0,
            Cap::Sessions => 1,
            Cap::Channels => 2,
            Cap::Other(code) => code,
        }
    }

    fn of_code(code: u8) -> Self {
        match code {
            0 => Cap::Handshakes,
            1 => Cap::Sessions,
            2 => Cap::Channels,
            other => Cap::Other(other),
        }
    }
}

/// Which cap turned a connection away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    /// What the cap counts.
    pub cap: Cap,
    /// The cap per peer address (true) or in total.
    pub per_address: bool,
    /// The cap.
    pub limit: u32,
}

impl Busy {
    /// Encodes to [`SERVER_HELLO_LEN`] bytes.
    pub fn encode(&self) -> [u8; SERVER_HELLO_LEN] {
        let mut b = [0u8; SERVER_HELLO_LEN];
        b[..4].copy_from_slice(&BUSY_TAG);
        b[4] = self.cap.code();
        b[5] = self.per_address as u8;
        b[6..10].copy_from_slice(&self.limit.to_le_bytes());
        b
    }

    /// Decodes; `None` when the bytes are not a busy answer.
    pub fn decode(b: &[u8; SERVER_HELLO_LEN]) -> Option<Self> {
        (b[..4] == BUSY_TAG).then(|| Busy {
            cap: Cap::of_code(b[4]),
            per_address: b[5] != 0,
            limit: u32::from_le_bytes(b[6..10].try_into().expect("4 bytes")),
        })
    }
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.cap {
            Cap::Handshakes => "connections still authenticating",
            Cap::Sessions => "sessions",
            Cap::Channels => "data channels",
            Cap::Other(_) => "connections of a kind this hsxfer does not know",
        };
        let whose = match self.per_address {
            true => "from this client's address",
            false => "in total",
        };
        write!(f, "it holds {} {what} {whose}, its limit", self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_says_which_cap() {
        let b = Busy {
            cap: Cap::Sessions,
            per_address: true,
            limit: 64,
        };
        assert_eq!(Busy::decode(&b.encode()), Some(b));
        assert_eq!(
            b.to_string(),
            "it holds 64 sessions from this client's address, its limit"
        );
        let c = Busy {
            cap: Cap::Channels,
            per_address: false,
            limit: 128,
        };
        assert_eq!(Busy::decode(&c.encode()), Some(c));
        assert_eq!(
            c.to_string(),
            "it holds 128 data channels in total, its limit"
        );
        assert_eq!(Busy::decode(&[0; SERVER_HELLO_LEN]), None);
        let mut unknown = c.encode();
        unknown[4] = 9;
        let later = Busy::decode(&unknown).expect("a busy answer all the same");
        assert_eq!(later.cap, Cap::Other(9));
        assert_eq!(Busy::decode(&later.encode()), Some(later));
    }
}
