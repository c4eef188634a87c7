//! The data channels a server may tell its client to open while a session runs
//! (`OpenChannels`): the next indices, in turn, up to the most the client's request allows.
//! Anything else breaks the protocol; without the check one message from a hostile server
//! made the client dial 65,535 connections.

use std::ops::Range;

use super::Violation;

/// What a client has opened, and the most its session may have.
///
/// # Examples
///
/// ```
/// use hsxfer::channels::growth::ChannelsToOpen;
///
/// let mut c = ChannelsToOpen::new(4, 8);
/// assert_eq!(c.on_open(4, 2), Ok(4..6));
/// assert!(c.on_open(4, 2).is_err(), "the same channels twice");
/// assert!(c.on_open(6, 3).is_err(), "past the most");
/// assert_eq!(c.on_open(6, 2), Ok(6..8));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelsToOpen {
    next: u16,
    most: u16,
}

impl ChannelsToOpen {
    /// A session that opened `opened` channels and may have `most`.
    pub fn new(opened: u16, most: u16) -> Self {
        ChannelsToOpen { next: opened, most }
    }

    /// Takes the server's word to open `count` channels from `first`; returns the indices
    /// to open.
    pub fn on_open(&mut self, first: u16, count: u16) -> Result<Range<u16>, Violation> {
        let end = u32::from(first) + u32::from(count);
        if first != self.next || count == 0 || end > u32::from(self.most) {
            return Err(Violation(format!(
                "the server said to open {count} data channels from {first}, where this \
                 session may open channels {}..{} next",
                self.next, self.most
            )));
        }
        self.next += count;
        Ok(first..self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_next_channels_up_to_the_most() {
        let mut c = ChannelsToOpen::new(2, 128);
        assert!(c.on_open(3, 1).is_err(), "out of turn");
        assert!(c.on_open(2, 0).is_err(), "none");
        assert!(c.on_open(2, u16::MAX).is_err(), "past the most");
        assert!(c.on_open(u16::MAX, u16::MAX).is_err(), "no overflow");
        assert_eq!(c.on_open(2, 126), Ok(2..128));
        assert!(c.on_open(128, 1).is_err());
        // A session without online tuning may have no more than it opened.
        assert!(ChannelsToOpen::new(4, 4).on_open(4, 1).is_err());
    }
}
