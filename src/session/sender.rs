//! The sending engine: announces the manifest, feeds blocks to whichever data channel is
//! ready (work stealing: a slow channel simply takes fewer blocks), seals files with their
//! block digests, re-sends what the receiver asks for, and finishes when every file is
//! committed at the other end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::engine::{channel_ended, conclude, stopped, StopWatch};
use super::faults::FaultInjection;
use super::fswork::FileWork;
use super::growth::{ask_for_channels, recv_or_pending, Arrivals, Growth};
use super::idle::{IdleWatch, SENDER_IDLE};
use super::jobs::{job_queue, JobReceiver, JobSender};
use super::report::{LiveStats, SideOutcome};
use super::source::{read_file_block, BlockReader, SendSource, WriteRate};
use super::wire::{write_block, ControlReader, ControlWriter, Damage, Digesting};
use crate::channels::control::{FilePlan, Message, PlanAction};
use crate::channels::frame::{BlockCheck, BlockHeader, DigestKey};
use crate::channels::manifest::EntryKind;
use crate::channels::sender::{Job, SendPlanner};
use crate::channels::{Digest, Violation};
use crate::error::{Error, Result};
use crate::transport::tcp::push_pending;
use crate::transport::tls::Stream;

/// Most telemetry batches a sending server forwards at one tick of its report interval (a
/// second at most while tracing): 32,768 trace samples, 320 rows sampled every 10 ms.
const BATCHES_PER_TICK: usize = 2;

struct Hashed {
    file: u32,
    block: u64,
    digest: Digest,
}

/// Everything a sending engine needs.
pub struct SendEngine<R, W> {
    /// Control connection, read half.
    pub ctrl_r: ControlReader<R>,
    /// Control connection, write half.
    pub ctrl_w: ControlWriter<W>,
    /// Data channels, in index order.
    pub channels: Vec<Stream>,
    /// Start offset of each channel (staggered starts); missing entries start at once.
    pub stagger: Vec<Duration>,
    /// How many channels take blocks, the first ones (the online tuner's: one while its
    /// meter runs, all once released, fewer after it retired added channels); the others
    /// wait. The engine lets them all go when the session ends.
    pub gate: Option<Arc<watch::Sender<u16>>>,
    /// What to send.
    pub source: SendSource,
    /// Block size of the session.
    pub block_size: u32,
    /// Counters.
    pub live: Arc<LiveStats>,
    /// Key of the block digests.
    pub digest_key: DigestKey,
    /// Test-only damage.
    pub faults: FaultInjection,
    /// Forward telemetry to the peer at this interval (a sending server).
    pub forward_telemetry: Option<Duration>,
    /// Channels the online tuner adds while the session runs.
    pub growth: Option<Growth>,
    /// A server's stop: the session ends, telling the peer why (`None` for a client).
    pub stop: Option<StopWatch>,
    /// How long the peer may be silent ([`super::idle::SESSION_IDLE`] unless a server sets
    /// another).
    pub idle: Duration,
    /// The manifest announced before the engine started (a client sends its first pieces
    /// with its request); `None` to start from nothing.
    pub announced: Option<Announced>,
}

/// The manifest a sending end has announced: the planner that follows its files, and how
/// many it named. A pushing client announces the first pieces right after its request, so
/// the receiver's plan for them comes back while the data channels join, a round trip
/// sooner.
pub struct Announced {
    planner: SendPlanner,
    files: u64,
    rate: WriteRate,
    /// Files still to be announced that go out without waiting for their plans.
    unplanned: u32,
    /// The jobs of such files, for the channels.
    unplanned_jobs: Vec<Job>,
}

impl Announced {
    /// Nothing announced yet, for blocks of `block_size`.
    pub fn new(block_size: u32) -> Self {
        Announced {
            planner: SendPlanner::new(block_size),
            files: 0,
            rate: WriteRate::default(),
            unplanned: 0,
            unplanned_jobs: Vec::new(),
        }
    }

