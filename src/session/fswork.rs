//! File work that runs where it costs least: at once on the calling worker while that kind
//! of job has been quick, otherwise on a few blocking threads that drain a shared queue.
//!
//! One `spawn_blocking` per block or per commit cost two thread wake-ups per job. With many
//! small files that was most of the CPU both ends spent: a 10,000-file pull on loopback
//! switched threads 64,000 times and spent about 40 % of its cycles doing so. Reads and
//! writes through the page cache, and commits on a filesystem with cheap syncs, take a few
//! microseconds, far less than the hop. So each kind of job keeps a running mean of its run
//! time: below [`INLINE_BELOW`] (well inside the time an async task may run between
//! awaits) it runs inline; above, on the threads, so a slow disk never holds up the
//! sockets. Jobs run on the threads are timed too, so a kind goes back inline once it is
//! quick again (a cold file now in the cache). A kind not seen yet starts on the threads.
//! A thread that finds more work queued takes it without another wake-up.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{Error, Result};

type Job = Box<dyn FnOnce() + Send>;

/// Kinds of job whose mean run time is below this run inline on the async worker.
pub const INLINE_BELOW: Duration = Duration::from_micros(100);

/// Weight of the newest run in a kind's running mean: a few slow runs move it to the
/// threads.
const NEWEST_WEIGHT: f64 = 0.25;

/// File jobs, run inline while quick, otherwise queued for at most `lanes` threads.
///
/// # Examples
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let work = hsxfer::session::fswork::FileWork::new(2);
/// let len = work.run("reading /", || std::fs::metadata("/").map(|m| m.len())).await;
/// assert!(len.unwrap().is_ok());
/// # });
/// ```
#[derive(Clone)]
pub struct FileWork {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    lanes: usize,
    /// Running mean run time of each kind of job, in seconds.
    costs: Mutex<HashMap<&'static str, f64>>,
}

struct State {
    jobs: VecDeque<Job>,
    draining: usize,
}

impl FileWork {
    /// A queue drained by at most `lanes` threads (at least one).
    pub fn new(lanes: usize) -> Self {
        FileWork {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    jobs: VecDeque::new(),
                    draining: 0,
                }),
                lanes: lanes.max(1),
                costs: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// One lane per core: enough to keep the disks busy, few enough that lanes find work
    /// waiting when they finish a job.
    pub fn per_core() -> Self {
        Self::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    }

