//! The receiving engine: answers each manifest chunk with a plan (skip, resume, send all),
//! checks every arriving block (CRC-32C at once, BLAKE3 against the sender's seal), writes it
//! at its offset, asks again for anything damaged, and commits each file under its final name
//! once verified.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit};
use tokio::task::JoinSet;

use super::block_memory::{BlockBuffer, BlockMemory};
use super::budget::FileBudget;
use super::engine::{channel_ended, conclude, stopped, StopWatch};
use super::fswork::FileWork;
use super::growth::{admit_channels, recv_or_pending, Arrivals, Growth};
use super::idle::{IdleWatch, KEEPALIVE, RECEIVER_IDLE};
use super::report::{LiveStats, SideOutcome};
use super::stream_order::{hard_limit, hold_limit, OrderedSink};
use super::wire::{read_header, read_payload, ControlReader, ControlWriter};
use crate::channels::blocks;
use crate::channels::checks::check_telemetry;
use crate::channels::control::{FilePlan, Message, PlanAction};
use crate::channels::frame::{BlockHeader, DigestKey};
use crate::channels::manifest::{split_after_files, Entry, EntryKind};
use crate::channels::receiver::{Completion, ReceiveTracker, Verdict};
use crate::channels::{Digest, Violation};
use crate::error::{Error, Result};
use crate::fsio::dest::{DestError, Destination, Layout, Targets};
use crate::fsio::ns_to_system_time;
use crate::fsio::partial::{
    self as partials, prepare_in, CommitStep, FileMeta, OpenDir, PartialFile, Prepared, StreamSink,
};
use crate::fsio::root::Scope;
use crate::transport::tls::Stream;

/// How long a receiver waits for the sender's final telemetry after the last file, and
/// then for each next batch of it (a long trace comes in several).
const FINAL_TELEMETRY_WAIT: Duration = Duration::from_secs(2);

/// The longest a receiver waits for the sender's final telemetry in all.
const FINAL_TELEMETRY_MOST: Duration = Duration::from_secs(30);

/// Where received data goes.
#[derive(Clone)]
pub enum Sink {
    /// Files under a destination.
    Files(Destination),
    /// Nowhere: blocks are checked and dropped (bench).
    Discard,
}

enum Target {
    Partial(Box<PartialFile>),
    Stream(OrderedSink),
    Discard,
}

struct Shared {
    tracker: ReceiveTracker,
    targets: HashMap<u32, Arc<Target>>,
    /// Each file's slot in the server's [`FileBudget`], given back when it is committed.
    slots: HashMap<u32, OwnedSemaphorePermit>,
    /// Files the sender sends before their plans that are not planned here yet: a block of
    /// a file not tracked yet may be one of theirs, and waits for [`Shared::planned`].
    unplanned_left: u32,
    /// Wakes the channels waiting for a file to be planned.
    planned: Arc<Notify>,
}

