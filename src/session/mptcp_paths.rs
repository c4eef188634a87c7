//! A client's MPTCP set-up before its data connection: which of this host's addresses the
//! connection opens subflows from (several paths, when the host has several uplinks toward
//! the server), and the path manager's limits and endpoints that give it its subflows, or,
//! for more subflows than the in-kernel manager allows, the userspace path manager that opens
//! them one by one. What is set is the host's (its network namespace's), so it needs root and
//! is put back after the transfer.

use std::net::{IpAddr, SocketAddr};

use crate::error::{Error, Result};
use crate::transport::cc::privileged;
use crate::transport::mptcp::{self, Limits, LimitsSet, PathEndpoints, MAX_EXTRA_SUBFLOWS};
use crate::transport::mptcp_pm::{forget_killed_selections, PmSocket};
use crate::transport::route::{self, Egress};

/// The most subflows hsxfer asks the userspace path manager for.
pub const MAX_USERSPACE_SUBFLOWS: u16 = 32;

/// Which of this host's addresses an MPTCP connection opens subflows from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MptcpPaths {
    /// The kernel's choice, and every other address whose route toward the server leaves
    /// through another interface (a host with two uplinks and a routing rule per source
    /// address). Root only; without root a note names the paths left unused.
    #[default]
    Auto,
    /// Only the address the kernel picks.
    Off,
    /// The kernel's choice and these addresses of this host (root only).
    Given(Vec<IpAddr>),
}

impl std::str::FromStr for MptcpPaths {
    type Err = String;

