//! Multipath TCP (`IPPROTO_MPTCP`): whether a connection really runs MPTCP and with how many
//! subflows, and the kernel path manager's settings that give a connection more subflows.
//! A server listening with MPTCP also accepts plain TCP clients, and an MPTCP client falls
//! back to TCP when the server or a middlebox does not speak it; only `MPTCP_INFO` tells
//! which happened. The path manager is set with iproute2's `ip mptcp`, as root.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::process::Command;
use std::sync::Mutex;

/// `SOL_MPTCP` (linux/socket.h).
const SOL_MPTCP: libc::c_int = 284;
/// `MPTCP_INFO` (linux/mptcp.h).
const MPTCP_INFO: libc::c_int = 1;

/// The number of subflows of the MPTCP connection on `sock` (the first one included), or
/// `None` when the connection runs as plain TCP: a TCP socket, or an MPTCP socket that fell
/// back (the kernel then refuses `MPTCP_INFO`).
pub fn subflows(sock: &impl AsFd) -> Option<u16> {
    // The head of struct mptcp_info: its first byte counts the subflows beyond the first.
    let mut info = [0u8; 96];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: pointer and length of a live, writable buffer.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            SOL_MPTCP,
            MPTCP_INFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0 && len > 0).then(|| 1 + info[0] as u16)
}

/// The in-kernel path manager's limits (`ip mptcp limits`), which belong to the network
/// namespace: how many extra subflows a connection may have, and how many addresses a
/// server announces that a client takes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Extra subflows per connection.
    pub subflows: u32,
    /// Announced addresses a connection uses.
    pub add_addr_accepted: u32,
}

impl Limits {
    /// Reads the namespace's limits.
    pub fn read() -> io::Result<Limits> {
        let out = ip(&["limits", "show"])?;
        let word = |name: &str| {
            let mut words = out.split_whitespace();
            words.find(|w| *w == name);
            words.next().and_then(|v| v.parse().ok()).ok_or_else(|| {
                io::Error::other(format!("`ip mptcp limits show` gave no {name}: {out}"))
            })
        };
        Ok(Limits {
            subflows: word("subflows")?,
            add_addr_accepted: word("add_addr_accepted")?,
        })
    }

    fn set(&self) -> io::Result<()> {
        let (s, a) = (
            self.subflows.to_string(),
            self.add_addr_accepted.to_string(),
        );
        ip(&["limits", "set", "subflows", &s, "add_addr_accepted", &a]).map(drop)
    }
}

/// Limits raised for a while. They are only ever raised, never lowered, and the limits from
/// before the first raise in this process are put back when the last of these is dropped.
/// (Another process changing them meanwhile is not coordinated with.)
#[derive(Debug)]
pub struct LimitsSet(());

/// Raises alive in this process, and the limits from before the first.
static RAISED: Mutex<(usize, Option<Limits>)> = Mutex::new((0, None));

impl LimitsSet {
    /// Raises the namespace's limits to at least `want` (root only).
    pub fn to(want: Limits) -> io::Result<LimitsSet> {
        let mut raised = RAISED.lock().unwrap_or_else(|e| e.into_inner());
        let now = Limits::read()?;
        Limits {
            subflows: now.subflows.max(want.subflows),
            add_addr_accepted: now.add_addr_accepted.max(want.add_addr_accepted),
        }
        .set()?;
        if raised.0 == 0 {
            raised.1 = Some(now);
        }
        raised.0 += 1;
        Ok(LimitsSet(()))
    }
}

impl Drop for LimitsSet {
    fn drop(&mut self) {
        let mut raised = RAISED.lock().unwrap_or_else(|e| e.into_inner());
        raised.0 -= 1;
        if raised.0 == 0 {
            if let Some(before) = raised.1.take() {
                let _ = before.set();
            }
        }
    }
}

/// The most extra subflows the in-kernel path manager gives one connection.
pub const MAX_EXTRA_SUBFLOWS: u16 = 8;

/// `signal` endpoints on the ports after a server's own: the in-kernel path manager
/// announces them to every MPTCP client, listens on them, and each client that accepts
/// announcements opens a subflow to each. Removed, and the limits put back, when dropped.
#[derive(Debug)]
pub struct SignalEndpoints {
    ids: Vec<String>,
    _limits: LimitsSet,
}

impl SignalEndpoints {
    /// Adds `count` endpoints on `addr`, ports `port + 1 ..= port + count` (root only).
    pub fn add(addr: IpAddr, port: u16, count: u16) -> io::Result<SignalEndpoints> {
        let limits = LimitsSet::to(Limits {
            subflows: count as u32,
            add_addr_accepted: 0,
        })?;
        let mut added = SignalEndpoints {
            ids: Vec::new(),
            _limits: limits,
        };
        let a = addr.to_string();
        for p in (1..=count).map(|k| port as u32 + k as u32) {
            if p > u16::MAX as u32 {
                return Err(io::Error::other(format!("no port {p} after {port}")));
            }
            let p = p.to_string();
            // One left by a server that was killed is taken over.
            if endpoint_id(&a, &p)?.is_none() {
                ip(&["endpoint", "add", &a, "port", &p, "signal"])?;
            }
            let id = endpoint_id(&a, &p)?
                .ok_or_else(|| io::Error::other(format!("endpoint {a} port {p} not listed")))?;
            added.ids.push(id);
        }
        Ok(added)
    }
}

impl Drop for SignalEndpoints {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = ip(&["endpoint", "delete", "id", id]);
        }
    }
}

/// The id of the endpoint on `addr` and `port`, if there is one (`ip mptcp endpoint show`
/// lists "ADDR port P id N signal").
fn endpoint_id(addr: &str, port: &str) -> io::Result<Option<String>> {
    let shown = ip(&["endpoint", "show"])?;
    Ok(shown.lines().find_map(|line| {
        let w: Vec<&str> = line.split_whitespace().collect();
        let ours = w.first() == Some(&addr) && w.get(1) == Some(&"port") && w.get(2) == Some(&port);
        let at = w.iter().position(|x| *x == "id")?;
        ours.then(|| w.get(at + 1).map(|id| id.to_string()))
            .flatten()
    }))
}

/// Runs `ip mptcp ARGS` and returns its output; a failure carries its stderr.
fn ip(args: &[&str]) -> io::Result<String> {
    let out = Command::new("ip").arg("mptcp").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip mptcp {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// An `IPPROTO_MPTCP` socket; an error when MPTCP is off here (`net.mptcp.enabled`).
    fn mptcp_socket() -> io::Result<socket2::Socket> {
        socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::MPTCP),
        )
    }

    #[test]
    fn tcp_has_no_subflows_and_mptcp_has_one() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(subflows(&c), None);
        let addr = l.local_addr().unwrap();
        drop(l);
        let l = mptcp_socket().expect("MPTCP is off here (sysctl net.mptcp.enabled)");
        l.bind(&addr.into()).unwrap();
        l.listen(4).unwrap();
        let m = mptcp_socket().unwrap();
        m.connect(&addr.into()).unwrap();
        let (accepted, _) = l.accept().unwrap();
        assert_eq!(subflows(&m), Some(1));
        assert_eq!(subflows(&accepted), Some(1));
        // A plain TCP client of an MPTCP listener: the accepted socket falls back.
        let t = TcpStream::connect(addr).unwrap();
        let (fallback, _) = l.accept().unwrap();
        assert_eq!(subflows(&fallback), None);
        drop(t);
    }
}