/// Everything a receiving engine needs.
pub struct ReceiveEngine<R, W> {
    /// Control connection, read half.
    pub ctrl_r: ControlReader<R>,
    /// Control connection, write half.
    pub ctrl_w: ControlWriter<W>,
    /// Data channels, in index order.
    pub channels: Vec<Stream>,
    /// Where data goes.
    pub sink: Sink,
    /// Block size of the session.
    pub block_size: u32,
    /// Counters.
    pub live: Arc<LiveStats>,
    /// Key of the block digests.
    pub digest_key: DigestKey,
    /// Whether the sender forwards telemetry (a sending server): absorb it, and wait for its
    /// final batch after the last file.
    pub await_telemetry: bool,
    /// Channels the sender's online tuner adds while the session runs.
    pub growth: Option<Growth>,
    /// A server's stop: the session ends, telling the peer why (`None` for a client).
    pub stop: Option<StopWatch>,
    /// How long the peer may be silent ([`super::idle::SESSION_IDLE`] unless a server sets
    /// another).
    pub idle: Duration,
    /// Test fault: kill this process just before this step of a commit.
    pub crash_at: Option<CommitStep>,
    /// Test fault: every block write takes this much longer.
    pub slow_block_writes: Option<Duration>,
    /// Test fault: closing each file a session leaves unfinished takes this much longer.
    pub slow_part_closes: Option<Duration>,
    /// The process's budget of open files, shared with its other sessions; `None` bounds
    /// the session only by [`crate::channels::limits::MAX_UNFINISHED_FILES`].
    pub budget: Option<FileBudget>,
    /// Buffers for the blocks the channels receive: the server's, shared by its sessions, or
    /// [`BlockMemory::unbounded`] for a client's transfer.
    pub block_memory: BlockMemory,
    /// How many first files the sender sends before their plans (a pull into a destination
    /// that holds nothing, `Operation::Pull`'s `unplanned_files`): they are planned as soon
    /// as their manifest arrives, with no plan sent back, and a block that overtook its
    /// manifest waits for that.
    pub unplanned_files: u32,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> ReceiveEngine<R, W> {
    /// Runs the session to completion; on failure tells the peer why before returning.
    pub async fn run(mut self) -> Result<SideOutcome> {
        let shared = Arc::new(Mutex::new(Shared {
            tracker: ReceiveTracker::new(self.block_size),
            targets: HashMap::new(),
            slots: HashMap::new(),
            unplanned_left: self.unplanned_files,
            planned: Arc::new(Notify::new()),
        }));
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let work = FileWork::per_core();
        let mut tasks = JoinSet::new();
        for (i, stream) in std::mem::take(&mut self.channels).into_iter().enumerate() {
            tasks.spawn(self.channel(&shared, &ev_tx, &work, i, stream).run());
        }
        // On success the channel tasks end when the sender, having seen every FileDone,
        // closes its channels.
        let result = self.drive(&shared, &ev_tx, ev_rx, &work, &mut tasks).await;
        let out = conclude(result, &mut self.ctrl_r, &mut self.ctrl_w, tasks).await;
        let unfinished: Vec<_> = lock(&shared).targets.drain().map(|(_, t)| t).collect();
        drop(shared);
        let held = close_unfinished(unfinished, &work, self.slow_part_closes).await;
        let out = out?;
        if held > 0 {
            tracing::warn!("{held} part files were still held by file jobs when the session ended");
        }
        if self.await_telemetry {
            self.final_telemetry().await;
        }
        Ok(out)
    }

    /// Absorbs telemetry until the sender's final batch (or its close, or a short timeout
    /// from the last batch, at most [`FINAL_TELEMETRY_MOST`] in all: the data is already
    /// safe, only the report would lack the last samples).
    async fn final_telemetry(&mut self) {
        let most = tokio::time::Instant::now() + FINAL_TELEMETRY_MOST;
        let next = || (tokio::time::Instant::now() + FINAL_TELEMETRY_WAIT).min(most);
        loop {
            let b = match tokio::time::timeout_at(next(), self.ctrl_r.expect()).await {
                Ok(Ok(Message::Telemetry(b))) => b,
                Err(_) => {
                    tracing::warn!("the sender's last telemetry did not all come in time: the report and trace may lack its last samples");
                    return;
                }
                // The sender closed, or said something else: nothing more will come.
                Ok(_) => return,
            };
            if let Err(v) = check_telemetry(&b) {
                tracing::warn!("the sender's last telemetry is left out: {v}");
                return;
            }
            let last = b.last;
            self.live.telemetry.absorb(b);
            if last {
                return;
            }
        }
    }

    fn channel(
        &self,
        shared: &Arc<Mutex<Shared>>,
        events: &mpsc::UnboundedSender<(u32, Verdict)>,
        work: &FileWork,
        index: usize,
        stream: Stream,
    ) -> ChannelReceiver {
        ChannelReceiver {
            index,
            stream,
            shared: shared.clone(),
            events: events.clone(),
            work: work.clone(),
            live: self.live.clone(),
            key: self.digest_key,
            slow_writes: self.slow_block_writes,
            memory: self.block_memory.clone(),
            block_size: self.block_size,
        }
    }

    async fn drive(
        &mut self,
        shared: &Arc<Mutex<Shared>>,
        events_tx: &mpsc::UnboundedSender<(u32, Verdict)>,
        mut events: mpsc::UnboundedReceiver<(u32, Verdict)>,
        work: &FileWork,
        tasks: &mut JoinSet<Result<()>>,
    ) -> Result<SideOutcome> {
        let mut out = SideOutcome::default();
        let mut completion = Completion::default();
        let mut dirs = DirsToFinish::default();
        // Verified files are committed in groups: while one group commits, the files verified
        // meanwhile wait in `verified` and form the next.
        let mut commits: JoinSet<Result<Vec<u32>>> = JoinSet::new();
        let mut verified: Vec<u32> = Vec::new();
        let mut arrivals = Arrivals::take(&mut self.growth);
        // Manifest chunks in order, with their file counts, the first waiting for its files'
        // slots in the budget (a chunk larger than the whole budget queued in parts it holds).
        // The wait lives across turns of the loop, so it keeps its place in the budget's queue.
        let mut waiting: VecDeque<(Vec<Entry>, u64)> = VecDeque::new();
        let mut slots_wait: Option<SlotsWait> = None;
        let now = tokio::time::Instant::now();
        let mut idle = IdleWatch::new(now, self.live.total(), self.idle, RECEIVER_IDLE);
        while !completion.finished() {
            if commits.is_empty() && !verified.is_empty() {
                let group = std::mem::take(&mut verified);
                commits.spawn(commit_group(
                    work.clone(),
                    shared.clone(),
                    group,
                    self.crash_at,
                ));
            }
            if let (None, Some((_, files))) = (&slots_wait, waiting.front()) {
                slots_wait = Some(Box::pin(slots_for(self.budget.clone(), *files as u32)));
            }
            let (busy_here, keepalive_due) = (
                slots_wait.is_some() || !commits.is_empty(),
                self.keepalive_due(),
            );
            tokio::select! {
                // Messages already read go with it, and the verdicts already made: the files
                // they complete commit as one group.
                msg = self.ctrl_r.expect() => {
                    let mut next = Some(msg?);
                    while let Some(msg) = next.take() {
                        match msg {
                            Message::Manifest { entries, last } => {
                                let files =
                                    entries.iter().filter(|e| e.kind != EntryKind::Dir).count();
                                completion.announced(files as u64, last)?;
                                let unplanned = lock(shared).unplanned_left;
                                let (now, later) = match unplanned {
                                    0 => (Vec::new(), entries),
                                    n => split_after_files(entries, n as usize),
                                };
                                let planned_now = self
                                    .plan_unplanned(shared, work, now, &mut dirs, &mut out)
                                    .await?;
                                completion.planned(planned_now, planned_now);
                                let most = self.budget.as_ref().map_or(u32::MAX, FileBudget::capacity);
                                match files as u64 - planned_now {
                                    // Directories alone take no room in the budget, and
                                    // nothing waits for their plan: made now, as the session
                                    // may end before a queued piece's turn.
                                    0 if !later.is_empty() => {
                                        self.plan(shared, work, later, &mut dirs, &mut out, None)
                                            .await?;
                                    }
                                    0 => {}
                                    rest => queue_in_parts(&mut waiting, later, rest, most.into()),
                                }
                                if last {
                                    // No file announced later can be one sent before its
                                    // plan: a block for a file not yet tracked is a
                                    // violation now, not one to wait for.
                                    let mut s = lock(shared);
                                    s.unplanned_left = 0;
                                    s.planned.notify_waiters();
                                }
                            }
                            Message::Sealed { file, digests, more } => {
                                let v = lock(shared).tracker.on_sealed(file, digests, more)?;
                                self.act(shared, file, v, &mut verified, &mut out).await?;
                            }
                            Message::Telemetry(b) if self.await_telemetry => {
                                check_telemetry(&b)?;
                                self.live.telemetry.absorb(b)
                            }
                            Message::AddChannels { count } => {
                                if let Some(open) = admit_channels(self.growth.as_ref(), count) {
                                    self.ctrl_w.send(&open).await?;
                                }
                            }
                            Message::OpenChannels { first, count } => match &self.growth {
                                Some(g) => g.connect(first, count)?,
                                None => {
                                    return Err(Violation("unasked OpenChannels".into()).into())
                                }
                            },
                            Message::TimeUp if matches!(self.sink, Sink::Discard) => {
                                self.halt(tasks).await?;
                                out.files = self.live.files_done();
                                out.verified = true;
                                return Ok(out);
                            }
                            Message::Abort { message, transient } => {
                                return Err(Error::PeerAborted { message, transient })
                            }
                            other => {
                                return Err(Violation(format!("unexpected {other:?}")).into())
                            }
                        }
                        next = self.ctrl_r.buffered()?;
                    }
                    self.act_on_ready(shared, &mut events, &mut verified, &mut out).await?;
                }
                ev = events.recv() => match ev {
                    Some((file, verdict)) => {
                        self.act(shared, file, verdict, &mut verified, &mut out).await?;
                        self.act_on_ready(shared, &mut events, &mut verified, &mut out).await?;
                    }
                    None => return Err(Error::PeerVanished),
                },
                slots = async { slots_wait.as_mut().expect("a wait").await },
                    if slots_wait.is_some() =>
                {
                    slots_wait = None;
                    let (entries, files) = waiting.pop_front().expect("a chunk was waiting");
                    let plans = self.plan(shared, work, entries, &mut dirs, &mut out, slots).await?;
                    completion.planned(
                        files,
                        plans.iter().filter(|p| p.action != PlanAction::Skip).count() as u64,
                    );
                    self.ctrl_w.send(&Message::Plan { files: plans }).await?;
                }
                Some(done) = commits.join_next() => {
                    let files = done.map_err(Error::task("committing files"))??;
                    {
                        let mut s = lock(shared);
                        for file in &files {
                            s.targets.remove(file);
                            s.slots.remove(file);
                        }
                    }
                    for file in files {
                        completion.committed();
                        self.live.file_done();
                        self.ctrl_w.queue(&Message::FileDone { file });
                    }
                    self.ctrl_w.flush().await?;
                }
                e = stopped(&mut self.stop) => return Err(e),
                Some((i, stream)) = recv_or_pending(&mut arrivals.joined) => {
                    if let Some(g) = &self.growth {
                        (g.setup)(i as usize, &stream)?;
                    }
                    tasks.spawn(self.channel(shared, events_tx, work, i as usize, stream).run());
                }
                Some(r) = tasks.join_next() => {
                    channel_ended(r)?;
                    return Err(Error::PeerVanished);
                }
                // Waiting on itself, it tells the sender, whose own watch would end the session.
                _ = tokio::time::sleep_until(keepalive_due), if busy_here => {
                    self.keep_alive().await?;
                }
                _ = tokio::time::sleep_until(idle.check_at()) => {
                    // Waiting for our own budget or commits is not the peer's silence.
                    idle.check(tokio::time::Instant::now(), self.live.total(), busy_here)?;
                }
            }
            // Every other branch was the peer's doing or this end's own work, which may take
            // long (a resumed file's blocks hashed again for its plan): the silence counts
            // from its end.
            idle.heard(tokio::time::Instant::now());
        }
        let scope = match &self.sink {
            Sink::Files(dest) => dest.scope().clone(),
            Sink::Discard => Scope::Local,
        };
        self.keeping_alive(finish_dirs(scope, dirs)).await??;
        self.ctrl_w.send(&Message::Finished).await?;
        out.verified = true;
        Ok(out)
    }

    /// Stops reading at the end of a timed bench ([`Message::TimeUp`]): the channels close
    /// (unread data resets them, so the sender's sockets drop what they still hold), and the
    /// sender learns what arrived on each.
    async fn halt(&mut self, tasks: &mut JoinSet<Result<()>>) -> Result<()> {
        tasks.shutdown().await;
        let received = self.live.channel_bytes();
        self.ctrl_w.send(&Message::Halted { received }).await
    }

    /// Handles a verdict: a complete file joins the next group to commit; damaged blocks are
    /// asked for again.
    async fn act(
        &mut self,
        shared: &Arc<Mutex<Shared>>,
        file: u32,
        verdict: Verdict,
        verified: &mut Vec<u32>,
        out: &mut SideOutcome,
    ) -> Result<()> {
        match verdict {
            Verdict::Pending => {}
            Verdict::Complete { .. } => verified.push(file),
            Verdict::Resend(blocks) => {
                // Held blocks the seal refused come again: not resumed after all.
                let back = lock(shared).tracker.take_unresumed(file);
                out.bytes_resumed = out.bytes_resumed.saturating_sub(back);
                self.live.expect_more(back);
                for block in blocks {
                    out.blocks_resent += 1;
                    self.ctrl_w.send(&Message::Nack { file, block }).await?;
                }
            }
        }
        Ok(())
    }

    /// Handles every verdict the channels have already made, so that the files they complete
    /// join the same group commit.
    async fn act_on_ready(
        &mut self,
        shared: &Arc<Mutex<Shared>>,
        events: &mut mpsc::UnboundedReceiver<(u32, Verdict)>,
        verified: &mut Vec<u32>,
        out: &mut SideOutcome,
    ) -> Result<()> {
        while let Ok((file, verdict)) = events.try_recv() {
            self.act(shared, file, verdict, verified, out).await?;
        }
        Ok(())
    }

    /// When the sender is next owed a word, should this end still be waiting on itself:
    /// [`KEEPALIVE`] after anything last went to it.
    fn keepalive_due(&self) -> tokio::time::Instant {
        self.ctrl_w.written_at() + KEEPALIVE
    }

    /// Tells the sender this end is still there (an empty plan), so that its idle watch
    /// waits too.
    async fn keep_alive(&mut self) -> Result<()> {
        self.ctrl_w.send(&Message::Plan { files: Vec::new() }).await
    }

    /// Awaits `work` of this end's own, telling the sender that it is still there whenever
    /// it is due.
    async fn keeping_alive<T>(&mut self, work: impl std::future::Future<Output = T>) -> Result<T> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return Ok(done),
                _ = tokio::time::sleep_until(self.keepalive_due()) => self.keep_alive().await?,
            }
        }
    }

    /// Plans at once the files of `entries`, which the sender sends without waiting for
    /// their plans: each must be new here (nothing to skip or resume, as the client found
    /// before asking). Wakes the channels holding blocks for them; returns how many files
    /// there were.
    async fn plan_unplanned(
        &mut self,
        shared: &Arc<Mutex<Shared>>,
        work: &FileWork,
        entries: Vec<Entry>,
        dirs: &mut DirsToFinish,
        out: &mut SideOutcome,
    ) -> Result<u64> {
        let files: Vec<String> = entries
            .iter()
            .filter(|e| e.kind != EntryKind::Dir)
            .map(|e| e.path.clone())
            .collect();
        if entries.is_empty() {
            return Ok(0);
        }
        let slots = self
            .keeping_alive(slots_for(self.budget.clone(), files.len() as u32))
            .await?;
        let plans = self.plan(shared, work, entries, dirs, out, slots).await?;
        for (plan, path) in plans.iter().zip(&files) {
            if plan.action != (PlanAction::Send { have: Vec::new() }) {
                return Err(DestError::AppearedMeanwhile(path.clone()).into());
            }
        }
        let mut s = lock(shared);
        s.unplanned_left -= files.len() as u32;
        s.planned.notify_waiters();
        Ok(files.len() as u64)
    }

    /// Decides what to do with each entry of a manifest chunk (creating directories and
    /// opening partial files as file work) and registers the files to receive, each
    /// file written with one of `slots` (those not used go back to the budget).
    async fn plan(
        &mut self,
        shared: &Arc<Mutex<Shared>>,
        work: &FileWork,
        entries: Vec<Entry>,
        dirs: &mut DirsToFinish,
        out: &mut SideOutcome,
        mut slots: Option<OwnedSemaphorePermit>,
    ) -> Result<Vec<FilePlan>> {
        let (sink, bs, key) = (self.sink.clone(), self.block_size, self.digest_key);
        // Resumed files' kept blocks are hashed again here: minutes for a large one.
        let prepared = work.run("planning the files", move || {
            prepare_chunk(&sink, entries, bs, &key)
        });
        let prepared = self.keeping_alive(prepared).await???;
        let mut plans = Vec::new();
        let mut s = lock(shared);
        for (entry, target, prep) in prepared {
            let EntryKind::File { size } = entry.kind else {
                dirs.add(target, entry);
                continue;
            };
            out.files += 1;
            let action = match prep {
                Some(Prepared::Skip) => {
                    s.tracker.skip(entry.id)?;
                    out.files_skipped += 1;
                    out.bytes_skipped += size;
                    self.live.file_done();
                    PlanAction::Skip
                }
                Some(Prepared::Write { file, have }) => {
                    let have_bytes = blocks::held_bytes(size, bs, have.iter().map(|h| h.0));
                    out.bytes_resumed += have_bytes;
                    self.live.expect_more(size.saturating_sub(have_bytes));
                    s.tracker.expect(entry.id, size, &have)?;
                    if let Some(slot) = slots.as_mut().and_then(|s| s.split(1)) {
                        s.slots.insert(entry.id, slot);
                    }
                    s.targets.insert(entry.id, Arc::new(Target::Partial(file)));
                    PlanAction::Send {
                        have: have.iter().map(|h| h.0).collect(),
                    }
                }
                None => {
                    self.live.expect_more(size);
                    s.tracker.expect(entry.id, size, &[])?;
                    let t = match &self.sink {
                        Sink::Files(Destination {
                            layout: Layout::Stream(p),
                            ..
                        }) => Target::Stream(OrderedSink::new(
                            StreamSink::open(p)
                                .map_err(Error::io(format!("opening {}", p.display())))?,
                        )),
                        _ => Target::Discard,
                    };
                    s.targets.insert(entry.id, Arc::new(t));
                    PlanAction::Send { have: vec![] }
                }
            };
            plans.push(FilePlan {
                file: entry.id,
                action,
            });
        }
        Ok(plans)
    }
}

