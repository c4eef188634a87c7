//! Telemetry rows of the sending side's sockets: one per TCP channel, and one per subflow
//! of an MPTCP connection (`MPTCP_TCPINFO`), so that the live display, the NDJSON `channel`
//! events, the trace and the loss-synchronization metrics see the subflows that carry the
//! data, not only the first. A subflow row's settings are its connection's, with its own
//! addresses, its own pacing cap (set by [`crate::transport::subflow_pacing`]) and the
//! congestion control the kernel reports for it ([`crate::transport::sock_diag`]). The online
//! tuner, which paces and counts connections, sees an MPTCP connection as one channel: the
//! sum of its subflows ([`per_channel`]).

use std::net::SocketAddr;
use std::os::fd::OwnedFd;

use super::telemetry::Telemetry;
use crate::channels::limits::MAX_TELEMETRY_ROWS;
use crate::channels::telemetry::{ChannelSetup, TcpSample};
use crate::transport::mptcp::{self, Subflow};
use crate::transport::sock_diag::Diag;
use crate::transport::tcp_info::tcp_info;

/// One reading of a channel, or of one subflow of an MPTCP channel.
pub(super) struct Row {
    /// The channel (socket) it belongs to.
    pub(super) channel: usize,
    /// Its `TCP_INFO`.
    pub(super) tcp: TcpSample,
    /// With MPTCP, the subflow it is.
    pub(super) subflow: Option<Subflow>,
}

/// A data socket the sampler reads: a duplicate of its descriptor, and whether it is an
/// MPTCP socket (its protocol never changes, so it is read once).
pub(super) struct Watched {
    pub(super) fd: OwnedFd,
    pub(super) mptcp: bool,
}

impl Watched {
    pub(super) fn new(fd: OwnedFd) -> Watched {
        let mptcp = mptcp::is_mptcp(&fd);
        Watched { fd, mptcp }
    }
}

/// Reads every socket: a TCP channel gives one reading, an MPTCP connection one per
/// connected subflow (a subflow being closed is disconnected first, which clears its
/// addresses and counters: it gives none; one still opening, or refused, gives none either).
pub(super) fn read_sockets(sockets: &[Option<Watched>]) -> Vec<Row> {
    let mut rows = Vec::with_capacity(sockets.len());
    for (channel, w) in sockets.iter().enumerate() {
        let Some(Watched { fd, mptcp }) = w else {
            continue;
        };
        if *mptcp {
            // Read again once if a subflow joined between the kernel's two answers.
            let subflows = mptcp::subflow_info(fd).or_else(|_| mptcp::subflow_info(fd));
            if let Some(subflows) = subflows.ok().filter(|s| !s.is_empty()) {
                rows.extend(
                    subflows
                        .iter()
                        .filter(|sf| sf.remote.port() != 0 && sf.connected)
                        .map(|sf| Row {
                            channel,
                            tcp: sf.tcp,
                            subflow: Some(*sf),
                        }),
                );
                continue;
            }
        }
        if let Ok(tcp) = tcp_info(fd) {
            rows.push(Row {
                channel,
                tcp,
                subflow: None,
            });
        }
    }
    rows
}

/// Where readings go in the telemetry: channel i in row i; the first subflow of an MPTCP
/// channel in its channel's row, each later one in a row of its own past every channel's,
/// kept by its addresses while it lives, so that a subflow that closes moves no other. Also
/// gives each subflow row its connection's settings with its own addresses, cap and start.
#[derive(Default)]
pub(super) struct Rows {
    /// The subflow each row holds: its channel and addresses.
    held: Vec<Option<(usize, SocketAddr, SocketAddr)>>,
    /// The cap last recorded for each row.
    caps: Vec<Option<u64>>,
    /// The most subflows each channel had at once.
    peak: Vec<usize>,
    /// Reads subflows' congestion controls: opened at the first subflow; `Some(None)` when
    /// it could not be.
    diag: Option<Option<Diag>>,
}

