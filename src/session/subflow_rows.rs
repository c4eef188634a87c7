//! Telemetry rows of the sending side's sockets: one per TCP channel, and one per subflow
//! of an MPTCP connection (`MPTCP_TCPINFO`), so that the live display, the NDJSON `channel`
//! events, the trace and the loss-synchronization metrics see the subflows that carry the
//! data, not only the first. A subflow row's settings are its connection's, with its own
//! addresses and its own pacing cap (set by [`crate::transport::subflow_pacing`]).

use std::net::SocketAddr;
use std::os::fd::OwnedFd;

use super::telemetry::Telemetry;
use crate::channels::telemetry::{ChannelSetup, TcpSample};
use crate::transport::mptcp::{self, Subflow};
use crate::transport::tcp_info::tcp_info;

/// One row's reading.
pub(super) struct Row {
    /// The channel (socket) it belongs to.
    pub(super) channel: usize,
    /// Its `TCP_INFO`.
    pub(super) tcp: TcpSample,
    /// With MPTCP, the subflow it is.
    pub(super) subflow: Option<Subflow>,
}

/// Reads every socket: a TCP channel gives one row (`None` while it is closed), an MPTCP
/// connection one per subflow. Rows are laid out in channel order, so with TCP channels
/// row i is channel i, and with hsxfer's one MPTCP connection row k is its k-th subflow.
pub(super) fn read_rows(sockets: &[Option<OwnedFd>]) -> Vec<Option<Row>> {
    let mut rows = Vec::with_capacity(sockets.len());
    for (channel, fd) in sockets.iter().enumerate() {
        let Some(fd) = fd else {
            rows.push(None);
            continue;
        };
        if mptcp::is_mptcp(fd) {
            // Read again once if a subflow joined between the kernel's two answers.
            let subflows = mptcp::subflow_info(fd).or_else(|_| mptcp::subflow_info(fd));
            if let Some(subflows) = subflows.ok().filter(|s| !s.is_empty()) {
                // A subflow being closed is disconnected first, which clears its addresses
                // and counters: its row keeps what it had.
                rows.extend(subflows.iter().map(|sf| {
                    (sf.remote.port() != 0).then_some(Row {
                        channel,
                        tcp: sf.tcp,
                        subflow: Some(*sf),
                    })
                }));
                continue;
            }
        }
        rows.push(tcp_info(fd).ok().map(|tcp| Row {
            channel,
            tcp,
            subflow: None,
        }));
    }
    rows
}

/// What the telemetry already holds of each subflow row: its addresses and cap.
#[derive(Default)]
pub(super) struct SubflowSetups {
    known: Vec<Option<(SocketAddr, SocketAddr, Option<u64>)>>,
}

impl SubflowSetups {
    /// Gives each subflow row seen for the first time (or holding another subflow now) its
    /// connection's settings with its own addresses, cap and start (`t`, when first seen; the
    /// first subflow keeps its connection's), and updates the cap of the others.
    pub(super) fn update(&mut self, telemetry: &Telemetry, t: f64, rows: &[Option<Row>]) {
        if self.known.len() < rows.len() {
            self.known.resize(rows.len(), None);
        }
        let mut setups = None;
        for (i, row) in rows.iter().enumerate() {
            let Some((row, sf)) = row.as_ref().and_then(|r| Some(r).zip(r.subflow)) else {
                continue;
            };
            let pace_bps = sf.max_pacing_rate.map(|b| b.saturating_mul(8));
            match self.known[i] {
                Some((l, r, cap)) if (l, r) == (sf.local, sf.remote) => {
                    if cap != sf.max_pacing_rate {
                        telemetry.set_pace(i, pace_bps);
                        self.known[i] = Some((l, r, sf.max_pacing_rate));
                    }
                }
                _ => {
                    let setups = setups.get_or_insert_with(|| telemetry.setups());
                    // The connection's settings are recorded when it opens.
                    let Some(Some(base)) = setups.get(row.channel) else {
                        continue;
                    };
                    telemetry.set_setup(ChannelSetup {
                        index: i as u16,
                        pace_bps,
                        started_s: match i == row.channel {
                            true => base.started_s,
                            false => Some(t),
                        },
                        local: Some(sf.local),
                        remote: Some(sf.remote),
                        ..base.clone()
                    });
                    self.known[i] = Some((sf.local, sf.remote, sf.max_pacing_rate));
                }
            }
        }
    }
}
