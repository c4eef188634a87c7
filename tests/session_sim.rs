//! Whole push sessions, sans-IO and quinn-style: a client and a server endpoint built only
//! from the protocol's state machines (handshake, control phase, send planner, receive
//! tracker, completion, restart journal) and joined by an in-memory link. The link keeps
//! each connection's bytes in order, as TCP does, but delivers them in chunks of any size,
//! interleaves the connections at random, damages bytes, and cuts connections. A session
//! that fails is followed by another, which resumes from what the server's "disk" holds,
//! until every file is there with the right bytes. The failure paths (wrong token, busy,
//! a refused request, a forged control frame, a bad join) end as the real client reports
//! them. No sockets, no files, no clock.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use hsxfer::channels::auth::{SessionId, SessionKey, TokenKey};
use hsxfer::channels::busy::{Busy, Cap};
use hsxfer::channels::control::{
    FilePlan, FrameSeal, HostFacts, Message, Operation, PlanAction, Request, Tuning, Way,
    PROTOCOL_VERSION,
};
use hsxfer::channels::frame::{BlockCheck, BlockHeader, HEADER_LEN, TRAILER_LEN};
use hsxfer::channels::handshake::{
    ClientHandshake, HandshakeError, Heard, Outcome, ServerHandshake,
};
use hsxfer::channels::journal::{self, JournalHeader};
use hsxfer::channels::manifest::{Entry, EntryKind};
use hsxfer::channels::opening::{Answer, ClientOpening, OpeningError, ServerHeard, ServerOpening};
use hsxfer::channels::receiver::{Completion, ReceiveTracker, Verdict};
use hsxfer::channels::sender::{Job, SendPlanner};
use hsxfer::channels::Digest;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BS: u32 = 4096;
const PINGS: u32 = 3;

/// Why a session ended early, on either side.
#[derive(Debug, Clone, PartialEq)]
enum Fail {
    Handshake(HandshakeError),
    Opening(OpeningError),
    /// A control frame failed its MAC or did not decode.
    Control(String),
    /// A data frame header did not decode.
    Frame(String),
    /// A well-formed message or frame impossible in the session's state.
    Violation(String),
    /// The peer closed the connection (or the link cut it).
    Vanished,
}

impl Fail {
    fn kind(&self) -> &'static str {
        match self {
            Fail::Handshake(_) => "handshake",
            Fail::Opening(_) => "opening",
            Fail::Control(_) => "control",
            Fail::Frame(_) => "frame",
            Fail::Violation(_) => "violation",
            Fail::Vanished => "vanished",
        }
    }
}

/// One direction of one connection.
#[derive(Default)]
struct Pipe {
    in_flight: VecDeque<u8>,
    arrived: Vec<u8>,
}

/// One connection: `up` carries client → server, `down` server → client.
#[derive(Default)]
struct Conn {
    up: Pipe,
    down: Pipe,
    /// Closed by an endpoint or cut by the link: nothing more moves.
    closed: bool,
}

/// What the link does to the bytes it carries, per delivered chunk.
#[derive(Clone, Copy)]
struct Faults {
    /// Chance that a chunk on a data channel has one byte flipped.
    data_flip: f64,
    /// Chance that a chunk on the control connection has one byte flipped.
    control_flip: f64,
    /// Chance, per step, that one open connection is cut.
    cut: f64,
}

const CLEAN: Faults = Faults {
    data_flip: 0.0,
    control_flip: 0.0,
    cut: 0.0,
};

/// The network: connection 0 is the control connection, the others data channels.
struct Link {
    conns: Vec<Conn>,
    faults: Faults,
}