/// Commits a group of verified files on a file thread (see [`crate::fsio::partial::commit_group`]);
/// gives back their ids.
async fn commit_group(
    work: FileWork,
    shared: Arc<Mutex<Shared>>,
    files: Vec<u32>,
    crash_at: Option<CommitStep>,
) -> Result<Vec<u32>> {
    let targets: Vec<Arc<Target>> = {
        let s = lock(&shared);
        files
            .iter()
            .filter_map(|f| s.targets.get(f).cloned())
            .collect()
    };
    work.run("committing files", move || {
        let partials: Vec<&PartialFile> = targets
            .iter()
            .filter_map(|t| match &**t {
                Target::Partial(p) => Some(&**p),
                _ => None,
            })
            .collect();
        partials::commit_group(&partials, |step| crash_before(step, crash_at))
            .map_err(|(target, e)| Error::io(format!("committing {}", target.display()))(e))?;
        Ok(files)
    })
    .await?
}

/// Queues a manifest chunk of `files` files for planning, in parts of at most `most` files
/// (a budget's capacity), each with its file count.
fn queue_in_parts(
    waiting: &mut VecDeque<(Vec<Entry>, u64)>,
    mut entries: Vec<Entry>,
    mut files: u64,
    most: u64,
) {
    while files > most {
        let (part, rest) = split_after_files(entries, most as usize);
        waiting.push_back((part, most));
        (entries, files) = (rest, files - most);
    }
    waiting.push_back((entries, files));
}