impl Rows {
    /// Places `readings` of `channels` sockets in rows (`None`: nothing read for a row) and
    /// records new subflows' settings and changed caps in `telemetry` (`t`: now).
    pub(super) fn place(
        &mut self,
        readings: Vec<Row>,
        channels: usize,
        telemetry: &Telemetry,
        t: f64,
    ) -> Vec<Option<Row>> {
        let closing = self.closing(&readings);
        let mut rows: Vec<Option<Row>> = Vec::new();
        let mut setups = None;
        for r in readings {
            let i = match r.subflow {
                None => r.channel,
                Some(sf) => {
                    let id = (r.channel, sf.local, sf.remote);
                    match self.held.iter().position(|h| *h == Some(id)) {
                        Some(i) => {
                            if self.caps[i] != sf.max_pacing_rate && !closing[r.channel] {
                                telemetry.set_pace(i, sf.max_pacing_rate.map(|b| b * 8));
                                self.caps[i] = sf.max_pacing_rate;
                            }
                            i
                        }
                        None => {
                            let i = match self.held.get(r.channel) {
                                Some(Some(_)) => self.held.len().max(channels),
                                _ => r.channel,
                            };
                            // Past the rows a transfer reports, a new subflow goes unreported.
                            if i >= MAX_TELEMETRY_ROWS as usize {
                                continue;
                            }
                            let setups = setups.get_or_insert_with(|| telemetry.setups());
                            // The connection's settings are recorded when it opens.
                            let Some(Some(base)) = setups.get(r.channel) else {
                                continue;
                            };
                            let cc = self.subflow_cc(&sf);
                            telemetry.set_setup(ChannelSetup {
                                cc: cc.unwrap_or_else(|| base.cc.clone()),
                                index: i as u16,
                                pace_bps: sf.max_pacing_rate.map(|b| b * 8),
                                started_s: match i == r.channel {
                                    true => base.started_s,
                                    false => Some(t),
                                },
                                local: Some(sf.local),
                                remote: Some(sf.remote),
                                ..base.clone()
                            });
                            if self.held.len() <= i {
                                self.held.resize(i + 1, None);
                                self.caps.resize(i + 1, None);
                            }
                            self.held[i] = Some(id);
                            self.caps[i] = sf.max_pacing_rate;
                            i
                        }
                    }
                }
            };
            if rows.len() <= i {
                rows.resize_with(i + 1, || None);
            }
            rows[i] = Some(r);
        }
        rows
    }

    /// Records in each of `channel`'s subflow rows the congestion control the kernel reports
    /// for that subflow; false when it has no subflow rows or they cannot be read.
    pub(super) fn record_cc(&mut self, channel: usize, telemetry: &Telemetry) -> bool {
        let mut read = false;
        for i in self.rows_of(channel) {
            let Some(Some((_, local, remote))) = self.held.get(i).copied() else {
                continue;
            };
            let Some(Some(diag)) = self.diag.as_mut() else {
                return false;
            };
            if let Ok(Some(name)) = diag.congestion(local, remote) {
                telemetry.set_cc(i, name);
                read = true;
            }
        }
        read
    }

    /// The congestion control the kernel reports for subflow `sf`, if it can be read.
    fn subflow_cc(&mut self, sf: &Subflow) -> Option<String> {
        let diag = self
            .diag
            .get_or_insert_with(|| Diag::open().ok())
            .as_mut()?;
        diag.congestion(sf.local, sf.remote).ok().flatten()
    }

    /// The rows of channel `channel`: its own, and its subflows' once placed.
    pub(super) fn rows_of(&self, channel: usize) -> Vec<usize> {
        let subflows = self
            .held
            .iter()
            .enumerate()
            .filter(|(i, h)| *i != channel && h.is_some_and(|h| h.0 == channel))
            .map(|(i, _)| i);
        std::iter::once(channel).chain(subflows).collect()
    }

    /// For each channel, whether it has fewer subflows than it had: it is closing, and the
    /// caps its last subflows get are not what they carried the data under.
    fn closing(&mut self, readings: &[Row]) -> Vec<bool> {
        let mut live = vec![0usize; self.peak.len()];
        for r in readings.iter().filter(|r| r.subflow.is_some()) {
            if live.len() <= r.channel {
                live.resize(r.channel + 1, 0);
            }
            live[r.channel] += 1;
        }
        let channels = live
            .len()
            .max(readings.iter().map(|r| r.channel + 1).max().unwrap_or(0));
        live.resize(channels, 0);
        self.peak.resize(channels, 0);
        live.iter()
            .zip(&mut self.peak)
            .map(|(n, peak)| {
                *peak = (*peak).max(*n);
                n < peak
            })
            .collect()
    }
}