impl Link {
    /// Moves one chunk of one connection's in-flight bytes to its far end, maybe damaged,
    /// or cuts a connection. False when nothing was in flight.
    fn step(&mut self, rng: &mut StdRng) -> bool {
        if rng.gen_bool(self.faults.cut) {
            let open: Vec<usize> = (0..self.conns.len())
                .filter(|&i| !self.conns[i].closed)
                .collect();
            if !open.is_empty() {
                self.conns[open[rng.gen_range(0..open.len())]].closed = true;
            }
        }
        let busy: Vec<(usize, bool)> = (0..self.conns.len())
            .flat_map(|i| [(i, true), (i, false)])
            .filter(|&(i, up)| {
                let c = &self.conns[i];
                !c.closed && !if up { &c.up } else { &c.down }.in_flight.is_empty()
            })
            .collect();
        let Some(&(i, up)) = busy.get(rng.gen_range(0..busy.len().max(1))) else {
            return false;
        };
        let flip = match i {
            0 => self.faults.control_flip,
            _ => self.faults.data_flip,
        };
        let c = &mut self.conns[i];
        let pipe = if up { &mut c.up } else { &mut c.down };
        let n = rng.gen_range(1..=1500).min(pipe.in_flight.len());
        let mut chunk: Vec<u8> = pipe.in_flight.drain(..n).collect();
        if rng.gen_bool(flip) {
            let at = rng.gen_range(0..chunk.len());
            chunk[at] ^= 1 << rng.gen_range(0..8);
        }
        pipe.arrived.extend(chunk);
        true
    }

    fn send(&mut self, conn: usize, up: bool, bytes: &[u8]) {
        let c = &mut self.conns[conn];
        if !c.closed {
            let pipe = if up { &mut c.up } else { &mut c.down };
            pipe.in_flight.extend(bytes);
        }
    }

    /// Bytes that arrived at the end of `conn` that reads `up` (the server) or `down`.
    fn arrived(&mut self, conn: usize, up: bool) -> &mut Vec<u8> {
        let c = &mut self.conns[conn];
        if up {
            &mut c.up.arrived
        } else {
            &mut c.down.arrived
        }
    }

    /// Closed: an endpoint that finds its connection closed after reading what arrived
    /// has met the end of the stream (mid-frame or not).
    fn gone(&self, conn: usize) -> bool {
        self.conns[conn].closed
    }
}