/// A wait for a manifest chunk's slots.
type SlotsWait =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<OwnedSemaphorePermit>> + Send>>;

/// Slots for `files` files from `budget`; none without a budget.
async fn slots_for(budget: Option<FileBudget>, files: u32) -> Option<OwnedSemaphorePermit> {
    match budget {
        Some(b) => Some(b.take(files).await),
        None => None,
    }
}

/// The crash test's hook: dies like a power cut (no destructors, no flushes) at `crash_at`.
fn crash_before(step: CommitStep, crash_at: Option<CommitStep>) {
    if crash_at == Some(step) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGKILL);
    }
}

type PreparedEntry = (Entry, PathBuf, Option<Prepared>);

/// Filesystem work for one manifest chunk: `None` means "stream or discard, nothing to open".
fn prepare_chunk(
    sink: &Sink,
    entries: Vec<Entry>,
    bs: u32,
    key: &DigestKey,
) -> Result<Vec<PreparedEntry>> {
    let Sink::Files(dest) = sink else {
        return Ok(entries
            .into_iter()
            .map(|e| (e, PathBuf::new(), None))
            .collect());
    };
    let mut out = Vec::with_capacity(entries.len());
    let mut dirs = OpenDir::default();
    let mut targets = Targets::new(dest);
    for e in entries {
        let target = targets.target(&e.path)?;
        let prep = match e.kind {
            EntryKind::Dir => {
                dest.make_dir(&target)?;
                None
            }
            EntryKind::File { .. } if matches!(dest.layout, Layout::Stream(_)) => None,
            EntryKind::File { size } => {
                let meta = FileMeta {
                    size,
                    mode: e.mode,
                    mtime_ns: e.mtime_ns,
                };
                let p = prepare_in(&mut dirs, dest.scope(), &target, meta, bs, key)
                    .map_err(Error::io(format!("creating {}", target.display())))?;
                Some(p)
            }
        };
        out.push((e, target, prep));
    }
    Ok(out)
}