    /// Sends the first `files` files announced as if the receiver had planned them "send
    /// all", without waiting for its plans: a pulling client whose destination holds
    /// nothing to skip or resume asks for it (`Operation::Pull`'s `unplanned_files`).
    pub fn unplanned(mut self, files: u32) -> Self {
        self.unplanned = files;
        self
    }

    /// The jobs of the files [`Announced::take_ready`] sent without plans.
    pub fn take_unplanned_jobs(&mut self) -> Vec<Job> {
        std::mem::take(&mut self.unplanned_jobs)
    }

    /// Every manifest piece `source` has ready now (it keeps a window of unfinished files),
    /// counted into the planner and `live`'s expected bytes; the messages to send, in order.
    pub fn take_ready(&mut self, source: &mut SendSource, live: &LiveStats) -> Vec<Message> {
        let written = live.total();
        let rate = self.rate.observe(live.elapsed(), written);
        let mut ready = Vec::new();
        while let Some((entries, last)) = source.next_chunk(
            self.planner.unfinished() as u64,
            live.expected().saturating_sub(written),
            rate,
        ) {
            for e in &entries {
                if let EntryKind::File { size } = e.kind {
                    self.files += 1;
                    live.expect_more(size);
                }
            }
            self.planner.announce(&entries, last);
            let first_files: Vec<u32> = entries
                .iter()
                .filter(|e| matches!(e.kind, EntryKind::File { .. }))
                .take(self.unplanned as usize)
                .map(|e| e.id)
                .collect();
            ready.push(Message::Manifest { entries, last });
            for file in first_files {
                self.unplanned -= 1;
                let send_all = FilePlan {
                    file,
                    action: PlanAction::Send { have: Vec::new() },
                };
                let (jobs, seal) = self
                    .planner
                    .on_plan(&send_all)
                    .expect("a file just announced takes its first plan");
                self.unplanned_jobs.extend(jobs);
                ready.extend(seal);
            }
        }
        ready
    }
}

