//! Memory for blocks being received, shared by a server's sessions. A channel reads a whole
//! block before it writes it (nothing unchecked reaches a file), so each channel receiving a
//! block holds a buffer of the block's size: 4 MiB by default. A server's channels took
//! their own, and 50 clients pushing at once held up to 200 MiB. Now a channel takes a
//! buffer from the process's [`BlockMemory`] once it has read a block's header and gives it
//! back once the block is written; when all of it is held, the channel waits, and its
//! sender with it, until a block is written. A waiting channel's data keeps arriving into
//! its socket's receive buffer, so it is read at memory speed once the channel has a buffer.

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use tokio::sync::Notify;

/// A server's block memory unless told otherwise: 64 MiB, sixteen 4 MiB blocks in flight
/// at once across all its sessions, four times what one transfer with the default four
/// channels holds.
pub const DEFAULT_SERVER_BLOCK_MEMORY: usize = 64 << 20;

/// Buffers for blocks being received, up to a number of bytes in all. Buffers given back
/// are kept for the next blocks, so a steady transfer allocates nothing.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() {
/// use hsxfer::session::block_memory::BlockMemory;
///
/// let memory = BlockMemory::with_bytes(8 << 20);
/// let first = memory.take(4 << 20).await;
/// let second = memory.take(4 << 20).await;
/// assert_eq!(memory.free(), 0);
/// drop(first); // kept for the next block
/// let third = memory.take(1 << 20).await;
/// assert!(third.capacity() >= 4 << 20);
/// # drop((second, third));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct BlockMemory {
    pool: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    state: Mutex<State>,
    /// Told when a buffer is given back.
    returned: Notify,
    /// Bytes in all.
    capacity: usize,
}

#[derive(Debug)]
struct State {
    /// Buffers given back, each with the bytes it holds.
    idle: Vec<(BytesMut, usize)>,
    /// Bytes held by no buffer, idle or in use.
    unheld: usize,
    /// Takers waiting for memory.
    waiting: usize,
}

impl BlockMemory {
    /// Memory of `bytes` in all (at least one byte). A block larger than all of it waits
    /// until no other is held.
    pub fn with_bytes(bytes: usize) -> Self {
        let capacity = bytes.max(1);
        BlockMemory {
            pool: Arc::new(Pool {
                state: Mutex::new(State {
                    idle: Vec::new(),
                    unheld: capacity,
                    waiting: 0,
                }),
                returned: Notify::new(),
                capacity,
            }),
        }
    }

    /// No bound: a client's transfer, whose channels are its own choice, takes one of these.
    pub fn unbounded() -> Self {
        Self::with_bytes(usize::MAX)
    }

    /// A buffer of at least `len` bytes, empty; waits while the memory is all held.
    pub async fn take(&self, len: u32) -> BlockBuffer {
        let len = len as usize;
        let mut waiting = None;
        loop {
            let returned = self.pool.returned.notified();
            tokio::pin!(returned);
            // Registered before looking, so that a buffer given back in between wakes us.
            returned.as_mut().enable();
            if let Some(b) = self.try_take(len) {
                return b;
            }
            waiting.get_or_insert_with(|| Waiting::count(&self.pool));
            returned.await;
        }
    }

    /// True while a taker waits for memory: a block held by a slow sender then keeps
    /// another from being received ([`crate::session::wire::BLOCK_MIN_RATE`]).
    pub fn contended(&self) -> bool {
        self.pool.lock().waiting > 0
    }

    fn try_take(&self, len: usize) -> Option<BlockBuffer> {
        let mut s = self.pool.lock();
        let (buf, held) = match s.idle.iter().position(|(b, _)| b.capacity() >= len) {
            Some(i) => s.idle.swap_remove(i),
            None => {
                // A block larger than all the memory is charged all of it.
                let charge = len.min(self.pool.capacity);
                while s.unheld < charge {
                    let (_, held) = s.idle.pop()?;
                    s.unheld += held;
                }
                s.unheld -= charge;
                (BytesMut::with_capacity(len), charge)
            }
        };
        Some(BlockBuffer {
            buf,
            held,
            pool: self.pool.clone(),
        })
    }