/// How long a session that ends waits for file jobs to let go of its unfinished files.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Closes the files a session leaves unfinished, on a file thread, once no job holds them
/// (up to [`RELEASE_WAIT`]); returns how many a job still held then (those close when it
/// lets go).
///
/// A part file stays locked until it is closed, and closing one first syncs its data so that
/// its journal stays true for a resume: an `fdatasync`, seconds on a slow disk. A block write
/// or commit queued on the session's [`FileWork`], or a channel task its failure aborted but
/// that still runs, can hold a file when the session ends. The session used to wait only
/// until they had let go, and whichever let go last closed the file while the session had
/// already ended: the same copy run again at once (after a server's stop, say) was refused
/// with "being received by another transfer" (a CI run). Here the session holds the last
/// reference and ends once the files are closed. `slow` is a test fault: each close takes
/// that much longer.
async fn close_unfinished(
    unfinished: Vec<Arc<Target>>,
    work: &FileWork,
    slow: Option<Duration>,
) -> usize {
    if unfinished.is_empty() {
        return 0;
    }
    let held_by_jobs = |u: &[Arc<Target>]| u.iter().filter(|t| Arc::strong_count(t) > 1).count();
    let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
    while held_by_jobs(&unfinished) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = held_by_jobs(&unfinished);
    let closing = work.run("closing the unfinished files", move || {
        for t in unfinished {
            if let Some(d) = slow {
                std::thread::sleep(d);
            }
            drop(t);
        }
    });
    if let Err(e) = closing.await {
        tracing::warn!("{e}");
    }
    held
}

