//! A FIFO or terminal as a pull's destination takes bytes in file order only, while the
//! channels deliver blocks in any order. Blocks that arrive ahead of their turn are held in
//! memory until it comes ([`StreamSink`]); this bounds how much: a channel whose block is
//! not next waits, and its sender with it, while the held blocks fill [`hold_limit`].
//!
//! Waiting never stops the block that is next. A sender's channel takes its blocks in file
//! order, so the channel carrying the next block holds no block behind it that would wait.
//! Only a block asked for again (damaged on the way) comes back behind later ones: while one
//! is outstanding, nothing waits, up to [`hard_limit`]. A sender sends such a block before
//! any other it has not started, so past that it is not going to: the pull ends instead of
//! holding the rest of the file in memory.

use std::collections::BTreeSet;
use std::io;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::channels::Violation;
use crate::fsio::partial::StreamSink;

/// The least a stream destination may hold ahead of its turn: a few blocks of a transfer with
/// few channels.
pub const MIN_HOLD: u64 = 64 << 20;

/// Bytes a stream destination may hold ahead of its turn before a channel waits: two blocks
/// per channel, as channels that deliver in parallel finish about one block each at once, so
/// a smooth transfer never waits; at least [`MIN_HOLD`].
pub fn hold_limit(block_size: u32, channels: usize) -> u64 {
    (2 * channels as u64 * u64::from(block_size)).max(MIN_HOLD)
}

/// Bytes held ahead of their turn past which a block asked for again is not waited for any
/// longer: sixteen times `limit`, and at least 4 GiB. The block asked for again comes behind
/// what its channel had in flight (its sockets' buffers, a timeout's backoff) while the other
/// channels go on delivering: gigabytes on a fast long path. The bound is for a sender that
/// never sends it.
pub fn hard_limit(limit: u64) -> u64 {
    limit.saturating_mul(16).max(4 << 30)
}

/// A stream destination and the order its blocks are received in.
pub struct OrderedSink {
    sink: Mutex<StreamSink>,
    /// What the channels check before each block: [`StreamSink`]'s lock is held through
    /// writes that a slow reader of the FIFO can block for long.
    order: Mutex<Order>,
    moved: Notify,
}

#[derive(Default)]
struct Order {
    next: u64,
    held: u64,
    asked_again: BTreeSet<u64>,
}

impl OrderedSink {
    /// Orders the blocks written to `sink`.
    pub fn new(sink: StreamSink) -> Self {
        OrderedSink {
            sink: Mutex::new(sink),
            order: Mutex::default(),
            moved: Notify::new(),
        }
    }

    /// Returns once the block at `offset` may be received: at once when it is next, or while
    /// the blocks held ahead of their turn take less than `limit` bytes, or while a block
    /// asked for again is outstanding and they take less than `hard` ([`hard_limit`]). Past
    /// that the sender is not sending it again: an error.
    pub async fn turn(&self, offset: u64, limit: u64, hard: u64) -> Result<(), Violation> {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            // Looked at once registered, so that a move in between is not missed.
            {
                let o = self.order.lock().expect("stream order lock");
                if offset <= o.next || o.held < limit {
                    return Ok(());
                }
                if let Some(again) = o.asked_again.first() {
                    if o.held < hard {
                        return Ok(());
                    }
                    return Err(Violation(format!(
                        "the sender did not send the damaged block at byte {again} again, though \
                         {} MiB came after it",
                        o.held >> 20
                    )));
                }
            }
            moved.await;
        }
    }

    /// Writes the block at `offset` (blocking: call it on a file thread), and wakes the
    /// channels waiting for their turn.
    pub fn write_block(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut sink = self.sink.lock().expect("stream sink lock");
        let written = sink.write_block(offset, data);
        {
            // Copied under the sink's lock: a write that finished later must not be
            // overwritten by this one's older reading.
            let mut o = self.order.lock().expect("stream order lock");
            (o.next, o.held) = (sink.next_offset(), sink.held_bytes());
            if written.is_ok() {
                o.asked_again.remove(&offset);
            }
        }
        drop(sink);
        self.moved.notify_waiters();
        written
    }

    /// The block at `offset` was damaged and is asked for again.
    pub fn asked_again(&self, offset: u64) {
        self.order
            .lock()
            .expect("stream order lock")
            .asked_again
            .insert(offset);
        self.moved.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// A FIFO with a reader that collects everything written to it.
    fn fifo_sink() -> (
        tempfile::TempDir,
        OrderedSink,
        std::thread::JoinHandle<Vec<u8>>,
    ) {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let f = fifo.clone();
        let reader = std::thread::spawn(move || std::fs::read(f).unwrap());
        let sink = OrderedSink::new(StreamSink::open(&fifo).unwrap());
        (t, sink, reader)
    }

    async fn waits(sink: &OrderedSink, offset: u64, limit: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(50), sink.turn(offset, limit, 1 << 30))
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_block_ahead_waits_once_the_held_blocks_fill_the_limit_and_the_next_never_does() {
        let (_t, sink, reader) = fifo_sink();
        let sink = Arc::new(sink);
        assert!(!waits(&sink, 8, 4).await, "nothing held yet");
        sink.write_block(4, b"efgh").unwrap();
        assert!(waits(&sink, 8, 4).await, "4 bytes held, limit 4");
        assert!(!waits(&sink, 8, 5).await, "under a larger limit");
        assert!(!waits(&sink, 0, 4).await, "the next block never waits");
        // The next block lets the one waiting go.
        let s = sink.clone();
        let waiting = tokio::spawn(async move { s.turn(8, 4, 1 << 30).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        sink.write_block(0, b"abcd").unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken once the held block was written")
            .unwrap()
            .unwrap();
        sink.write_block(8, b"ij").unwrap();
        drop(sink);
        assert_eq!(reader.join().unwrap(), b"abcdefghij");
    }

    #[tokio::test]
    async fn nothing_waits_while_a_block_asked_for_again_is_outstanding() {
        let (_t, sink, reader) = fifo_sink();
        sink.write_block(4, b"efgh").unwrap();
        assert!(waits(&sink, 8, 4).await);
        // Block 0 was damaged: its second copy may come behind block 8 on one channel.
        sink.asked_again(0);
        assert!(!waits(&sink, 8, 4).await);
        // Not without end: past the hard limit it is not coming.
        let e = sink.turn(8, 4, 4).await.unwrap_err();
        assert!(e.0.contains("damaged block at byte 0"), "{e}");
        sink.write_block(0, b"abcd").unwrap();
        sink.write_block(12, b"mn").unwrap();
        assert!(
            waits(&sink, 16, 2).await,
            "block 0 arrived: the bound holds again"
        );
        sink.write_block(8, b"ijkl").unwrap();
        drop(sink);
        assert_eq!(reader.join().unwrap(), b"abcdefghijklmn");
    }

    #[test]
    fn the_limit_is_two_blocks_per_channel_and_at_least_the_minimum() {
        assert_eq!(hold_limit(4 << 20, 2), MIN_HOLD);
        assert_eq!(hold_limit(4 << 20, 32), 256 << 20);
    }
}