    /// `auto`, `off`, or addresses separated by commas.
    fn from_str(s: &str) -> std::result::Result<MptcpPaths, String> {
        match s {
            "auto" => Ok(MptcpPaths::Auto),
            "off" => Ok(MptcpPaths::Off),
            _ => s
                .split(',')
                .map(|a| {
                    a.trim().parse::<IpAddr>().map_err(|_| {
                        format!("'{a}' is not an IP address: give auto, off or ADDR[,ADDR...]")
                    })
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(MptcpPaths::Given),
        }
    }
}

impl MptcpPaths {
    /// Checks addresses given before anything is connected: they must be this host's, and
    /// using them needs root.
    pub fn check(&self) -> Result<()> {
        let MptcpPaths::Given(addrs) = self else {
            return Ok(());
        };
        if !privileged() {
            return Err(Error::Usage(
                "MPTCP subflows from other local addresses need root: the path manager's \
                 endpoints are the host's"
                    .into(),
            ));
        }
        match addrs
            .iter()
            .find(|a| route::interface_of(**a).ok().flatten().is_none())
        {
            Some(a) => Err(Error::Usage(format!(
                "{a} is not an address of this host: give one that `ip addr` lists"
            ))),
            None => Ok(()),
        }
    }
}

/// What a client set up for its MPTCP connection, put back when dropped.
#[derive(Debug)]
pub struct PathManager {
    /// The paths the connection's subflows start from (the first is the kernel's choice);
    /// empty with one path.
    pub paths: Vec<Egress>,
    /// Subflows the connection is expected to have, the first included.
    pub subflows: u16,
    /// With more subflows than the in-kernel path manager gives, the userspace one's socket,
    /// which asks for them ([`PathManager::open_subflows`]).
    userspace: Option<PmSocket>,
    _endpoints: Option<PathEndpoints>,
    _limits: Option<LimitsSet>,
}

impl PathManager {
    /// Nothing set: `channels` channels (plain TCP), or `channels` subflows from what the host
    /// already allows.
    pub fn none(channels: u16) -> PathManager {
        PathManager {
            paths: Vec::new(),
            subflows: channels,
            userspace: None,
            _endpoints: None,
            _limits: None,
        }
    }

    /// Sets up an MPTCP connection to `server` with `channels` subflows on each path: finds
    /// the paths `wanted`, and as root raises the path manager's limits and adds the paths'
    /// endpoints. What it cannot do (no root, the kernel's limit of
    /// [`MAX_EXTRA_SUBFLOWS`]) becomes a note; an address given that this host does not
    /// have, or cannot route toward the server, is an error.
    pub fn set_up(
        server: IpAddr,
        channels: u16,
        wanted: &MptcpPaths,
        notes: &mut Vec<String>,
    ) -> Result<PathManager> {
        let root = privileged();
        let mut paths = find_paths(server, wanted, root, notes)?;
        if paths.len() <= 1 && channels > MAX_EXTRA_SUBFLOWS + 1 {
            match (root, PmSocket::open()) {
                (true, Ok(pm)) => {
                    return Ok(PathManager {
                        userspace: Some(pm),
                        ..PathManager::none(channels.min(MAX_USERSPACE_SUBFLOWS))
                    })
                }
                (true, Err(e)) => notes.push(format!(
                    "client: no userspace MPTCP path manager for more than {} subflows: {e}",
                    MAX_EXTRA_SUBFLOWS + 1
                )),
                (false, _) => notes.push(format!(
                    "client: more than {} MPTCP subflows need the userspace path manager, \
                     which needs root",
                    MAX_EXTRA_SUBFLOWS + 1
                )),
            }
        }
        // Paths other than the kernel's choice only exist as root (see find_paths).
        let mut endpoints = None;
        if paths.len() > 1 {
            let ends: Vec<(IpAddr, &str)> =
                paths.iter().map(|p| (p.addr, p.dev.as_str())).collect();
            match PathEndpoints::add(&ends) {
                Ok(e) => {
                    notes.push(format!(
                        "client: MPTCP subflows over {} paths: {}",
                        paths.len(),
                        describe(&paths)
                    ));
                    endpoints = Some(e);
                }
                Err(e) => {
                    notes.push(format!(
                        "client: MPTCP runs on one path: endpoints not added: {e}"
                    ));
                    paths.clear();
                }
            }
        }
        let (want, asked) = limits_for(channels, paths.len());
        let extra = want.subflows;
        if asked > extra + 1 {
            notes.push(format!(
                "client: an MPTCP connection has at most {} subflows with the kernel's path \
                 manager, not {asked}",
                MAX_EXTRA_SUBFLOWS + 1,
            ));
        }
        let mut set = PathManager {
            paths,
            _endpoints: endpoints,
            ..PathManager::none(1 + extra as u16)
        };
        if extra == 0 {
            return Ok(set);
        }
        if root {
            if let Err(e) = forget_killed_selections() {
                notes.push(format!(
                    "client: the userspace path manager may stay selected: {e}"
                ));
            }
            match LimitsSet::to(want) {
                Ok(l) => set._limits = Some(l),
                Err(e) => notes.push(format!("client: MPTCP subflow limits not set: {e}")),
            }
        } else if let Ok(now) = Limits::read() {
            if now.subflows < extra || now.add_addr_accepted < want.add_addr_accepted {
                notes.push(format!(
                    "client: this host's MPTCP limits allow {} extra subflows, not the {extra} \
                     asked for (setting them needs root: ip mptcp limits set subflows {extra} \
                     add_addr_accepted {})",
                    now.subflows.min(now.add_addr_accepted),
                    want.add_addr_accepted
                ));
            }
        }
        Ok(set)
    }

    /// Whether the connection runs the userspace path manager: its socket must be made while
    /// the namespace selects it, and its subflows are asked for once it is connected.
    pub fn userspace(&self) -> bool {
        self.userspace.is_some()
    }

    /// With the userspace path manager, asks for `count` more subflows of the connection on
    /// `sock` (connected to `server`) from its own address; a note says what failed. The
    /// server must run the userspace path manager too to take more than 9 in all.
    pub fn open_subflows(
        &mut self,
        sock: &impl std::os::fd::AsFd,
        server: SocketAddr,
        count: u16,
        notes: &mut Vec<String>,
    ) {
        let Some(pm) = self.userspace.as_mut() else {
            return;
        };
        let local = socket2::SockRef::from(sock)
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket());
        let (Some(token), Some(local)) = (mptcp::token(sock), local) else {
            notes.push("client: the connection runs as TCP: no subflows to open".into());
            return;
        };
        for _ in 0..count {
            if let Err(e) = pm.create_subflow(token, local.ip(), server) {
                notes.push(format!("client: opening MPTCP subflows: {e}"));
                return;
            }
        }
    }

    /// Whether the subflows run over several paths.
    pub fn several(&self) -> bool {
        self.paths.len() > 1
    }
}

/// The path manager's limits for `channels` subflows on each of `paths` paths (0 or 1: one
/// path), and the subflows asked for in all. Each path opens a subflow to each port the
/// server announces beyond its own; the extra subflows are capped at the kernel's
/// [`MAX_EXTRA_SUBFLOWS`].
fn limits_for(channels: u16, paths: usize) -> (Limits, u32) {
    let per_path = channels.max(1) as u32;
    let asked = per_path * paths.max(1) as u32;
    let limits = Limits {
        subflows: (asked - 1).min(MAX_EXTRA_SUBFLOWS as u32),
        add_addr_accepted: (per_path - 1).min(MAX_EXTRA_SUBFLOWS as u32),
    };
    (limits, asked)
}

/// The paths toward `server`, the kernel's choice first; one path, or none found, gives an
/// empty list.
fn find_paths(
    server: IpAddr,
    wanted: &MptcpPaths,
    root: bool,
    notes: &mut Vec<String>,
) -> Result<Vec<Egress>> {
    let main = || {
        route::egress(server, None).map_err(|e| {
            Error::Usage(format!(
                "cannot tell where traffic toward {server} leaves: {e}"
            ))
        })
    };
    match wanted {
        MptcpPaths::Off => Ok(Vec::new()),
        MptcpPaths::Auto => {
            let Ok(main) = main() else {
                return Ok(Vec::new());
            };
            let others = route::other_paths(server, &main).unwrap_or_default();
            if others.is_empty() {
                return Ok(Vec::new());
            }
            if !root {
                notes.push(format!(
                    "client: this host has other paths toward {server} ({}); MPTCP subflows \
                     over them need root (the path manager's endpoints are the host's)",
                    describe(&others)
                ));
                return Ok(Vec::new());
            }
            Ok(std::iter::once(main).chain(others).collect())
        }
        MptcpPaths::Given(addrs) => {
            wanted.check()?;
            let main = main()?;
            let mut paths = vec![main.clone()];
            for a in addrs {
                let e = route::egress(server, Some(*a))
                    .map_err(|e| Error::Usage(format!("{a} cannot reach {server}: {e}")))?;
                if e.dev == main.dev && e.addr != main.addr {
                    notes.push(format!(
                        "client: {a} reaches {server} through {}, as the first subflow does: \
                         their subflows share that path (a routing rule for {a} would give it \
                         its own)",
                        e.dev
                    ));
                }
                if !paths.iter().any(|p| p.addr == e.addr) {
                    paths.push(e);
                }
            }
            Ok(if paths.len() > 1 { paths } else { Vec::new() })
        }
    }
}

/// "10.0.0.1 (eth0), 10.1.0.1 (eth1)".
fn describe(paths: &[Egress]) -> String {
    paths
        .iter()
        .map(|p| format!("{} ({})", p.addr, p.dev))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_auto_off_and_addresses() {
        assert_eq!("auto".parse(), Ok(MptcpPaths::Auto));
        assert_eq!("off".parse(), Ok(MptcpPaths::Off));
        let two: MptcpPaths = "10.0.0.1, fd00::1".parse().unwrap();
        assert_eq!(
            two,
            MptcpPaths::Given(vec![
                "10.0.0.1".parse().unwrap(),
                "fd00::1".parse().unwrap()
            ])
        );
        let bad = "10.0.0.1,eth1".parse::<MptcpPaths>().unwrap_err();
        assert!(bad.contains("'eth1' is not an IP address"), "{bad}");
    }

    #[test]
    fn limits_give_each_path_the_channels_up_to_the_kernels_cap() {
        let l = |subflows, add_addr_accepted| Limits {
            subflows,
            add_addr_accepted,
        };
        assert_eq!(limits_for(1, 0), (l(0, 0), 1));
        assert_eq!(limits_for(4, 0), (l(3, 3), 4));
        assert_eq!(limits_for(4, 1), (l(3, 3), 4));
        assert_eq!(limits_for(4, 2), (l(7, 3), 8));
        assert_eq!(limits_for(1, 3), (l(2, 0), 3));
        assert_eq!(limits_for(8, 2), (l(8, 7), 16));
        assert_eq!(limits_for(16, 1), (l(8, 8), 16));
    }
}