/// The directories a transfer created or reached, whose modes and times are set at its end.
/// One listed again (a peer may repeat entries) replaces its first listing: it costs no
/// more memory.
#[derive(Default)]
struct DirsToFinish(HashMap<PathBuf, Entry>);

impl DirsToFinish {
    fn add(&mut self, target: PathBuf, entry: Entry) {
        self.0.insert(target, entry);
    }

    /// Deepest first: setting a directory's time after its subdirectories' keeps it.
    fn deepest_first(self) -> Vec<(PathBuf, Entry)> {
        let mut dirs: Vec<_> = self.0.into_iter().collect();
        dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
        dirs
    }
}

/// Applies directory modes and mtimes after their contents are in place, deepest first,
/// through each directory opened `O_NOFOLLOW` (below the root, when confined): a directory
/// swapped for a symlink is passed over, never changed through the link.
async fn finish_dirs(scope: Scope, dirs: DirsToFinish) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        for (p, e) in dirs.deepest_first() {
            use std::os::unix::fs::PermissionsExt;
            let ctx = || format!("setting attributes of {}", p.display());
            let f = match scope.open_dir(&p, false) {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => continue,
                Err(e) => return Err(Error::io(ctx())(e)),
            };
            let mode = crate::fsio::masked_mode(e.mode);
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(Error::io(ctx()))?;
            f.set_modified(ns_to_system_time(e.mtime_ns))
                .map_err(Error::io(ctx()))?;
        }
        Ok(())
    })
    .await
    .map_err(Error::task("setting directory modes and times"))?
}