/// What every channel task of a session shares: where blocks come from and where their
/// digests go.
struct Crew {
    jobs: JobReceiver,
    hashed: mpsc::UnboundedSender<Hashed>,
    sent_blocks: Arc<AtomicU64>,
    work: FileWork,
    /// Turns true when no block is left to send: a channel whose staggered start is still
    /// ahead then ends at once instead of holding the session's end until its start.
    ended: watch::Receiver<bool>,
    /// When the data phase began on `live`'s clock, seconds: a client's clock runs from
    /// before its set-up (the walk of its tree, the handshakes), and channels' start times
    /// count from the data phase.
    began_s: f64,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> SendEngine<R, W> {
    /// How far the receiver has come taking blocks: bytes of whole blocks written, and bytes
    /// its kernel acknowledged (which move during a large block on a slow path, and stop when
    /// it reads nothing and its window closes).
    fn progress(&self) -> u64 {
        let acked: u64 = (self.live.telemetry.latest().iter().flatten())
            .map(|s| s.tcp.bytes_acked)
            .sum();
        self.live.total() + acked
    }

    fn channel(&self, crew: &Crew, index: usize, stream: Stream) -> ChannelSender {
        ChannelSender {
            index,
            start_at: tokio::time::Instant::now(),
            ended: crew.ended.clone(),
            began_s: crew.began_s,
            gate: self.gate.as_ref().map(|g| g.subscribe()),
            stream,
            jobs: crew.jobs.clone(),
            reader: self.source.reader(),
            work: crew.work.clone(),
            hashed: crew.hashed.clone(),
            live: self.live.clone(),
            faults: self.faults,
            key: self.digest_key,
            sent_blocks: crew.sent_blocks.clone(),
            pattern_digests: Vec::new(),
        }
    }

    /// Runs the session to completion; on failure tells the peer why before returning.
    pub async fn run(mut self) -> Result<SideOutcome> {
        let (jobs_tx, jobs_rx) = job_queue();
        let (hashed_tx, hashed_rx) = mpsc::unbounded_channel();
        let (ended_tx, ended_rx) = watch::channel(false);
        let crew = Crew {
            jobs: jobs_rx,
            hashed: hashed_tx,
            sent_blocks: Arc::new(AtomicU64::new(0)),
            work: FileWork::per_core(),
            ended: ended_rx,
            began_s: self.live.elapsed(),
        };
        let mut tasks = JoinSet::new();
        let began = tokio::time::Instant::now();
        for (i, stream) in std::mem::take(&mut self.channels).into_iter().enumerate() {
            let mut ch = self.channel(&crew, i, stream);
            ch.start_at = began + self.stagger.get(i).copied().unwrap_or_default();
            tasks.spawn(ch.run());
        }
        let mut result = self.drive(&jobs_tx, hashed_rx, &crew, &mut tasks).await;
        // Closing the queue (and letting the channels held go) lets the channel tasks finish
        // and shut their streams down.
        jobs_tx.close();
        ended_tx.send_replace(true);
        if let Some(g) = &self.gate {
            g.send_replace(u16::MAX);
        }
        // After the channels close: the receiver reads the final telemetry once its own
        // channels have ended, and a long trace's batches do not fit the socket's buffers.
        if result.is_ok() && self.forward_telemetry.is_some() {
            if let Err(e) = self.forward_telemetry(true).await {
                result = Err(e);
            }
        }
        conclude(result, &mut self.ctrl_r, &mut self.ctrl_w, tasks).await
    }

    /// Sends the telemetry gathered since the last time: at most [`BATCHES_PER_TICK`]
    /// batches of what waited when this began, so that a control connection slower than the
    /// trace holds the engine little (the samples past what waits are dropped and counted).
    /// `last`: the session's final telemetry, all of it (nothing is added to it then).
    async fn forward_telemetry(&mut self, last: bool) -> Result<()> {
        let mut batches = self.live.telemetry.batches_waiting().min(BATCHES_PER_TICK);
        loop {
            let batch = self.live.telemetry.take_batch(last);
            batches = batches.saturating_sub(1);
            let done =
                batch.last || !self.live.telemetry.more_to_forward() || !last && batches == 0;
            self.ctrl_w.send(&Message::Telemetry(batch)).await?;
            if done {
                return Ok(());
            }
        }
    }

    async fn drive(
        &mut self,
        jobs: &JobSender,
        mut hashed: mpsc::UnboundedReceiver<Hashed>,
        crew: &Crew,
        tasks: &mut JoinSet<Result<()>>,
    ) -> Result<SideOutcome> {
        let mut announced = self
            .announced
            .take()
            .unwrap_or_else(|| Announced::new(self.block_size));
        let mut out = SideOutcome::default();
        let mut done = 0u64;
        let mut arrivals = Arrivals::take(&mut self.growth);
        // A trace is forwarded at least every second, so that what waits stays small.
        let period = match self.forward_telemetry {
            Some(p) if self.live.telemetry.tracing() => p.min(Duration::from_secs(1)),
            Some(p) => p,
            None => Duration::from_secs(3600),
        };
        let mut report = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let time_up = self.source.time_up_at().map(tokio::time::Instant::from_std);
        // The receiver's word that its files and directories are all in place.
        let mut receiver_finished = false;
        let now = tokio::time::Instant::now();
        let mut idle = IdleWatch::new(now, self.progress(), self.idle, SENDER_IDLE);
        loop {
            for piece in announced.take_ready(&mut self.source, &self.live) {
                self.ctrl_w.send(&piece).await?;
            }
            for j in announced.take_unplanned_jobs() {
                jobs.send(j);
            }
            let planner = &mut announced.planner;
            if receiver_finished {
                break;
            }
            tokio::select! {
                msg = self.ctrl_r.expect() => {
                    // Any word from the receiver; an empty plan is one waiting on itself
                    // (`idle::KEEPALIVE`).
                    idle.heard(tokio::time::Instant::now());
                    match msg? {
                        Message::Plan { files } => {
                            for p in files {
                                let had = planner.skipped_bytes() + planner.resumed_bytes();
                                let (todo, seal) = planner.on_plan(&p)?;
                                // Announced in full; what the receiver has is not carried.
                                self.live.expect_less(
                                    planner.skipped_bytes() + planner.resumed_bytes() - had,
                                );
                                if p.action == PlanAction::Skip {
                                    self.live.file_done();
                                }
                                for j in todo {
                                    jobs.send(j);
                                }
                                for s in seal {
                                    self.ctrl_w.queue(&s);
                                }
                            }
                            self.ctrl_w.flush().await?;
                        }
                        Message::Nack { file, block } => {
                            out.blocks_resent += 1;
                            let had = planner.resumed_bytes();
                            let again = planner.on_nack(file, block)?;
                            // A held block asked for again is carried after all.
                            self.live.expect_more(had - planner.resumed_bytes());
                            jobs.send_again(again);
                        }
                        Message::FileDone { file } => {
                            planner.on_done(file)?;
                            done += 1;
                            self.live.file_done();
                        }
                        Message::Finished if planner.finished() => receiver_finished = true,
                        Message::OpenChannels { first, count } => match &self.growth {
                            Some(g) => g.connect(first, count)?,
                            None => return Err(Violation("unasked OpenChannels".into()).into()),
                        },
                        Message::Abort { message, transient } => {
                            return Err(Error::PeerAborted { message, transient })
                        }
                        other => return Err(Violation(format!("unexpected {other:?}")).into()),
                    }
                }
                Some(count) = recv_or_pending(&mut arrivals.requests) => {
                    if let Some(open) = ask_for_channels(self.growth.as_ref(), count) {
                        self.ctrl_w.send(&open).await?;
                    }
                }
                Some((i, stream)) = recv_or_pending(&mut arrivals.joined) => {
                    if let Some(g) = &self.growth {
                        (g.setup)(i as usize, &stream)?;
                    }
                    tasks.spawn(self.channel(crew, i as usize, stream).run());
                }
                h = hashed.recv() => match h {
                    // The digests already waiting go with it: their seals leave together. Blocks
                    // hashed are this end's own work (kept blocks of a resume are only hashed):
                    // not a silence.
                    Some(h) => {
                        idle.heard(tokio::time::Instant::now());
                        let mut next = Some(h);
                        while let Some(h) = next {
                            for seal in planner.on_hashed(h.file, h.block, h.digest)? {
                                self.ctrl_w.queue(&seal);
                            }
                            next = hashed.try_recv().ok();
                        }
                        self.ctrl_w.flush().await?;
                    }
                    None => return Err(Error::PeerVanished),
                },
                Some(r) = tasks.join_next() => {
                    channel_ended(r)?;
                    return Err(Error::PeerVanished);
                }
                e = stopped(&mut self.stop) => return Err(e),
                _ = report.tick(), if self.forward_telemetry.is_some() => {
                    self.forward_telemetry(false).await?;
                }
                _ = tokio::time::sleep_until(idle.check_at()) => {
                    idle.check(tokio::time::Instant::now(), self.progress(), false)?;
                }
                _ = sleep_until_some(time_up) => {
                    self.end_at_time(crew, tasks).await?;
                    out.files = done;
                    out.verified = true;
                    return Ok(out);
                }
            }
        }
        out.files = announced.files;
        out.bytes_skipped = announced.planner.skipped_bytes();
        out.bytes_resumed = announced.planner.resumed_bytes();
        out.files_skipped = announced.files - done;
        out.verified = true;
        Ok(out)
    }

    /// Ends a timed bench at its time ([`Message::TimeUp`]): no more blocks go out, and
    /// once the receiver has stopped reading, the channels close with whatever their
    /// sockets still hold. The counters take what the receiver read, not what was written.
    async fn end_at_time(&mut self, crew: &Crew, tasks: &mut JoinSet<Result<()>>) -> Result<()> {
        crew.jobs.clear();
        self.ctrl_w.send(&Message::TimeUp).await?;
        let deadline = tokio::time::Instant::now() + self.idle;
        let received = loop {
            tokio::select! {
                msg = self.ctrl_r.expect() => match msg? {
                    Message::Halted { received } => break received,
                    Message::Abort { message, transient } => {
                            return Err(Error::PeerAborted { message, transient })
                        }
                    // Sent before the receiver saw the end: nothing is owed any more.
                    _ => {}
                },
                // The receiver closes its channels when it stops reading: they may end first.
                Some(_) = tasks.join_next() => {}
                e = stopped(&mut self.stop) => return Err(e),
                _ = tokio::time::sleep_until(deadline) => return Err(Error::Timeout(SENDER_IDLE)),
            }
        };
        tasks.shutdown().await;
        self.live.settle(&received, self.block_size.into());
        Ok(())
    }
}

/// Resolves at `at`, or never without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

struct ChannelSender {
    index: usize,
    start_at: tokio::time::Instant,
    ended: watch::Receiver<bool>,
    began_s: f64,
    gate: Option<watch::Receiver<u16>>,
    stream: Stream,
    jobs: JobReceiver,
    reader: BlockReader,
    work: FileWork,
    hashed: mpsc::UnboundedSender<Hashed>,
    live: Arc<LiveStats>,
    faults: FaultInjection,
    key: DigestKey,
    sent_blocks: Arc<AtomicU64>,
    /// Digests of a bench's pattern by length ([`pattern_digest`]).
    pattern_digests: Vec<(usize, Digest)>,
}

/// The digest of `data`, a prefix of a bench's pattern, hashed once per length: every block
/// of a bench carries the same bytes, and hashing them again at the sender was a fifth of
/// both ends' cycles in a loopback bench (the receiver still hashes every block on arrival).
fn pattern_digest(known: &mut Vec<(usize, Digest)>, key: &DigestKey, data: &[u8]) -> Digest {
    if let Some((_, d)) = known.iter().find(|(len, _)| *len == data.len()) {
        return *d;
    }
    let d = BlockCheck::of(key, data);
    // A bench's blocks have the session's block size, and a file's last block one other.
    if known.len() < 4 {
        known.push((data.len(), d));
    }
    d
}

impl ChannelSender {
    /// Waits while the gate holds this channel (the meter runs on the first, or the tuner
    /// retired it): it takes no block meanwhile, and the others take them all.
    async fn wait_for_turn(&mut self) {
        let index = self.index;
        if let Some(g) = self.gate.as_mut() {
            let _ = g.wait_for(|running| index < *running as usize).await;
        }
    }

