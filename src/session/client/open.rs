//! Opening a session: the control connection, its handshake and request, and the data
//! channels dialed beside it, which join once it has authenticated.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::plan::{PathFacts, Prepared};
use super::{Client, Opened};
use crate::channels::control::{Message, Operation, Request, PROTOCOL_VERSION};
use crate::channels::opening::{Answer, ClientOpening};
use crate::error::{Error, Result};
use crate::session::growth::{connect_channel, open_channel, timed_connect, Connector, Dialer};
use crate::session::handshake::{self, Opener};
use crate::session::mptcp_paths::PathManager;
use crate::session::report::LiveStats;
use crate::session::secure::{open_control, FirstContact, OpenedControl};
use crate::session::tuning::{check_congestion, enforce_congestion, read_setup, LocalPlan};
use crate::session::wire::{control_pair, ControlReader, ControlWriter, Side as WireSide};
use crate::transport::mptcp::{self, SubflowCounts, MAX_EXTRA_SUBFLOWS};
use crate::transport::route;
use crate::transport::tcp_info::tcp_info;
use crate::transport::tls::{ReadPart, Stream, WritePart};
use crate::transport::{SocketOptions, Transport};

impl Client {
    /// Opens a session for `op`: connects and authenticates the control connection, plans
    /// the transport settings from the RTT, dials the data channels meanwhile, sends the
    /// request (followed by `ahead`, messages the engine would send first: a push's first
    /// manifest pieces) and joins the channels with their settings applied.
    pub(super) async fn open(
        &self,
        op: Operation,
        we_send: bool,
        live: &LiveStats,
        ahead: Vec<Message>,
    ) -> Result<Opened> {
        self.opts.validate()?;
        let n = self.connections();
        let mut mptcp_notes = Vec::new();
        if we_send {
            let one_path = PathManager::none(self.opts.channels);
            let mut t = self.tuning_request(Duration::ZERO, None, None, false, &one_path);
            t.online = self.online_request(None, &one_path);
            check_congestion(&t, "client")?;
        }
        let addrs = self.resolve().await?;
        let (addr, tcp) = self.connect_tcp(&addrs).await?;
        let mut pm = match self.opts.mptcp {
            true => PathManager::set_up(
                addr.ip(),
                self.opts.channels,
                &self.opts.mptcp_paths,
                &mut mptcp_notes,
            )?,
            false => PathManager::none(self.opts.channels),
        };
        let peer = addr.to_string();
        let path = PathFacts {
            link_speed: interface_speed(&tcp),
            mss: tcp_info(&tcp).map(|t| t.mss).unwrap_or(0),
        };
        // Once the RTT is known (the kernel's sample of the connect) the data channels are
        // planned and connected; they open (TLS) once the control connection has, and join
        // once it has authenticated, while the request is on its way.
        let (ready_tx, ready_rx) = watch::channel(Ready::Connecting);
        let early = match self.opts.rtt.or_else(|| kernel_rtt(&tcp)) {
            Some(rtt) => {
                let p = self.prepare(rtt, path, &pm, we_send, live)?;
                let joins = dial_channels(addr, &peer, &p.plan, n, &ready_rx);
                Some((p, joins))
            }
            None => None,
        };
        let OpenedControl {
            stream: mut ctrl,
            opener,
            first_contact,
        } = open_control(&self.opts.security, &self.server_name(), tcp, &peer).await?;
        ready_tx.send_replace(Ready::Opened(opener.clone()));
        let dial = |prepared: &Prepared| Dialer {
            addr,
            peer: peer.clone(),
            plan: prepared.plan.clone(),
            opener: opener.clone(),
        };
        let (session, skey) =
            handshake::client_control(&mut ctrl, &self.opts.auth.key(), &peer).await?;
        let key_note = first_contact.map(FirstContact::record);
        let cipher_suite = ctrl.cipher_suite();
        let (mut ctrl_r, mut ctrl_w) = control_pair(ctrl, &skey, WireSide::Client);
        let mut opening = ClientOpening::new();
        let (prepared, mut joins) = match early {
            Some(e) => e,
            None => {
                let rtt = ping_rtt(&mut opening, &mut ctrl_r, &mut ctrl_w).await?;
                let p = self.prepare(rtt, path, &pm, we_send, live)?;
                let joins = dial_channels(addr, &peer, &p.plan, n, &ready_rx);
                (p, joins)
            }
        };
        let connector = Connector {
            dialer: dial(&prepared),
            session,
            key: skey,
        };
        ready_tx.send_replace(Ready::Session(connector.clone()));
        let Prepared {
            tuning,
            plan,
            mut report,
            stagger,
            tuner,
        } = prepared;
        report.notes.extend(key_note);
        // Shown even if the server refuses the request (a key recorded on first contact),
        // after those the caller knew before opening (a tree's passed-over entries).
        live.add_notes(&report.notes);
        let most_channels = tuning.online.as_ref().map_or(n, |o| o.max_channels).max(n);
        let request = opening.request(Request {
            version: PROTOCOL_VERSION,
            op,
            channels: n,
            block_size: self.opts.block_size,
            tuning,
        });
        ctrl_w.queue(&request);
        ahead.iter().for_each(|m| ctrl_w.queue(m));
        ctrl_w.flush().await?;
        // Should the server refuse the request, dropping `joins` aborts the channels.
        // The server lists a pull's sources before it accepts: millions of files on a slow
        // file system take long, so the wait is long too.
        let accepted = tokio::time::timeout(ACCEPT_TIMEOUT, ctrl_r.expect())
            .await
            .map_err(|_| Error::Timeout("waiting an hour for the server to accept the request"))?;
        match opening.on_message(accepted?, Instant::now())? {
            Answer::Accepted { notes, .. } => {
                // A pull's "not copied", shown even if a channel then fails to join.
                live.add_notes(&notes);
                report.notes.extend(notes);
            }
            other => unreachable!("a request is answered by its acceptance, not {other:?}"),
        }
        let mut channels = Vec::new();
        while let Some(j) = joins.join_next().await {
            channels.push(j.map_err(Error::task("connecting a data channel"))??);
        }
        channels.sort_by_key(|c| c.0);
        let channels: Vec<Stream> = channels.into_iter().map(|c| c.1).collect();
        let transport = self.transport_of(&channels, &mut report.notes);
        pm.open_subflows(&channels[0], addr, pm.subflows - 1, &mut report.notes);
        report.notes.extend(mptcp_notes);
        let subflows = match transport {
            Transport::Mptcp => {
                let rtt = Duration::from_micros(report.rtt_us);
                let first = wait_for_subflows(&channels, pm.subflows, rtt).await;
                let mut joined = first.established;
                // Joins that failed are asked for once more, unless the server's path manager
                // is the kernel's, which took all it takes.
                let refused_past_kernel_cap = joined == MAX_EXTRA_SUBFLOWS + 1;
                let missing = pm.subflows.saturating_sub(joined + first.opening);
                if pm.userspace() && missing > 0 && !refused_past_kernel_cap {
                    pm.open_subflows(&channels[0], addr, missing, &mut report.notes);
                    joined = wait_for_subflows(&channels, pm.subflows, rtt)
                        .await
                        .established;
                }
                if pm.userspace() && joined < pm.subflows {
                    report.notes.push(format!(
                        "client: {joined} of {} MPTCP subflows joined: a server with the \
                         kernel's path manager takes at most {}; start it with the userspace \
                         one for more",
                        pm.subflows,
                        MAX_EXTRA_SUBFLOWS + 1
                    ));
                }
                Some(joined)
            }
            Transport::Tcp => None,
        };
        if we_send {
            let enforced = channels
                .iter()
                .enumerate()
                .try_for_each(|(i, c)| enforce_congestion(c, i, &plan.options[i], "client"));
            if let Err(e) = enforced {
                ctrl_w.abort(&e).await;
                ctrl_r.linger_until_closed().await;
                return Err(e);
            }
            if let Some(g) = &plan.dmc_group {
                // With MPTCP the subflows form the group in the kernel by themselves.
                if transport == Transport::Mptcp {
                    g.follow_mptcp(&channels[0]);
                }
                live.telemetry.set_group(g.clone());
            }
            if let Some(b) = plan.guard_baseline() {
                live.telemetry.set_guard_baseline(b);
            }
            for (i, c) in channels.iter().enumerate() {
                live.telemetry
                    .set_setup(read_setup(c, i, &plan.options[i], stagger[i])?);
            }
        }
        Ok(Opened {
            ctrl_r,
            ctrl_w,
            cipher_suite,
            channels,
            stagger,
            tuning: report,
            transport,
            subflows,
            _path_manager: pm,
            tuner,
            connector,
            most_channels,
        })
    }