fn lock(s: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().expect("receiver state lock")
}

struct ChannelReceiver {
    index: usize,
    stream: Stream,
    shared: Arc<Mutex<Shared>>,
    events: mpsc::UnboundedSender<(u32, Verdict)>,
    work: FileWork,
    live: Arc<LiveStats>,
    key: DigestKey,
    slow_writes: Option<Duration>,
    memory: BlockMemory,
    block_size: u32,
}

impl ChannelReceiver {
    async fn run(mut self) -> Result<()> {
        while let Some(h) = read_header(&mut self.stream).await? {
            let (block, target) = self.placed(&h).await?;
            let stream = target.as_deref().and_then(|t| match t {
                Target::Stream(s) => Some(s),
                _ => None,
            });
            if let Some(s) = stream {
                let limit = hold_limit(self.block_size, self.live.channel_count());
                s.turn(h.offset, limit, hard_limit(limit)).await?;
            }
            let mut buf = self.memory.take(h.len).await;
            let (live, index) = (&self.live, self.index);
            let memory = &self.memory;
            let got = read_payload(
                &mut self.stream,
                h.len,
                &mut buf,
                &self.key,
                || memory.contended(),
                |n| live.add(index, n),
            )
            .await?;
            // A block no longer wanted (a duplicate, or for a committed file) is dropped even if
            // damaged: asking for it again would be a request for a finished file.
            let verdict = if !lock(&self.shared).tracker.wants(h.file, block) {
                Verdict::Pending
            } else if !got.intact {
                if let Some(s) = stream {
                    s.asked_again(h.offset);
                }
                Verdict::Resend(vec![block])
            } else {
                if let Some(t) = target.filter(|t| !matches!(**t, Target::Discard)) {
                    write_target(
                        &self.work,
                        t,
                        (h.offset, block),
                        buf,
                        got.digest,
                        self.slow_writes,
                    )
                    .await?;
                }
                lock(&self.shared)
                    .tracker
                    .on_block(h.file, block, got.digest)
            };
            if verdict != Verdict::Pending {
                let _ = self.events.send((h.file, verdict));
            }
        }
        Ok(())
    }

