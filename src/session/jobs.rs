//! The sending side's queue of blocks for its channels. A block the receiver asks for again
//! (damaged on the way) goes before every block not yet started: a pull into a FIFO holds
//! the blocks that came after it in memory until it arrives, and at the end of a queue of a
//! large file it came only after the rest of the file.

use crate::channels::sender::Job;

/// Queues jobs; cheap to clone.
#[derive(Clone)]
pub(super) struct JobSender {
    fresh: async_channel::Sender<Job>,
    again: async_channel::Sender<Job>,
}

/// Takes jobs, those asked for again first; cheap to clone.
#[derive(Clone)]
pub(super) struct JobReceiver {
    fresh: async_channel::Receiver<Job>,
    again: async_channel::Receiver<Job>,
}

/// An empty queue.
pub(super) fn job_queue() -> (JobSender, JobReceiver) {
    let (fresh_tx, fresh_rx) = async_channel::unbounded();
    let (again_tx, again_rx) = async_channel::unbounded();
    (
        JobSender {
            fresh: fresh_tx,
            again: again_tx,
        },
        JobReceiver {
            fresh: fresh_rx,
            again: again_rx,
        },
    )
}

impl JobSender {
    /// Queues a block behind the others.
    pub(super) fn send(&self, job: Job) {
        // Closed only once the session's sending is over.
        let _ = self.fresh.try_send(job);
    }

    /// Queues a block asked for again ahead of every block not yet taken.
    pub(super) fn send_again(&self, job: Job) {
        let _ = self.again.try_send(job);
    }

    /// Ends the queue: the channels take what is left, then stop.
    pub(super) fn close(&self) {
        self.fresh.close();
        self.again.close();
    }
}

impl JobReceiver {
    /// The next job, one asked for again first; `None` once the queue is closed and empty.
    pub(super) async fn next(&self) -> Option<Job> {
        if let Ok(job) = self.again.try_recv() {
            return Some(job);
        }
        tokio::select! {
            biased;
            Ok(job) = self.again.recv() => Some(job),
            job = self.fresh.recv() => match job {
                Ok(job) => Some(job),
                // Closed: one asked for again may still have come in meanwhile.
                Err(_) => self.again.try_recv().ok(),
            },
        }
    }

    /// True when no job waits.
    pub(super) fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.again.is_empty()
    }

    /// Drops every job waiting.
    pub(super) fn clear(&self) {
        while self.fresh.try_recv().is_ok() || self.again.try_recv().is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(block: u64) -> Job {
        Job {
            file: 0,
            block,
            offset: block * 4,
            len: 4,
            send: true,
        }
    }

    #[tokio::test]
    async fn a_block_asked_for_again_goes_first_and_the_rest_follow_in_order() {
        let (tx, rx) = job_queue();
        (0..3).for_each(|b| tx.send(job(b)));
        assert_eq!(rx.next().await, Some(job(0)));
        tx.send_again(job(0));
        assert_eq!(rx.next().await, Some(job(0)), "asked for again");
        assert_eq!(rx.next().await, Some(job(1)));
        assert!(!rx.is_empty());
        tx.send_again(job(1));
        tx.close();
        assert_eq!(rx.next().await, Some(job(1)));
        assert_eq!(rx.next().await, Some(job(2)));
        assert_eq!(rx.next().await, None);
        assert!(rx.is_empty());
    }
}