    /// Waits for this channel's staggered start, or only until the session has nothing
    /// left to send: then the queue is closed and the channel ends at once.
    async fn wait_for_start(&mut self) {
        tokio::select! {
            _ = tokio::time::sleep_until(self.start_at) => {}
            _ = self.ended.wait_for(|ended| *ended) => {}
        }
    }

    async fn run(mut self) -> Result<()> {
        let mut buf = Vec::new();
        self.wait_for_start().await;
        let mut started = false;
        loop {
            self.wait_for_turn().await;
            let Some(job) = self.jobs.next().await else {
                break;
            };
            if let (0, Some(d)) = (self.index, self.faults.slow_first_channel) {
                tokio::time::sleep(d).await;
            }
            if !started {
                started = true;
                self.live
                    .telemetry
                    .mark_started(self.index, self.live.elapsed() - self.began_s);
            }
            let data: &[u8] = match &self.reader {
                BlockReader::Pattern(p) => &p[..job.len as usize],
                BlockReader::Tree(t) => {
                    let (b, r) =
                        read_file_block(&self.work, t.clone(), job.file, job.offset, job.len, buf)
                            .await;
                    buf = b;
                    r?;
                    &buf
                }
            };
            let digest = if job.send {
                let n = self.sent_blocks.fetch_add(1, Ordering::Relaxed);
                let damage = if self.faults.corrupt_on_wire == Some(n) {
                    Damage::OnWire
                } else if self.faults.corrupt_past_check == Some(n) {
                    Damage::PastCheck
                } else {
                    Damage::None
                };
                let header = BlockHeader {
                    file: job.file,
                    offset: job.offset,
                    len: job.len,
                };
                let digesting = match (&self.reader, damage) {
                    (BlockReader::Pattern(_), Damage::None) => {
                        Digesting::Known(pattern_digest(&mut self.pattern_digests, &self.key, data))
                    }
                    _ => Digesting::Hash(&self.key),
                };
                let d = write_block(&mut self.stream, &header, data, digesting, damage).await?;
                if self.jobs.is_empty() {
                    // Nothing queued behind it: its last short segment goes now.
                    push_pending(self.stream.tcp())
                        .map_err(Error::io("pushing a block out (TCP_NODELAY)"))?;
                }
                self.live.add(self.index, data.len() as u64);
                d
            } else {
                BlockCheck::of(&self.key, data)
            };
            let h = Hashed {
                file: job.file,
                block: job.block,
                digest,
            };
            if self.hashed.send(h).is_err() {
                break;
            }
        }
        self.stream.shutdown().await.ok();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patterns_digests_are_those_of_its_bytes_for_every_length() {
        let key = [7u8; 32];
        let pattern: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut known = Vec::new();
        for len in [1000, 1000, 10, 1000, 999, 3, 2, 1, 0, 10] {
            let got = pattern_digest(&mut known, &key, &pattern[..len]);
            assert_eq!(got, BlockCheck::of(&key, &pattern[..len]), "length {len}");
        }
        assert_eq!(known.len(), 4, "at most four lengths are kept");
    }

    /// A pull's first files go out as planned "send all" as soon as they are announced; the
    /// receiver plans only the files after them, and a plan for one of the first is refused.
    #[test]
    fn the_first_files_announced_go_out_unplanned_and_the_rest_wait_for_plans() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("a"), vec![1u8; 10]).unwrap();
        std::fs::write(t.join("b"), b"").unwrap();
        std::fs::write(t.join("c"), vec![3u8; 10]).unwrap();
        let tree =
            crate::fsio::source::SourceTree::walk(&crate::fsio::root::Scope::Local, &[t], true)
                .unwrap();
        let mut source = SendSource::tree(tree);
        let live = LiveStats::new(1);
        let mut announced = Announced::new(4 << 20).unplanned(2);
        let ready = announced.take_ready(&mut source, &live);
        let Some(Message::Manifest { entries, .. }) = ready.first() else {
            panic!("the manifest first: {ready:?}");
        };
        let files: Vec<(u32, String)> = entries
            .iter()
            .filter(|e| e.kind != EntryKind::Dir)
            .map(|e| (e.id, e.path.clone()))
            .collect();
        assert_eq!(files.len(), 3, "{entries:?}");
        let (first, second, third) = (files[0].0, files[1].0, files[2].0);
        let jobs = announced.take_unplanned_jobs();
        let with_jobs: Vec<u32> = jobs.iter().map(|j| j.file).collect();
        let empty = files.iter().find(|(_, p)| p.ends_with('b')).unwrap().0;
        // The empty file has no block: if it is among the first two, its seal follows the
        // manifest at once; every other of the first two has its one block queued.
        for id in [first, second] {
            if id == empty {
                assert!(
                    ready[1..]
                        .iter()
                        .any(|m| matches!(m, Message::Sealed { file, .. } if *file == id)),
                    "{ready:?}"
                );
            } else {
                assert!(with_jobs.contains(&id), "{jobs:?}");
            }
        }
        assert!(!with_jobs.contains(&third), "{jobs:?}");
        let plan = |file| FilePlan {
            file,
            action: PlanAction::Send { have: vec![] },
        };
        assert!(announced.planner.on_plan(&plan(first)).is_err());
        let (third_jobs, _) = announced.planner.on_plan(&plan(third)).unwrap();
        assert_eq!(third_jobs.len(), usize::from(third != empty));
    }
}