    /// The block index of a block and its file's target. A block of a file sent before its
    /// plan may overtake the manifest that announces it: while such files are still to be
    /// planned, a block of a file not tracked yet waits for them.
    async fn placed(&self, h: &BlockHeader) -> Result<(u64, Option<Arc<Target>>)> {
        loop {
            let planned = {
                let s = lock(&self.shared);
                if s.unplanned_left == 0 || s.tracker.tracks(h.file) {
                    let block = s.tracker.check(h)?;
                    return Ok((block, s.targets.get(&h.file).cloned()));
                }
                s.planned.clone()
            };
            let woken = planned.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Looked at again once registered, so that a wake-up in between is not missed.
            let ready = {
                let s = lock(&self.shared);
                s.unplanned_left == 0 || s.tracker.tracks(h.file)
            };
            if !ready {
                woken.await;
            }
        }
    }
}

/// Writes a checked block to its file (on a file thread) and journals it; its buffer goes back
/// to the block memory once written.
async fn write_target(
    work: &FileWork,
    t: Arc<Target>,
    (offset, block): (u64, u64),
    payload: BlockBuffer,
    digest: Digest,
    slow: Option<Duration>,
) -> Result<()> {
    work.run("writing a block", move || {
        if let Some(d) = slow {
            std::thread::sleep(d);
        }
        match &*t {
            Target::Partial(p) => {
                let ctx = || format!("writing {}", p.target().display());
                p.write_block(offset, &payload)
                    .and_then(|_| p.record(block, &digest))
                    .map_err(Error::io(ctx()))
            }
            Target::Stream(s) => s
                .write_block(offset, &payload)
                .map_err(Error::io("writing to the output stream")),
            Target::Discard => Ok(()),
        }
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory listed over and over is kept once, as last listed, and deeper
    /// directories are finished before the ones that hold them.
    #[test]
    fn a_directory_listed_again_is_kept_once() {
        let dir = |path: &str, mtime_ns: i64| Entry {
            id: 0,
            path: path.into(),
            mode: 0o755,
            mtime_ns,
            kind: EntryKind::Dir,
        };
        let mut dirs = DirsToFinish::default();
        dirs.add("/d/a".into(), dir("a", 1));
        for t in 0..1000 {
            dirs.add("/d/a/b".into(), dir("a/b", t));
        }
        let finished: Vec<(PathBuf, i64)> = dirs
            .deepest_first()
            .into_iter()
            .map(|(p, e)| (p, e.mtime_ns))
            .collect();
        assert_eq!(
            finished,
            [("/d/a/b".into(), 999), ("/d/a".into(), 1)],
            "one entry each, the deepest first"
        );
    }
}