    /// Bytes neither in use nor kept idle.
    pub fn free(&self) -> usize {
        self.pool.lock().unheld
    }
}

/// A taker counted as waiting until it has its buffer or gives up (is dropped).
struct Waiting<'a>(&'a Pool);

impl<'a> Waiting<'a> {
    fn count(pool: &'a Pool) -> Self {
        pool.lock().waiting += 1;
        Waiting(pool)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().waiting -= 1;
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("block memory lock")
    }
}

/// A buffer taken from a [`BlockMemory`], given back when dropped.
#[derive(Debug)]
pub struct BlockBuffer {
    buf: BytesMut,
    held: usize,
    pool: Arc<Pool>,
}

impl std::ops::Deref for BlockBuffer {
    type Target = BytesMut;
    fn deref(&self) -> &BytesMut {
        &self.buf
    }
}

impl std::ops::DerefMut for BlockBuffer {
    fn deref_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }
}

impl Drop for BlockBuffer {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        self.pool.lock().idle.push((buf, self.held));
        self.pool.returned.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn memory_is_contended_while_a_taker_waits() {
        let memory = BlockMemory::with_bytes(4 << 20);
        let held = memory.take(4 << 20).await;
        assert!(!memory.contended());
        let waiter = {
            let m = memory.clone();
            tokio::spawn(async move { m.take(4 << 20).await })
        };
        while !memory.contended() {
            tokio::task::yield_now().await;
        }
        drop(held);
        drop(waiter.await.unwrap());
        assert!(!memory.contended(), "the waiter has its buffer");
        let held = memory.take(4 << 20).await;
        let given_up = {
            let m = memory.clone();
            tokio::spawn(async move { m.take(1).await })
        };
        while !memory.contended() {
            tokio::task::yield_now().await;
        }
        given_up.abort();
        let _ = given_up.await;
        assert!(!memory.contended(), "a taker that gave up no longer waits");
        drop(held);
    }

    /// Takes `len` bytes while `held` is held: the taker must wait until `held` is given
    /// back, and then get a buffer. Returns its capacity.
    async fn waits_until_given_back(memory: &BlockMemory, held: BlockBuffer, len: u32) -> usize {
        let m = memory.clone();
        let waiting = tokio::spawn(async move { m.take(len).await.capacity() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "took {len} bytes beside what is held"
        );
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        got.expect("not woken by the buffer given back").unwrap()
    }

    #[tokio::test]
    async fn a_taker_waits_until_a_buffer_is_given_back() {
        let memory = BlockMemory::with_bytes(8 << 20);
        let a = memory.take(4 << 20).await;
        let _b = memory.take(4 << 20).await;
        assert!(waits_until_given_back(&memory, a, 4 << 20).await >= 4 << 20);
    }

    #[tokio::test]
    async fn idle_buffers_too_small_are_freed_for_a_larger_block() {
        let memory = BlockMemory::with_bytes(8 << 20);
        let small: Vec<_> = [memory.take(2 << 20).await, memory.take(2 << 20).await].into();
        let _big = memory.take(4 << 20).await;
        drop(small);
        assert_eq!(memory.free(), 0);
        // Both idle 2 MiB buffers are freed to make room for this one.
        let again = tokio::time::timeout(Duration::from_secs(5), memory.take(4 << 20)).await;
        assert!(again.expect("idle memory not reclaimed").capacity() >= 4 << 20);
        assert_eq!(memory.free(), 0);
    }

    #[tokio::test]
    async fn a_block_larger_than_the_memory_waits_for_all_of_it() {
        let memory = BlockMemory::with_bytes(4 << 20);
        let small = memory.take(1 << 20).await;
        assert!(waits_until_given_back(&memory, small, 16 << 20).await >= 16 << 20);
    }
}