/// One reading per channel for the online tuner: a TCP channel's own, and for an MPTCP
/// connection its subflows' together ([`connection_of`]).
pub(super) fn per_channel(rows: &[Option<Row>], channels: usize) -> Vec<Option<TcpSample>> {
    (0..channels)
        .map(|c| {
            let of: Vec<TcpSample> = rows
                .iter()
                .flatten()
                .filter(|r| r.channel == c)
                .map(|r| r.tcp)
                .collect();
            match of.as_slice() {
                [] => None,
                [one] => Some(*one),
                many => Some(connection_of(many)),
            }
        })
        .collect()
}

/// The subflows of one connection as one channel: windows, counters and rates add up
/// (saturating: a subflow still connecting reports "unlimited" rates); the RTT is the slowest
/// subflow's (so the window's rate, Σ cwnd × MSS / RTT, is not overstated), the minimum RTT
/// the lowest, the state the worst. Time limited by the send buffer is left out: MPTCP feeds
/// a subflow from the connection's buffer, which grows with the subflows', so each subflow
/// counts send-buffer-limited time through the whole ramp (measured: 60 ms in the first
/// second on the 60 ms path) that is no host's limit. A real one still ends the meter, as a
/// plateau.
fn connection_of(subflows: &[TcpSample]) -> TcpSample {
    let sum32 = |f: fn(&TcpSample) -> u32| subflows.iter().fold(0u32, |a, s| a.wrapping_add(f(s)));
    let sum64 =
        |f: fn(&TcpSample) -> u64| subflows.iter().fold(0u64, |a, s| a.saturating_add(f(s)));
    let max32 = |f: fn(&TcpSample) -> u32| subflows.iter().map(f).max().unwrap_or(0);
    let max64 = |f: fn(&TcpSample) -> u64| subflows.iter().map(f).max().unwrap_or(0);
    TcpSample {
        cwnd: sum32(|s| s.cwnd),
        ssthresh: subflows
            .iter()
            .fold(0u32, |a, s| a.saturating_add(s.ssthresh))
            .min(i32::MAX as u32),
        rtt_us: max32(|s| s.rtt_us),
        min_rtt_us: subflows
            .iter()
            .map(|s| s.min_rtt_us)
            .filter(|r| *r > 0)
            .min()
            .unwrap_or(0),
        retrans: sum32(|s| s.retrans),
        total_retrans: sum32(|s| s.total_retrans),
        delivery_rate: shared_rate(subflows),
        pacing_rate: sum64(|s| s.pacing_rate),
        ca_state: subflows.iter().map(|s| s.ca_state).max().unwrap_or(0),
        bytes_acked: sum64(|s| s.bytes_acked),
        mss: subflows[0].mss,
        delivered: sum32(|s| s.delivered),
        busy_us: max64(|s| s.busy_us),
        rwnd_limited_us: max64(|s| s.rwnd_limited_us),
        sndbuf_limited_us: 0,
        notsent_bytes: sum32(|s| s.notsent_bytes),
        snd_wnd: sum32(|s| s.snd_wnd),
    }
}