    /// Connects the control connection to the first address that answers and opens it as
    /// the options' [`Security`](crate::session::secure::Security) says.
    pub(super) async fn connect_control(
        &self,
        addrs: &[SocketAddr],
    ) -> Result<(SocketAddr, OpenedControl)> {
        let (addr, tcp) = self.connect_tcp(addrs).await?;
        let opened = open_control(
            &self.opts.security,
            &self.server_name(),
            tcp,
            &addr.to_string(),
        )
        .await?;
        Ok((addr, opened))
    }

    /// The control connection's TCP connection, to the first address that answers.
    async fn connect_tcp(&self, addrs: &[SocketAddr]) -> Result<(SocketAddr, TcpStream)> {
        let ctl_opts = SocketOptions {
            nodelay: true,
            ..Default::default()
        };
        let mut last_err = None;
        for a in addrs {
            match timed_connect(*a, &ctl_opts).await {
                Ok(s) => return Ok((*a, s)),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.expect("at least one address was tried"))
    }
}

/// An upper bound on the path's rate when none is given: the link speed of the interface the
/// control connection leaves by (none for loopback and most virtual devices).
fn interface_speed(ctrl: &TcpStream) -> Option<u64> {
    let local = ctrl.local_addr().ok()?.ip();
    let name = route::interface_of(local).ok()??;
    route::link_speed_bps(&name)
}

/// The path RTT from the control connection's `TCP_INFO` minimum: the kernel's samples so far
/// (right after the connect, its SYN and SYN-ACK; then the handshakes' segments too), which
/// exclude the peers' scheduling delay. `None` when the kernel has none.
pub(super) fn kernel_rtt(ctrl: &impl AsFd) -> Option<Duration> {
    let info = tcp_info(ctrl).ok()?;
    (info.min_rtt_us > 0).then(|| Duration::from_micros(info.min_rtt_us as u64))
}

/// The path RTT from a ping on the control connection, when the kernel has no sample
/// ([`kernel_rtt`]): a round trip before the data channels dial.
pub(super) async fn ping_rtt(
    opening: &mut ClientOpening,
    r: &mut ControlReader<ReadPart>,
    w: &mut ControlWriter<WritePart>,
) -> Result<Duration> {
    w.send(&opening.ping(Instant::now())).await?;
    let pong = r
        .answer("waiting for the server's answer to a ping")
        .await?;
    opening.on_message(pong, Instant::now())?;
    Ok(opening.best_rtt().expect("the ping was answered"))
}

/// How long a client waits for the server to accept its request.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long a channel dialed early may wait for the session before it joins: the server
/// closes a connection that has not joined within its handshake timeout (10 s by default).
/// A channel that waited longer is dialed again.
const EARLY_JOIN_WITHIN: Duration = Duration::from_secs(3);

/// How far the control connection has come, for the data channels dialed beside it.
#[derive(Clone)]
enum Ready {
    /// Its TLS (or clear-text preface) is under way: the channels connect.
    Connecting,
    /// It is open: the channels open the same way (in TLS, accepting its key).
    Opened(Opener),
    /// It has authenticated: the channels join the session.
    Session(Connector),
}

impl Ready {
    fn opener(&self) -> Option<Opener> {
        match self {
            Ready::Connecting => None,
            Ready::Opened(o) => Some(o.clone()),
            Ready::Session(c) => Some(c.dialer.opener.clone()),
        }
    }

