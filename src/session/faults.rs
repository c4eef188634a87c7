//! Deliberate faults for tests of the integrity and crash paths. Public only with the
//! `testing` feature; without it every hook is off.

use crate::fsio::partial::CommitStep;

/// Deliberate damage for tests of the integrity path: the n-th block sent (counting from 0
/// over the whole session) is altered after its checks were computed.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultInjection {
    /// Flip a payload byte after hashing: caught on arrival, re-sent at once.
    pub corrupt_on_wire: Option<u64>,
    /// Flip a payload byte and send the damaged bytes' digest: only the end-to-end
    /// comparison with the seal can catch it.
    pub corrupt_past_check: Option<u64>,
    /// A receiving server kills itself (SIGKILL) just before this step of a commit.
    pub crash_at: Option<CommitStep>,
    /// A receiving server takes this much longer over every block it writes (on its file
    /// threads): a block write then outlives a session that ends meanwhile.
    pub slow_block_writes: Option<std::time::Duration>,
    /// A receiving server takes this much longer to close each part file a session leaves
    /// unfinished (as the data sync of a slow disk does).
    pub slow_part_closes: Option<std::time::Duration>,
    /// The sending side's first data channel (a server's for a pull, a client's for a push)
    /// waits this long before each block it sends: its blocks arrive behind the others'.
    pub slow_first_channel: Option<std::time::Duration>,
}
