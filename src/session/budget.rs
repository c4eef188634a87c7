//! A process's budget of files open for receiving, shared by all its sessions. A session may
//! hold [`MAX_UNFINISHED_FILES`](crate::channels::limits::MAX_UNFINISHED_FILES) files being
//! received (a partial file and a restart journal each), so one large tree, or a few, would
//! otherwise run a process at the common `ulimit -n 1024` out of descriptors. A session takes
//! one slot per file of a manifest chunk before it opens them (a chunk larger than the whole
//! budget in parts of at most [`FileBudget::capacity`] files), and gives each back when that
//! file is committed; a session that finds the budget spent waits, and its sender with it,
//! until files commit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Descriptors each file being received may hold: its partial file and its journal.
const DESCRIPTORS_PER_FILE: u64 = 2;

/// Slots for files being received, across a process's sessions (a server's, or a client's).
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() {
/// use hsxfer::session::budget::FileBudget;
///
/// let budget = FileBudget::with_slots(300);
/// let mut taken = budget.take(256).await;
/// let one = taken.split(1).unwrap();
/// drop(taken);
/// assert_eq!(budget.free(), 299);
/// drop(one);
/// assert_eq!(budget.free(), 300);
/// assert_eq!(budget.capacity(), 300);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct FileBudget {
    slots: Arc<Semaphore>,
    capacity: u32,
}

/// This process's descriptor limit (the soft `RLIMIT_NOFILE`), or the usual 1,024 if it
/// cannot be read: what the file budget and the server's caps share out.
pub fn open_files_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft)
}

impl FileBudget {
    /// A budget of `slots` files (at least one).
    pub fn with_slots(slots: u64) -> Self {
        let capacity = slots.clamp(1, u64::from(u32::MAX >> 3)) as u32;
        FileBudget {
            slots: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
        }
    }

    /// Half of this process's descriptor limit (`RLIMIT_NOFILE`, raised to the hard limit at
    /// start) for files: the other half is for connections and everything else.
    pub fn for_this_process() -> Self {
        Self::with_slots(open_files_limit() / 2 / DESCRIPTORS_PER_FILE)
    }

    /// One budget for everything this process receives as a client ([`Self::for_this_process`],
    /// made on first use), so concurrent transfers in one program share it. A child forked
    /// after that (`multiprocessing`'s workers) makes its own: the slots its parent's
    /// transfers held would never come back to it, as those transfers do not run there.
    pub fn of_clients() -> Self {
        static SHARED: std::sync::Mutex<Option<(u32, FileBudget)>> = std::sync::Mutex::new(None);
        let pid = std::process::id();
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        match &*shared {
            Some((owner, budget)) if *owner == pid => budget.clone(),
            _ => {
                let budget = Self::for_this_process();
                *shared = Some((pid, budget.clone()));
                budget
            }
        }
    }

    /// Waits for `files` slots; they return to the budget when dropped (split off one per
    /// file with [`OwnedSemaphorePermit::split`]).
    pub async fn take(&self, files: u32) -> OwnedSemaphorePermit {
        self.slots
            .clone()
            .acquire_many_owned(files)
            .await
            .expect("the budget's semaphore is never closed")
    }

    /// Slots in all: the most files one session may take at once.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_forked_child_has_all_of_its_own_client_budget() {
        let budget = FileBudget::of_clients();
        let _held = budget.take(budget.capacity()).await;
        assert_eq!(FileBudget::of_clients().free(), 0, "one budget per process");
        // SAFETY: the child only reads its budget (within 10 s, or SIGALRM ends it) and
        // leaves with `_exit`.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
        if child == 0 {
            unsafe { libc::alarm(10) };
            let budget = FileBudget::of_clients();
            let whole = budget.free() == budget.capacity() as usize;
            unsafe { libc::_exit(if whole { 0 } else { 1 }) }
        }
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child's budget had slots taken (status {status:#x})"
        );
    }
}