    fn connector(&self) -> Option<Connector> {
        match self {
            Ready::Session(c) => Some(c.clone()),
            _ => None,
        }
    }
}

/// Dials the session's `n` data channels to `addr` with the plan's socket options; each
/// opens once `ready` holds the control connection's opener, and joins once it holds the
/// session's connector. Dropping the set aborts them.
fn dial_channels(
    addr: SocketAddr,
    peer: &str,
    plan: &Arc<LocalPlan>,
    n: u16,
    ready: &watch::Receiver<Ready>,
) -> JoinSet<Result<(u16, Stream)>> {
    let mut joins = JoinSet::new();
    for ch in 0..n {
        let (peer, plan, mut ready) = (peer.to_string(), plan.clone(), ready.clone());
        joins.spawn(async move {
            let dialed = Instant::now();
            let tcp = connect_channel(addr, &plan, ch).await?;
            let opener = match ready.wait_for(|r| r.opener().is_some()).await {
                Ok(r) => r.opener().expect("waited for an opener"),
                Err(_) => return Err(Error::PeerVanished),
            };
            let mut s = open_channel(&opener, tcp, &peer).await?;
            let connector = match ready.wait_for(|r| r.connector().is_some()).await {
                Ok(r) => r.connector().expect("waited for a connector"),
                Err(_) => return Err(Error::PeerVanished),
            };
            if dialed.elapsed() > EARLY_JOIN_WITHIN {
                // Closed first: the server counts it against this address until it goes.
                drop(s);
                s = connector.dialer.open(ch).await?;
            }
            connector.join_opened(&mut s, ch).await?;
            Ok((ch, s))
        });
    }
    joins
}

/// Waits for the MPTCP connection's extra subflows to join and returns its subflows then:
/// `want` established, or as many as joined by then and those still being opened. The server's path manager announces its ports
/// one at a time, each after the previous one was acknowledged, so the k-th extra subflow
/// joins about k round trips in: the wait is `want` + 2 RTTs (at least 200 ms, at most 5 s).
/// A join whose SYN or SYN-ACK was lost is sent again after the kernel's first 1 s timeout,
/// so while subflows are still being opened the wait goes on, up to [`JOIN_RETRY_WAIT`].
async fn wait_for_subflows(channels: &[Stream], want: u16, rtt: Duration) -> SubflowCounts {
    let start = Instant::now();
    let wait = (rtt * (want as u32 + 2)).clamp(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let mut now = SubflowCounts::default();
        for c in channels.iter().filter_map(mptcp::subflow_counts) {
            now.established += c.established;
            now.opening += c.opening;
        }
        let waited = start.elapsed();
        let done = waited >= wait && (now.opening == 0 || waited >= wait.max(JOIN_RETRY_WAIT));
        if now.established >= want || done {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long subflows still being opened are waited for: a join sent again after the
/// kernel's first 1 s timeout, and its answer.
const JOIN_RETRY_WAIT: Duration = Duration::from_millis(2500);