/// The connection's delivery rate: the subflows' median rate times their number. They share
/// the connection's pacing cap equally, so they deliver alike, and the median keeps one
/// subflow's stale or noisy sample out (a plain sum of samples taken at different moments
/// overstated the path by up to 8x on a short one, and the meter keeps the highest).
fn shared_rate(subflows: &[TcpSample]) -> u64 {
    let mut rates: Vec<u64> = subflows.iter().map(|s| s.delivery_rate).collect();
    rates.sort_unstable();
    let n = rates.len();
    let median = match n % 2 {
        1 => rates[n / 2],
        _ => rates[n / 2 - 1] / 2 + rates[n / 2] / 2,
    };
    median.saturating_mul(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(channel: usize, cwnd: u32, rtt_us: u32, delivered: u32) -> Option<Row> {
        Some(Row {
            channel,
            tcp: TcpSample {
                cwnd,
                rtt_us,
                min_rtt_us: rtt_us - 100,
                delivered,
                delivery_rate: 1000,
                ssthresh: i32::MAX as u32,
                mss: 1448,
                ..Default::default()
            },
            subflow: None,
        })
    }

    #[test]
    fn the_tuner_sees_an_mptcp_connection_as_one_channel() {
        // Channel 0: an MPTCP connection with three subflows (one closing: no row);
        // channel 1: a TCP channel; channel 2: closed.
        let rows = [
            row(0, 10, 60_000, 5),
            None,
            row(0, 30, 61_000, 7),
            row(1, 20, 59_000, 3),
        ];
        let per = per_channel(&rows, 3);
        assert_eq!(per.len(), 3);
        let c = per[0].unwrap();
        assert_eq!((c.cwnd, c.rtt_us, c.min_rtt_us), (40, 61_000, 59_900));
        assert_eq!((c.delivered, c.delivery_rate, c.mss), (12, 2000, 1448));
        assert_eq!(c.ssthresh, i32::MAX as u32);
        assert_eq!(per[1], rows[3].as_ref().map(|r| r.tcp));
        assert_eq!(per[2], None);
    }
}

#[cfg(test)]
mod placement {
    use super::*;

    fn subflow(port: u16, cap: u64) -> Row {
        Row {
            channel: 0,
            tcp: TcpSample::default(),
            subflow: Some(Subflow {
                local: format!("10.0.0.1:{}", 40000 + port).parse().unwrap(),
                remote: format!("10.0.0.2:{port}").parse().unwrap(),
                tcp: TcpSample::default(),
                max_pacing_rate: Some(cap),
                connected: true,
            }),
        }
    }

    /// Telemetry of one channel running cubic, started at 0.1 s.
    fn one_channel_telemetry() -> Telemetry {
        let t = Telemetry::new(1);
        t.set_setup(ChannelSetup {
            cc: "cubic".into(),
            started_s: Some(0.1),
            ..ChannelSetup::default()
        });
        t
    }

    fn remote(t: &Telemetry, row: usize) -> u16 {
        t.setups()[row].as_ref().unwrap().remote.unwrap().port()
    }

    #[test]
    fn a_subflow_keeps_its_row_and_a_closing_connection_keeps_its_caps() {
        let t = one_channel_telemetry();
        let mut rows = Rows::default();
        let placed = rows.place(vec![subflow(7000, 100)], 1, &t, 0.2);
        assert_eq!(placed.len(), 1);
        let both = vec![subflow(7000, 50), subflow(7001, 50), subflow(7002, 50)];
        assert_eq!(rows.place(both, 1, &t, 0.3).len(), 3);
        assert_eq!(
            (remote(&t, 0), remote(&t, 1), remote(&t, 2)),
            (7000, 7001, 7002)
        );
        let setups = t.setups();
        let (first, later) = (setups[0].as_ref().unwrap(), setups[1].as_ref().unwrap());
        assert_eq!((first.started_s, later.started_s), (Some(0.1), Some(0.3)));
        assert_eq!((first.pace_bps, later.pace_bps), (Some(400), Some(400)));
        // The middle subflow closes and the others get its share: rows stay, caps stay.
        let left = rows.place(vec![subflow(7000, 75), subflow(7002, 75)], 1, &t, 0.4);
        assert!(left[0].is_some() && left[1].is_none() && left[2].is_some());
        assert_eq!(remote(&t, 2), 7002);
        assert_eq!(t.setups()[2].as_ref().unwrap().pace_bps, Some(400));
        assert_eq!(rows.rows_of(0), vec![0, 1, 2]);
        assert_eq!(rows.rows_of(3), vec![3]);
    }

    /// A long MPTCP transfer whose subflows come and go reports at most the rows the
    /// protocol allows, so a client takes its telemetry.
    #[test]
    fn subflows_past_the_rows_a_transfer_reports_go_unreported() {
        let t = one_channel_telemetry();
        let mut rows = Rows::default();
        for port in 0..MAX_TELEMETRY_ROWS + 100 {
            rows.place(vec![subflow(port, 100)], 1, &t, 0.2);
        }
        assert_eq!(t.setups().len(), MAX_TELEMETRY_ROWS as usize);
        let batch = t.take_batch(false);
        assert_eq!(crate::channels::checks::check_telemetry(&batch), Ok(()));
    }
}