    /// Runs `job`, a job of the kind `what`: inline if that kind has been quick, otherwise
    /// on a blocking thread once the jobs queued before it have started. `what` also names
    /// the job in the error if it panics, its only failure.
    pub async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        if self.inner.is_quick(what) {
            let timed = self.inner.timed(what, job);
            return catch_unwind(AssertUnwindSafe(timed)).map_err(|_| Error::Panicked(what));
        }
        let (tx, rx) = oneshot::channel();
        let timed = self.inner.timed(what, job);
        let start_lane = {
            let mut s = self.inner.lock();
            s.jobs.push_back(Box::new(move || {
                let _ = tx.send(timed());
            }));
            let spare = s.draining < self.inner.lanes;
            if spare {
                s.draining += 1;
            }
            spare
        };
        if start_lane {
            let inner = self.inner.clone();
            tokio::task::spawn_blocking(move || inner.drain());
        }
        rx.await.map_err(|_| Error::Panicked(what))
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("file work queue lock")
    }

    fn costs(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, f64>> {
        self.costs.lock().expect("file work costs lock")
    }

    /// Whether jobs of kind `what` have been quick enough to run inline.
    fn is_quick(&self, what: &'static str) -> bool {
        self.costs()
            .get(what)
            .is_some_and(|&mean| mean < INLINE_BELOW.as_secs_f64())
    }

    /// `job`, adding its run time to the mean of its kind.
    fn timed<T>(
        self: &Arc<Self>,
        what: &'static str,
        job: impl FnOnce() -> T,
    ) -> impl FnOnce() -> T {
        let inner = self.clone();
        move || {
            let began = Instant::now();
            let out = job();
            let took = began.elapsed().as_secs_f64();
            let mut costs = inner.costs();
            let mean = costs.entry(what).or_insert(took);
            *mean += NEWEST_WEIGHT * (took - *mean);
            out
        }
    }

    /// Runs queued jobs until none is left. A panicking job drops its answer (its caller
    /// sees the failure) and the lane goes on.
    fn drain(&self) {
        loop {
            let job = {
                let mut s = self.lock();
                match s.jobs.pop_front() {
                    Some(j) => j,
                    None => {
                        s.draining -= 1;
                        return;
                    }
                }
            };
            let _ = catch_unwind(AssertUnwindSafe(job));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_job_runs_once_and_answers_its_caller() {
        let work = FileWork::new(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let mut all = tokio::task::JoinSet::new();
        for i in 0..500u32 {
            let (work, ran) = (work.clone(), ran.clone());
            all.spawn(async move {
                let got = work
                    .run("counting", move || {
                        ran.fetch_add(1, Ordering::SeqCst);
                        i * 2
                    })
                    .await
                    .unwrap();
                assert_eq!(got, i * 2);
            });
        }
        while let Some(r) = all.join_next().await {
            r.unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 500);
        // A job answers its caller before its lane looks for the next one, so the last lane
        // may still be on its way out when the last answer arrives: it must end soon after.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut draining = work.inner.lock().draining;
        while draining > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
            draining = work.inner.lock().draining;
        }
        assert_eq!(draining, 0, "every lane ended");
    }

    #[tokio::test]
    async fn no_more_lanes_than_asked_run_at_once() {
        let work = FileWork::new(2);
        let busy = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..40 {
            let (work, busy, most) = (work.clone(), busy.clone(), most.clone());
            all.spawn(async move {
                work.run("sleeping", move || {
                    let now = busy.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    busy.fetch_sub(1, Ordering::SeqCst);
                })
                .await
                .unwrap();
            });
        }
        while let Some(r) = all.join_next().await {
            r.unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 2);
    }

    #[tokio::test]
    async fn quick_kinds_run_inline_and_slow_ones_on_the_threads() {
        let work = FileWork::new(2);
        let here = std::thread::current().id();
        let on = |t: std::thread::ThreadId| if t == here { "inline" } else { "thread" };
        let where_quick = || work.run("quick", || std::thread::current().id());
        assert_eq!(
            on(where_quick().await.unwrap()),
            "thread",
            "unknown kinds start there"
        );
        assert_eq!(on(where_quick().await.unwrap()), "inline");
        let slow = || {
            work.run("slow", || {
                std::thread::sleep(INLINE_BELOW * 5);
                std::thread::current().id()
            })
        };
        for _ in 0..3 {
            assert_eq!(on(slow().await.unwrap()), "thread");
        }
        assert_eq!(
            on(where_quick().await.unwrap()),
            "inline",
            "kinds are kept apart"
        );
    }

    #[tokio::test]
    async fn a_kind_turned_slow_moves_to_the_threads() {
        let work = FileWork::new(1);
        let here = std::thread::current().id();
        let job = |pause: Duration| {
            work.run("reading", move || {
                std::thread::sleep(pause);
                std::thread::current().id() == here
            })
        };
        job(Duration::ZERO).await.unwrap();
        assert!(job(Duration::ZERO).await.unwrap(), "quick: inline");
        let mut inline_slow_runs = 0;
        while job(INLINE_BELOW * 10).await.unwrap() {
            inline_slow_runs += 1;
        }
        assert!(
            inline_slow_runs <= 1,
            "{inline_slow_runs} slow runs held the worker"
        );
    }

    #[tokio::test]
    async fn a_panicking_job_fails_its_caller_and_the_queue_goes_on() {
        let work = FileWork::new(1);
        let bad = work.run("panicking", || -> u32 { panic!("boom") });
        let good = work.run("answering", || 7u32);
        let (bad, good) = tokio::join!(bad, good);
        assert!(bad.is_err());
        assert_eq!(good.unwrap(), 7);
    }
}
