//! Congestion control per socket: which algorithms the kernel offers, which an unprivileged
//! process may pick, and `TCP_CONGESTION` to set and read back a socket's algorithm and to
//! make a connected socket run the one asked for, over a route's `congctl`.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";
const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
const DEFAULT: &str = "/proc/sys/net/ipv4/tcp_congestion_control";
/// The kernel's limit on a congestion-control name, including the final NUL.
const NAME_MAX: usize = 16;

/// The congestion controls the host offers and who may use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CcCatalog {
    /// Registered algorithms (`tcp_available_congestion_control`).
    pub available: Vec<String>,
    /// Algorithms any process may select (`tcp_allowed_congestion_control`); the others need
    /// `CAP_NET_ADMIN`.
    pub allowed: Vec<String>,
    /// The host default for new sockets.
    pub default: String,
}

impl CcCatalog {
    /// Reads the catalog from `/proc`.
    pub fn read() -> io::Result<CcCatalog> {
        let words = |p: &str| -> io::Result<Vec<String>> {
            Ok(std::fs::read_to_string(p)?
                .split_whitespace()
                .map(str::to_string)
                .collect())
        };
        Ok(CcCatalog {
            available: words(AVAILABLE)?,
            allowed: words(ALLOWED)?,
            default: std::fs::read_to_string(DEFAULT)?.trim().to_string(),
        })
    }

    /// Whether this process may select `name`: it must be registered, and either allowed for
    /// everyone or the process must hold `CAP_NET_ADMIN` (approximated by running as root).
    pub fn usable(&self, name: &str, privileged: bool) -> bool {
        self.available.iter().any(|a| a == name)
            && (privileged || self.allowed.iter().any(|a| a == name))
    }
}

/// Whether the process runs as root (and so may pick any registered congestion control).
pub fn privileged() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Sets the socket's congestion control (`TCP_CONGESTION`).
pub fn set_congestion(sock: &impl AsFd, name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() >= NAME_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("congestion control name '{name}' must be 1 to 15 bytes"),
        ));
    }
    // SAFETY: pointer and length of a live byte slice.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr() as *const libc::c_void,
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads back the congestion control the kernel uses for the socket.
pub fn congestion(sock: &impl AsFd) -> io::Result<String> {
    let mut buf = [0u8; NAME_MAX];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: pointer and length of a live, writable buffer.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let raw = &buf[..len as usize];
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    Ok(String::from_utf8_lossy(&raw[..end]).into_owned())
}

/// A socket that runs another congestion control than the one asked for, even after it was
/// set again.
#[derive(Debug, thiserror::Error)]
#[error("{in_force} stays in force ({})", match .refused {
    Some(e) => format!("setting {asked} again: {e}"),
    None => format!("{asked} was set again but {in_force} reads back"),
})]
pub struct NotInForce {
    /// The algorithm asked for.
    pub asked: String,
    /// The algorithm the socket runs.
    pub in_force: String,
    /// The kernel's refusal to set it again (`EPERM` under a route's `congctl lock`), if it
    /// refused.
    pub refused: Option<io::Error>,
}

/// Why [`match_congestion`] failed.
#[derive(Debug, thiserror::Error)]
pub enum MatchError {
    /// `TCP_CONGESTION` could not be read.
    #[error("reading TCP_CONGESTION: {0}")]
    Read(#[from] io::Error),
    /// The socket keeps another algorithm.
    #[error(transparent)]
    NotInForce(#[from] NotInForce),
}

/// Makes a connected or accepted socket run `name`. A route's `congctl` replaces, at connect
/// and at accept, whatever was set before (the kernel's `tcp_ca_dst_init` and
/// `tcp_ca_openreq_child`), so the algorithm is read back and, if it differs, set again and
/// read back once more. Under `congctl lock` the kernel refuses any change (`EPERM`, even to
/// the algorithm in force, which is why an equal one is not set again).
pub fn match_congestion(sock: &impl AsFd, name: &str) -> Result<(), MatchError> {
    if congestion(sock)? == name {
        return Ok(());
    }
    let refused = set_congestion(sock, name).err();
    let in_force = congestion(sock)?;
    if in_force == name {
        return Ok(());
    }
    Err(NotInForce {
        asked: name.to_string(),
        in_force,
        refused,
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_and_reads_back_every_usable_algorithm() {
        let cat = CcCatalog::read().unwrap();
        assert!(cat.available.contains(&"reno".to_string()));
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        for name in cat.available.iter().filter(|n| cat.usable(n, privileged())) {
            set_congestion(&sock, name).unwrap();
            assert_eq!(&congestion(&sock).unwrap(), name);
        }
        let err = set_congestion(&sock, "no-such-cc").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }

    #[tokio::test]
    async fn a_connected_socket_is_made_to_run_the_algorithm_asked_for() {
        let l = crate::transport::listen("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = l.local_addr().unwrap();
        let (c, s) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let (c, _s) = (c.unwrap(), s.unwrap());
        set_congestion(&c, "reno").unwrap();
        match_congestion(&c, "cubic").unwrap();
        assert_eq!(congestion(&c).unwrap(), "cubic");
        match_congestion(&c, "cubic").unwrap();
        match match_congestion(&c, "no-such-cc") {
            Err(MatchError::NotInForce(m)) => {
                assert_eq!(
                    (m.asked.as_str(), m.in_force.as_str()),
                    ("no-such-cc", "cubic")
                );
                assert_eq!(m.refused.unwrap().raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn usable_needs_registration_and_permission() {
        let cat = CcCatalog {
            available: vec!["reno".into(), "cubic".into()],
            allowed: vec!["reno".into()],
            default: "reno".into(),
        };
        assert!(cat.usable("reno", false));
        assert!(!cat.usable("cubic", false));
        assert!(cat.usable("cubic", true));
        assert!(!cat.usable("htcp", true));
    }
}