/// Reads every whole control frame that arrived at one end of the control connection.
fn control_messages(link: &mut Link, up: bool, seal: &mut FrameSeal) -> Result<Vec<Message>, Fail> {
    let buf = link.arrived(0, up);
    let mut out = Vec::new();
    while let Some((m, used)) = seal.open(buf).map_err(|e| Fail::Control(e.to_string()))? {
        buf.drain(..used);
        out.push(m);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The client: pushes `files`.

enum ClientPhase {
    Handshake(Box<ClientHandshake>),
    Opening(ClientOpening),
    Running,
}

struct Channel {
    conn: usize,
    join: ClientHandshake,
}

struct Client {
    token: TokenKey,
    files: Vec<Vec<u8>>,
    channels: u16,
    /// Changes the request before it is sent (for the refused-request path).
    edit_request: fn(&mut Request),
    phase: ClientPhase,
    session: Option<(SessionId, SessionKey)>,
    seals: Option<(FrameSeal, FrameSeal)>,
    pings_sent: u32,
    data: Vec<Channel>,
    planner: SendPlanner,
    jobs: VecDeque<Job>,
    resumed_blocks: u64,
}

impl Client {
    fn new(token: &[u8], files: Vec<Vec<u8>>, channels: u16) -> Self {
        let token = TokenKey::from_token(token);
        Client {
            phase: ClientPhase::Handshake(Box::new(ClientHandshake::control(
                token.clone(),
                [2; 32],
            ))),
            token,
            files,
            channels,
            edit_request: |_| {},
            session: None,
            seals: None,
            pings_sent: 0,
            data: Vec::new(),
            planner: SendPlanner::new(BS),
            jobs: VecDeque::new(),
            resumed_blocks: 0,
        }
    }

    fn finished(&self) -> bool {
        matches!(self.phase, ClientPhase::Running) && self.planner.finished()
    }

    fn send(&mut self, link: &mut Link, m: &Message) {
        let (out, _) = self.seals.as_mut().expect("a session");
        link.send(0, true, &out.seal(m));
    }

    /// Reacts to what arrived and sends at most one data block.
    fn step(&mut self, link: &mut Link, rng: &mut StdRng, now: Instant) -> Result<(), Fail> {
        if let ClientPhase::Handshake(hs) = &mut self.phase {
            let buf = link.arrived(0, false);
            let used = hs.handle(buf).map_err(Fail::Handshake)?;
            buf.drain(..used);
            let out = hs.take_output();
            link.send(0, true, &out);
            let Some(Outcome::Session { id, key }) = hs.outcome() else {
                return self.check_gone(link);
            };
            self.seals = Some((
                key.control_seal(Way::ToServer),
                key.control_seal(Way::ToClient),
            ));
            self.session = Some((id, key));
            let mut opening = ClientOpening::new();
            let ping = opening.ping(now);
            self.pings_sent = 1;
            self.phase = ClientPhase::Opening(opening);
            self.send(link, &ping);
        }
        let messages = {
            let (_, inn) = self.seals.as_mut().expect("a session");
            control_messages(link, false, inn)?
        };
        for m in messages {
            self.on_message(link, m, now)?;
        }
        self.drive_joins(link)?;
        self.send_block(link, rng)?;
        self.check_gone(link)
    }

    fn on_message(&mut self, link: &mut Link, m: Message, now: Instant) -> Result<(), Fail> {
        if let ClientPhase::Opening(opening) = &mut self.phase {
            match opening.on_message(m, now).map_err(Fail::Opening)? {
                Answer::Pong(_) if self.pings_sent < PINGS => {
                    self.pings_sent += 1;
                    let ping = opening.ping(now);
                    self.send(link, &ping);
                }
                Answer::Pong(_) => {
                    assert!(opening.best_rtt().is_some());
                    let mut req = Request {
                        version: PROTOCOL_VERSION,
                        op: Operation::Push {
                            dest: "d".into(),
                            sources: 1,
                        },
                        channels: self.channels,
                        block_size: BS,
                        tuning: Tuning::kernel_defaults(self.channels),
                    };
                    (self.edit_request)(&mut req);
                    let req = opening.request(req);
                    self.send(link, &req);
                }
                Answer::Facts(_) => unreachable!("not asked"),
                Answer::Accepted { channels, .. } => {
                    let (id, key) = self.session.clone().expect("a session");
                    for ch in 0..channels {
                        link.conns.push(Conn::default());
                        self.data.push(Channel {
                            conn: link.conns.len() - 1,
                            join: ClientHandshake::join(key.clone(), id, ch),
                        });
                    }
                    let entries = self.manifest();
                    self.planner.announce(&entries, true);
                    self.phase = ClientPhase::Running;
                    self.send(
                        link,
                        &Message::Manifest {
                            entries,
                            last: true,
                        },
                    );
                }
            }
            return Ok(());
        }
        let violation = |v: hsxfer::channels::Violation| Fail::Violation(v.0);
        match m {
            Message::Plan { files } => {
                for plan in files {
                    if let PlanAction::Send { have } = &plan.action {
                        self.resumed_blocks += have.len() as u64;
                    }
                    let (jobs, seal) = self.planner.on_plan(&plan).map_err(violation)?;
                    self.jobs.extend(jobs);
                    for m in seal {
                        self.send(link, &m);
                    }
                }
            }
            Message::Nack { file, block } => {
                let job = self.planner.on_nack(file, block).map_err(violation)?;
                self.jobs.push_back(job);
            }
            Message::FileDone { file } => self.planner.on_done(file).map_err(violation)?,
            Message::Abort { message, .. } => {
                return Err(Fail::Opening(OpeningError::Refused(message)))
            }
            other => return Err(Fail::Violation(format!("{} to a sender", other.kind()))),
        }
        Ok(())
    }

    fn manifest(&self) -> Vec<Entry> {
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| Entry {
                id: i as u32,
                path: format!("f{i}"),
                mode: 0o644,
                mtime_ns: 0,
                kind: EntryKind::File {
                    size: f.len() as u64,
                },
            })
            .collect()
    }

    fn drive_joins(&mut self, link: &mut Link) -> Result<(), Fail> {
        for ch in &mut self.data {
            if ch.join.outcome().is_some() {
                continue;
            }
            let buf = link.arrived(ch.conn, false);
            let used = ch.join.handle(buf).map_err(Fail::Handshake)?;
            buf.drain(..used);
            let out = ch.join.take_output();
            link.send(ch.conn, true, &out);
        }
        Ok(())
    }

    /// A data channel takes the next job: reads and hashes the block, and sends it unless
    /// the server holds it already.
    fn send_block(&mut self, link: &mut Link, rng: &mut StdRng) -> Result<(), Fail> {
        let joined: Vec<usize> = (0..self.data.len())
            .filter(|&i| self.data[i].join.outcome().is_some())
            .collect();
        if joined.is_empty() {
            return Ok(());
        }
        let Some(job) = self.jobs.pop_front() else {
            return Ok(());
        };
        let src = &self.files[job.file as usize][job.offset as usize..][..job.len as usize];
        let digest = BlockCheck::of(&self.token.digest_key(), src);
        if job.send {
            let conn = self.data[joined[rng.gen_range(0..joined.len())]].conn;
            let header = BlockHeader {
                file: job.file,
                offset: job.offset,
                len: job.len,
            };
            let mut frame = header.encode().to_vec();
            frame.extend_from_slice(src);
            frame.extend_from_slice(&digest.0);
            link.send(conn, true, &frame);
        }
        let seal = self
            .planner
            .on_hashed(job.file, job.block, digest)
            .map_err(|v| Fail::Violation(v.0))?;
        for m in seal {
            self.send(link, &m);
        }
        Ok(())
    }

    fn check_gone(&self, link: &Link) -> Result<(), Fail> {
        let gone = link.gone(0) || self.data.iter().any(|c| link.gone(c.conn));
        match gone && !self.finished() {
            true => Err(Fail::Vanished),
            false => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The server: receives into `Disk`.

/// What the server keeps between sessions: part files with their journals, and committed
/// files.
#[derive(Default)]
struct Disk {
    parts: HashMap<u32, (Vec<u8>, Vec<u8>)>,
    committed: HashMap<u32, Vec<u8>>,
}

/// How the server decides its caps.
#[derive(Clone, Copy, Default)]
struct ServerPolicy {
    busy: Option<Busy>,
}

struct DataConn {
    conn: usize,
    hs: ServerHandshake,
    admitted: bool,
    refused: bool,
}

struct Server {
    token: TokenKey,
    policy: ServerPolicy,
    control: ServerHandshake,
    session: Option<(SessionId, SessionKey)>,
    seals: Option<(FrameSeal, FrameSeal)>,
    opening: ServerOpening,
    channels: Option<u16>,
    joined: Vec<bool>,
    data: Vec<DataConn>,
    tracker: ReceiveTracker,
    completion: Completion,
    sizes: HashMap<u32, u64>,
    nacks: u64,
    skipped: u64,
}

impl Server {
    fn new(token: &[u8], policy: ServerPolicy) -> Self {
        Server {
            token: TokenKey::from_token(token),
            policy,
            control: ServerHandshake::new([1; 32]),
            session: None,
            seals: None,
            opening: ServerOpening::new(),
            channels: None,
            joined: Vec::new(),
            data: Vec::new(),
            tracker: ReceiveTracker::new(BS),
            completion: Completion::default(),
            sizes: HashMap::new(),
            nacks: 0,
            skipped: 0,
        }
    }

    fn finished(&self) -> bool {
        self.channels.is_some() && self.completion.finished()
    }

    fn send(&mut self, link: &mut Link, m: &Message) {
        let (_, out) = self.seals.as_mut().expect("a session");
        link.send(0, false, &out.seal(m));
    }

    /// Sends the abort a real server sends for `fail`, then closes.
    fn abort(&mut self, link: &mut Link, fail: Fail) -> Fail {
        if self.seals.is_some() {
            let message = format!("{fail:?}");
            let transient = false;
            self.send(link, &Message::Abort { message, transient });
        }
        fail
    }

    fn step(&mut self, link: &mut Link, disk: &mut Disk, session: SessionId) -> Result<(), Fail> {
        let hello = self.control.take_output();
        link.send(0, false, &hello);
        if self.session.is_none() {
            let buf = link.arrived(0, true);
            let used = self.control.handle(buf).map_err(Fail::Handshake)?;
            buf.drain(..used);
            match self.control.heard() {
                Some(Heard::Control) => {
                    let accepted = self.control.accept_control(&self.token, session);
                    let answered = match (accepted, self.policy.busy) {
                        (Err(e), _) => Err(Fail::Handshake(e)),
                        (Ok(_), Some(busy)) => {
                            self.control.turn_away(busy);
                            Err(Fail::Handshake(HandshakeError::Busy(busy)))
                        }
                        (Ok(key), None) => {
                            self.control.welcome();
                            self.seals = Some((
                                key.control_seal(Way::ToServer),
                                key.control_seal(Way::ToClient),
                            ));
                            self.session = Some((session, key));
                            Ok(())
                        }
                    };
                    let answer = self.control.take_output();
                    link.send(0, false, &answer);
                    answered?;
                }
                Some(Heard::Join { .. }) => {
                    return Err(Fail::Violation("a join on the control connection".into()))
                }
                None => return Ok(()),
            }
        }
        let messages = {
            let (inn, _) = self.seals.as_mut().expect("a session");
            control_messages(link, true, inn)?
        };
        for m in messages {
            if let Err(f) = self.on_message(link, disk, m) {
                return Err(self.abort(link, f));
            }
        }
        if let Err(f) = self.drive_data(link, disk) {
            return Err(self.abort(link, f));
        }
        match link.gone(0) && !self.finished() {
            true => Err(Fail::Vanished),
            false => Ok(()),
        }
    }

    fn on_message(&mut self, link: &mut Link, disk: &mut Disk, m: Message) -> Result<(), Fail> {
        if self.channels.is_none() {
            match self.opening.on_message(m).map_err(Fail::Opening)? {
                ServerHeard::Reply(m) => self.send(link, &m),
                ServerHeard::Facts => self.send(link, &Message::HostFacts(HostFacts::default())),
                ServerHeard::Request(req) => {
                    self.channels = Some(req.channels);
                    self.joined = vec![false; req.channels as usize];
                    self.tracker = ReceiveTracker::new(req.block_size);
                    let accepted = self.opening.accept(req.channels, vec![]);
                    self.send(link, &accepted);
                }
            }
            return Ok(());
        }
        let violation = |v: hsxfer::channels::Violation| Fail::Violation(v.0);
        match m {
            Message::Manifest { entries, last } => {
                let files: Vec<(u32, u64)> = entries
                    .iter()
                    .filter_map(|e| match e.kind {
                        EntryKind::File { size } => Some((e.id, size)),
                        _ => None,
                    })
                    .collect();
                self.completion
                    .announced(files.len() as u64, last)
                    .map_err(violation)?;
                let (mut plans, announced, mut received) = (Vec::new(), files.len() as u64, 0);
                for (id, size) in files {
                    self.sizes.insert(id, size);
                    if disk
                        .committed
                        .get(&id)
                        .is_some_and(|f| f.len() as u64 == size)
                    {
                        self.skipped += 1;
                        self.tracker.skip(id).expect("each id is announced once");
                        plans.push(FilePlan {
                            file: id,
                            action: PlanAction::Skip,
                        });
                        continue;
                    }
                    let header = JournalHeader {
                        block_size: BS,
                        size,
                        mtime_ns: 0,
                    };
                    let part = disk
                        .parts
                        .entry(id)
                        .or_insert_with(|| (Vec::new(), Vec::new()));
                    let have = match journal::parse(&part.1) {
                        Some((h, records)) if h == header => records,
                        _ => {
                            *part = (vec![0; size as usize], header.encode().to_vec());
                            Vec::new()
                        }
                    };
                    self.tracker
                        .expect(id, size, &have)
                        .expect("each id is announced once");
                    received += 1;
                    plans.push(FilePlan {
                        file: id,
                        action: PlanAction::Send {
                            have: have.iter().map(|h| h.0).collect(),
                        },
                    });
                }
                self.completion.planned(announced, received);
                self.send(link, &Message::Plan { files: plans });
            }
            Message::Sealed {
                file,
                digests,
                more,
            } => {
                let v = self
                    .tracker
                    .on_sealed(file, digests, more)
                    .map_err(violation)?;
                self.act(link, disk, file, v);
            }
            other => return Err(Fail::Violation(format!("{} to a receiver", other.kind()))),
        }
        Ok(())
    }

    fn act(&mut self, link: &mut Link, disk: &mut Disk, file: u32, v: Verdict) {
        match v {
            Verdict::Pending => {}
            Verdict::Complete { .. } => {
                let (bytes, _) = disk.parts.remove(&file).expect("a part file");
                disk.committed.insert(file, bytes);
                self.completion.committed();
                self.send(link, &Message::FileDone { file });
            }
            Verdict::Resend(blocks) => {
                for block in blocks {
                    self.nacks += 1;
                    self.send(link, &Message::Nack { file, block });
                }
            }
        }
    }

    fn drive_data(&mut self, link: &mut Link, disk: &mut Disk) -> Result<(), Fail> {
        // New connections from the client get the server's hello.
        for conn in 1 + self.data.len()..link.conns.len() {
            let mut hs = ServerHandshake::new([conn as u8; 32]);
            link.send(conn, false, &hs.take_output());
            self.data.push(DataConn {
                conn,
                hs,
                admitted: false,
                refused: false,
            });
        }
        for i in 0..self.data.len() {
            let conn = self.data[i].conn;
            if !self.data[i].admitted && !self.data[i].refused {
                let buf = link.arrived(conn, true);
                let used = self.data[i].hs.handle(buf).map_err(Fail::Handshake)?;
                buf.drain(..used);
                let Some(Heard::Join { session, channel }) = self.data[i].hs.heard() else {
                    continue;
                };
                let key = self
                    .session
                    .as_ref()
                    .filter(|s| s.0 == session)
                    .map(|s| &s.1);
                let free = self.joined.get(channel as usize) == Some(&false);
                let admitted = self.data[i].hs.admit_join(key, free);
                let answer = self.data[i].hs.take_output();
                link.send(conn, false, &answer);
                if !admitted {
                    // Like the real server: this connection is refused and closed once its
                    // refusal is out; the session goes on waiting for its channels.
                    self.data[i].refused = true;
                    continue;
                }
                self.joined[channel as usize] = true;
                self.data[i].admitted = true;
            }
            if self.data[i].refused {
                if link.conns[conn].down.in_flight.is_empty() {
                    link.conns[conn].closed = true;
                }
                continue;
            }
            self.read_frames(link, disk, conn)?;
        }
        Ok(())
    }

    fn read_frames(&mut self, link: &mut Link, disk: &mut Disk, conn: usize) -> Result<(), Fail> {
        let key = self.token.digest_key();
        loop {
            let buf = link.arrived(conn, true);
            let Some(head) = buf.get(..HEADER_LEN) else {
                return Ok(());
            };
            let h = BlockHeader::decode(head.try_into().expect("a header"))
                .map_err(|e| Fail::Frame(e.to_string()))?;
            let total = HEADER_LEN + h.len as usize + TRAILER_LEN;
            if buf.len() < total {
                return Ok(());
            }
            let frame: Vec<u8> = buf.drain(..total).collect();
            let payload = &frame[HEADER_LEN..][..h.len as usize];
            let trailer = Digest(frame[total - TRAILER_LEN..].try_into().expect("32 bytes"));
            let block = self.tracker.check(&h).map_err(|v| Fail::Violation(v.0))?;
            if !self.tracker.wants(h.file, block) {
                continue;
            }
            let got = BlockCheck::of(&key, payload);
            if got != trailer {
                self.nacks += 1;
                self.send(
                    link,
                    &Message::Nack {
                        file: h.file,
                        block,
                    },
                );
                continue;
            }
            let (bytes, journal) = disk.parts.get_mut(&h.file).expect("a part file");
            bytes[h.offset as usize..][..payload.len()].copy_from_slice(payload);
            journal.extend_from_slice(&journal::encode_record(block, &got));
            let v = self.tracker.on_block(h.file, block, got);
            self.act(link, disk, h.file, v);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The pair.

/// A client and a server over one link, stepped at random until the session is over.
struct Pair {
    client: Client,
    server: Server,
    link: Link,
}

impl Pair {
    fn new(client: Client, server: Server, faults: Faults) -> Self {
        Pair {
            client,
            server,
            link: Link {
                conns: vec![Conn::default()],
                faults,
            },
        }
    }

    /// Runs the session: `Ok` when both ends finished, else the client's failure (what the
    /// user sees) and the server's.
    fn run(
        &mut self,
        rng: &mut StdRng,
        disk: &mut Disk,
        session: SessionId,
    ) -> Result<(), (Option<Fail>, Option<Fail>)> {
        let start = Instant::now();
        let (mut client_fail, mut server_fail) = (None, None);
        for step in 0..2_000_000u64 {
            let now = start + Duration::from_micros(step);
            if self.client.finished() && self.server.finished() {
                return Ok(());
            }
            let moved = match rng.gen_range(0..3) {
                0 if client_fail.is_none() => {
                    if let Err(f) = self.client.step(&mut self.link, rng, now) {
                        // The client closes every connection.
                        self.link.conns.iter_mut().for_each(|c| c.closed = true);
                        client_fail = Some(f);
                    }
                    true
                }
                1 if server_fail.is_none() => {
                    if let Err(f) = self.server.step(&mut self.link, disk, session) {
                        server_fail = Some(f);
                        // The server's last words still travel, then it closes.
                        while self.link.step(rng) {}
                        self.link.conns.iter_mut().for_each(|c| c.closed = true);
                    }
                    true
                }
                _ => self.link.step(rng),
            };
            let idle = !moved && self.link.conns.iter().all(|c| c.closed);
            if client_fail.is_some() && (server_fail.is_some() || idle) {
                return Err((client_fail, server_fail));
            }
            if server_fail.is_some() && client_fail.is_none() && self.link.conns[0].closed {
                // The client reads what arrived and then finds the connection gone.
                for _ in 0..1000 {
                    client_fail = self.client.step(&mut self.link, rng, now).err();
                    if client_fail.is_some() {
                        break;
                    }
                }
                assert!(client_fail.is_some(), "the client missed the server's end");
                return Err((client_fail, server_fail));
            }
        }
        panic!("the session neither finished nor failed");
    }
}

fn random_files(rng: &mut StdRng) -> Vec<Vec<u8>> {
    (0..8)
        .map(|i| {
            let len = match i {
                0 => 0,
                1..=3 => rng.gen_range(1..8 * BS as usize),
                _ => rng.gen_range(1..600),
            };
            (0..len).map(|_| rng.gen()).collect()
        })
        .collect()
}

#[test]
fn a_clean_session_moves_every_file_in_one_go() {
    for seed in 0..50 {
        let mut rng = StdRng::seed_from_u64(seed);
        let files = random_files(&mut rng);
        let mut disk = Disk::default();
        let mut pair = Pair::new(
            Client::new(b"token", files.clone(), 3),
            Server::new(b"token", ServerPolicy::default()),
            CLEAN,
        );
        pair.run(&mut rng, &mut disk, [seed as u8; 16])
            .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        for (i, f) in files.iter().enumerate() {
            assert_eq!(&disk.committed[&(i as u32)], f, "seed {seed} file {i}");
        }
        assert_eq!(pair.server.nacks, 0);
    }
}

#[derive(Default, Debug)]
struct Tally {
    sessions: u64,
    failures: HashMap<&'static str, u64>,
    nacks: u64,
    resumed_blocks: u64,
    skipped_files: u64,
}

#[test]
fn sessions_on_a_damaging_cutting_link_end_with_every_file_intact() {
    let faults = Faults {
        data_flip: 0.05,
        control_flip: 0.002,
        cut: 0.001,
    };
    let mut tally = Tally::default();
    for seed in 0..300 {
        let mut rng = StdRng::seed_from_u64(seed);
        let files = random_files(&mut rng);
        let mut disk = Disk::default();
        let mut done = false;
        for attempt in 0..200u32 {
            tally.sessions += 1;
            let channels = rng.gen_range(1..=4);
            let mut pair = Pair::new(
                Client::new(b"token", files.clone(), channels),
                Server::new(b"token", ServerPolicy::default()),
                faults,
            );
            let id = [attempt as u8; 16];
            let out = pair.run(&mut rng, &mut disk, id);
            tally.nacks += pair.server.nacks;
            tally.resumed_blocks += pair.client.resumed_blocks;
            tally.skipped_files += pair.server.skipped;
            match out {
                Ok(()) => {
                    done = true;
                    break;
                }
                Err((client, server)) => {
                    let client = client.expect("the client saw the failure");
                    // The side that found the fault says what it was.
                    let found = server.unwrap_or(client);
                    *tally.failures.entry(found.kind()).or_default() += 1;
                    // A crash may tear the last journal record.
                    for (_, journal) in disk.parts.values_mut() {
                        let tear = rng.gen_range(0..journal::RECORD_LEN).min(journal.len());
                        journal.truncate(journal.len() - tear);
                    }
                }
            }
        }
        assert!(done, "seed {seed}: no session finished");
        for (i, f) in files.iter().enumerate() {
            assert_eq!(&disk.committed[&(i as u32)], f, "seed {seed}: file {i}");
        }
        assert!(disk.parts.is_empty(), "seed {seed}: part files left");
    }
    eprintln!("{tally:?}");
    // Every fault and recovery path was taken.
    for kind in ["vanished", "frame", "control", "handshake"] {
        assert!(
            tally.failures.get(kind).copied().unwrap_or(0) > 0,
            "{tally:?}"
        );
    }
    assert!(tally.nacks > 100, "{tally:?}");
    assert!(tally.resumed_blocks > 50, "{tally:?}");
    assert!(tally.skipped_files > 50, "{tally:?}");
}

/// Runs one clean session whose client and server differ as set up by the caller; returns
/// the client's failure.
fn failing(client: Client, server: Server) -> Fail {
    let mut rng = StdRng::seed_from_u64(7);
    let mut pair = Pair::new(client, server, CLEAN);
    match pair.run(&mut rng, &mut Disk::default(), [1; 16]) {
        Ok(()) => panic!("the session succeeded"),
        Err((client, _)) => client.expect("the client failed"),
    }
}

#[test]
fn a_wrong_token_is_refused_before_anything_else() {
    let files = vec![b"x".to_vec()];
    let f = failing(
        Client::new(b"mine", files, 1),
        Server::new(b"theirs", ServerPolicy::default()),
    );
    assert_eq!(f, Fail::Handshake(HandshakeError::AuthRefused));
}

#[test]
fn a_busy_server_says_which_cap() {
    let busy = Busy {
        cap: Cap::Sessions,
        per_address: true,
        limit: 2,
    };
    let f = failing(
        Client::new(b"t", vec![b"x".to_vec()], 1),
        Server::new(b"t", ServerPolicy { busy: Some(busy) }),
    );
    assert_eq!(f, Fail::Handshake(HandshakeError::Busy(busy)));
}

#[test]
fn a_request_out_of_bounds_is_refused_with_the_servers_reason() {
    let mut client = Client::new(b"t", vec![b"x".to_vec()], 1);
    client.edit_request = |r| r.tuning.interval_ms = 0;
    let f = failing(client, Server::new(b"t", ServerPolicy::default()));
    match f {
        Fail::Opening(OpeningError::Refused(why)) => assert!(why.contains("interval"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// Steps a pair on a clean link until the client opened its data channels.
fn opened(pair: &mut Pair, rng: &mut StdRng, disk: &mut Disk) {
    let mut now = Instant::now();
    while pair.server.channels.is_none() || pair.client.data.is_empty() {
        pair.client.step(&mut pair.link, rng, now).unwrap();
        pair.server.step(&mut pair.link, disk, [1; 16]).unwrap();
        while pair.link.step(rng) {}
        now += Duration::from_millis(1);
    }
}

#[test]
fn a_forged_control_frame_ends_the_session() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut disk = Disk::default();
    let mut pair = Pair::new(
        Client::new(b"t", vec![vec![1; 300]], 2),
        Server::new(b"t", ServerPolicy::default()),
        CLEAN,
    );
    opened(&mut pair, &mut rng, &mut disk);
    // From now on every control chunk has a bit flipped.
    pair.link.faults.control_flip = 1.0;
    let (client, _) = pair.run(&mut rng, &mut disk, [1; 16]).unwrap_err();
    match client {
        Some(Fail::Control(why)) => assert!(why.contains("authentication check"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(disk.committed.is_empty());
}

#[test]
fn a_join_for_another_session_is_refused() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut disk = Disk::default();
    let mut pair = Pair::new(
        Client::new(b"t", vec![vec![1; 300]], 1),
        Server::new(b"t", ServerPolicy::default()),
        CLEAN,
    );
    opened(&mut pair, &mut rng, &mut disk);
    // The server now knows the session by another id than the one its welcome named.
    pair.server.session.as_mut().unwrap().0 = [2; 16];
    let (client, server) = pair.run(&mut rng, &mut disk, [1; 16]).unwrap_err();
    assert_eq!(
        client,
        Some(Fail::Handshake(HandshakeError::JoinRefused(0)))
    );
    assert_eq!(server, Some(Fail::Vanished));
}
