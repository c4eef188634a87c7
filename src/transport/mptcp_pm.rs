//! The userspace MPTCP path manager, spoken over generic netlink (the `mptcp_pm` family) with
//! rust-netlink's packet crates. A connection whose socket was made while its network
//! namespace selected the userspace manager (`net.mptcp.pm_type` = 1) opens subflows only
//! when asked ([`PmSocket::create_subflow`]), without the in-kernel manager's limit of 8
//! extra; an accepted connection of that kind takes joins without a limit while some
//! process listens to the family's events ([`EventListener`]). Root only.

use std::io;
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    DecodeError, Emitable, NetlinkMessage, NetlinkPayload, Nla, ParseableParametrized,
    NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_generic::ctrl::nlas::{GenlCtrlAttrs, McastGrpAttrs};
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::protocols::NETLINK_GENERIC;
use netlink_sys::{Socket, SocketAddr as NetlinkAddr};

use super::ns_settings::{forget_dead_raises, Raised, Setting};

/// The family's name and its events' multicast group (linux/mptcp_pm.h).
const FAMILY: &str = "mptcp_pm";
const EVENTS_GROUP: &str = "mptcp_pm_events";
const FAMILY_VERSION: u8 = 1;
/// `MPTCP_PM_CMD_SUBFLOW_CREATE`.
const CMD_SUBFLOW_CREATE: u8 = 10;
/// `MPTCP_PM_ATTR_ADDR`, `MPTCP_PM_ATTR_TOKEN`, `MPTCP_PM_ATTR_ADDR_REMOTE`.
const ATTR_ADDR: u16 = 1;
const ATTR_TOKEN: u16 = 4;
const ATTR_ADDR_REMOTE: u16 = 6;
/// `MPTCP_PM_ADDR_ATTR_FAMILY`, `_ID`, `_ADDR4`, `_ADDR6`, `_PORT`.
const ADDR_FAMILY: u16 = 1;
const ADDR_ID: u16 = 2;
const ADDR_ADDR4: u16 = 3;
const ADDR_ADDR6: u16 = 4;
const ADDR_PORT: u16 = 5;
/// The local address id hsxfer gives the addresses it opens subflows from (any id but 0,
/// which names the first subflow's address, will do; one per address).
const LOCAL_ID: u8 = 1;
/// Where the namespace selects its path manager: 0 in-kernel, 1 userspace.
const PM_TYPE: &str = "/proc/sys/net/mptcp/pm_type";

/// One attribute of a path-manager request.
#[derive(Debug, Clone)]
enum Attr {
    Token(u32),
    /// The local (`ATTR_ADDR`) or remote (`ATTR_ADDR_REMOTE`) address, nested.
    Addr(u16, Vec<AddrAttr>),
}

/// One attribute of a nested address.
#[derive(Debug, Clone)]
enum AddrAttr {
    Family(u16),
    Id(u8),
    Ip(IpAddr),
    Port(u16),
}

impl Nla for AddrAttr {
    fn value_len(&self) -> usize {
        match self {
            AddrAttr::Family(_) | AddrAttr::Port(_) => 2,
            AddrAttr::Id(_) => 1,
            AddrAttr::Ip(IpAddr::V4(_)) => 4,
            AddrAttr::Ip(IpAddr::V6(_)) => 16,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            AddrAttr::Family(_) => ADDR_FAMILY,
            AddrAttr::Id(_) => ADDR_ID,
            AddrAttr::Ip(IpAddr::V4(_)) => ADDR_ADDR4,
            AddrAttr::Ip(IpAddr::V6(_)) => ADDR_ADDR6,
            AddrAttr::Port(_) => ADDR_PORT,
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            // Family and port in host order; addresses in network order, as the kernel
            // reads them (nla_get_u16, nla_get_in_addr).
            AddrAttr::Family(v) | AddrAttr::Port(v) => buf[..2].copy_from_slice(&v.to_ne_bytes()),
            AddrAttr::Id(v) => buf[0] = *v,
            AddrAttr::Ip(IpAddr::V4(a)) => buf[..4].copy_from_slice(&a.octets()),
            AddrAttr::Ip(IpAddr::V6(a)) => buf[..16].copy_from_slice(&a.octets()),
        }
    }
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match self {
            Attr::Token(_) => 4,
            Attr::Addr(_, nested) => nested.as_slice().buffer_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Attr::Token(_) => ATTR_TOKEN,
            Attr::Addr(kind, _) => kind | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            Attr::Token(t) => buf[..4].copy_from_slice(&t.to_ne_bytes()),
            Attr::Addr(_, nested) => nested.as_slice().emit(buf),
        }
    }
}

/// Which path manager a server's MPTCP connections run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathManagerKind {
    /// The in-kernel one: the server announces extra ports, each client opens up to 8 extra
    /// subflows to them.
    #[default]
    Kernel,
    /// The userspace one: clients open their own subflows, as many as they ask for (hsxfer
    /// clients as root, with more than 9 channels); clients that wait for announced ports
    /// get one subflow.
    Userspace,
}

impl std::str::FromStr for PathManagerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kernel" => Ok(PathManagerKind::Kernel),
            "userspace" => Ok(PathManagerKind::Userspace),
            _ => Err(format!(
                "unknown path manager '{s}': give kernel or userspace"
            )),
        }
    }
}

/// A request to the `mptcp_pm` family; the kernel's answer to it is only an acknowledgment.
#[derive(Debug, Clone)]
struct Request {
    cmd: u8,
    attrs: Vec<Attr>,
}

impl GenlFamily for Request {
    fn family_name() -> &'static str {
        FAMILY
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        FAMILY_VERSION
    }
}

impl Emitable for Request {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buf: &mut [u8]) {
        self.attrs.as_slice().emit(buf)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for Request {
    /// Answers carry no attributes hsxfer reads.
    fn parse_with_param(_: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Request {
            cmd: header.cmd,
            attrs: Vec::new(),
        })
    }
}

/// An address as the family nests it: family, id (local addresses), address, port (remote
/// addresses).
fn address(ip: IpAddr, id: Option<u8>, port: Option<u16>) -> Vec<AddrAttr> {
    let family = match ip {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    } as u16;
    let mut a = vec![AddrAttr::Family(family)];
    a.extend(id.map(AddrAttr::Id));
    a.push(AddrAttr::Ip(ip));
    a.extend(port.map(AddrAttr::Port));
    a
}

/// A generic netlink socket talking to the `mptcp_pm` family.
#[derive(Debug)]
pub struct PmSocket {
    socket: Socket,
    family: u16,
    events_group: u32,
}

impl PmSocket {
    /// Opens a socket and finds the family (and its events group) in this namespace.
    pub fn open() -> io::Result<PmSocket> {
        let mut socket = Socket::new(NETLINK_GENERIC)?;
        socket.bind_auto()?;
        socket.connect(&NetlinkAddr::new(0, 0))?;
        let mut ask = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(FAMILY.into())],
        });
        ask.finalize();
        let mut msg = NetlinkMessage::from(ask);
        msg.header.flags = NLM_F_REQUEST;
        msg.finalize();
        let mut out = vec![0; msg.buffer_len()];
        msg.serialize(&mut out);
        socket.send(&out, 0)?;
        let (answer, _) = socket.recv_from_full()?;
        let parsed = <NetlinkMessage<GenlMessage<GenlCtrl>>>::deserialize(&answer)
            .map_err(|e| io::Error::other(format!("the {FAMILY} family's description: {e}")))?;
        let nlas = match parsed.payload {
            NetlinkPayload::InnerMessage(m) => m.payload.nlas,
            NetlinkPayload::Error(e) => {
                return Err(io::Error::other(format!(
                    "no {FAMILY} generic netlink family here (is MPTCP built in?): {e}"
                )))
            }
            _ => Vec::new(),
        };
        let family = nlas.iter().find_map(|a| match a {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        });
        let events_group = nlas
            .iter()
            .filter_map(|a| match a {
                GenlCtrlAttrs::McastGroups(groups) => Some(groups),
                _ => None,
            })
            .flatten()
            .find_map(|g| {
                let named = g
                    .iter()
                    .any(|a| matches!(a, McastGrpAttrs::Name(n) if n == EVENTS_GROUP));
                let id = g.iter().find_map(|a| match a {
                    McastGrpAttrs::Id(id) => Some(*id),
                    _ => None,
                });
                id.filter(|_| named)
            });
        match (family, events_group) {
            (Some(family), Some(events_group)) => Ok(PmSocket {
                socket,
                family,
                events_group,
            }),
            _ => Err(io::Error::other(format!(
                "the {FAMILY} family names no id or no {EVENTS_GROUP} group"
            ))),
        }
    }

    /// Asks for one more subflow of the connection named `token` (this end's token, from
    /// `MPTCP_INFO`), from `local` (any port) to `remote`. The kernel starts it and returns;
    /// the peer may still refuse the join.
    pub fn create_subflow(
        &mut self,
        token: u32,
        local: IpAddr,
        remote: SocketAddr,
    ) -> io::Result<()> {
        self.request(Request {
            cmd: CMD_SUBFLOW_CREATE,
            attrs: vec![
                Attr::Token(token),
                Attr::Addr(ATTR_ADDR, address(local, Some(LOCAL_ID), None)),
                Attr::Addr(
                    ATTR_ADDR_REMOTE,
                    address(remote.ip(), None, Some(remote.port())),
                ),
            ],
        })
    }

    /// Sends `req` and waits for the kernel's acknowledgment.
    fn request(&mut self, req: Request) -> io::Result<()> {
        let mut genl = GenlMessage::from_payload(req);
        genl.set_resolved_family_id(self.family);
        genl.finalize();
        let mut msg = NetlinkMessage::from(genl);
        msg.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        msg.finalize();
        let mut out = vec![0; msg.buffer_len()];
        msg.serialize(&mut out);
        self.socket.send(&out, 0)?;
        let (answer, _) = self.socket.recv_from_full()?;
        let parsed = <NetlinkMessage<GenlMessage<Request>>>::deserialize(&answer)
            .map_err(|e| io::Error::other(format!("{FAMILY} answer: {e}")))?;
        match parsed.payload {
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// A socket that listens to the path manager's events. While one is open in a namespace,
/// the connections there that run the userspace path manager accept joins, without a limit.
/// The events themselves are not read: when its buffer is full the kernel drops them.
#[derive(Debug)]
pub struct EventListener {
    _socket: Socket,
}

impl EventListener {
    /// Opens the socket and joins the events group.
    pub fn subscribe() -> io::Result<EventListener> {
        let pm = PmSocket::open()?;
        pm.socket.add_membership(pm.events_group)?;
        Ok(EventListener { _socket: pm.socket })
    }
}

/// The namespace's path manager type (`net.mptcp.pm_type`): 0 the in-kernel one, 1 the
/// userspace one. Raised to 1 while a server or a client's connection needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PmType(u8);

impl Setting for PmType {
    const NAME: &'static str = "mptcp-pm-type";

    fn read() -> io::Result<PmType> {
        let text = std::fs::read_to_string(PM_TYPE)?;
        text.trim()
            .parse()
            .map(PmType)
            .map_err(|e| io::Error::other(format!("{PM_TYPE}: {e}: {text}")))
    }

    fn set(&self) -> io::Result<()> {
        std::fs::write(PM_TYPE, self.0.to_string())
    }

    fn max(self, other: PmType) -> PmType {
        PmType(self.0.max(other.0))
    }

    fn words(&self) -> String {
        self.0.to_string()
    }

    fn from_words(w: &[&str]) -> Option<PmType> {
        w.first()?.parse().ok().map(PmType)
    }
}

/// The userspace path manager's type.
const USERSPACE: PmType = PmType(1);

/// Runs `make` (which creates an MPTCP socket) while this namespace selects the userspace
/// path manager, then selects again what the namespace needs without it. A socket takes its
/// manager when it is made; other MPTCP sockets made by other processes in that instant take
/// the userspace one too (and then open no subflows of their own).
pub fn with_userspace_pm<T>(make: impl FnOnce() -> T) -> io::Result<T> {
    let _selected = Raised::to(USERSPACE)?;
    Ok(make())
}

/// Selects again the path manager from before the userspace one that killed processes
/// left selected (no one put it back): for a server or copy of the in-kernel path manager,
/// whose announcements and subflows it would otherwise refuse (root only).
pub fn forget_killed_selections() -> io::Result<()> {
    forget_dead_raises::<PmType>()
}

/// This namespace selects the userspace path manager while this lives (a server's accepted
/// connections take the manager selected when they arrive), and when dropped what it needs
/// without it.
#[derive(Debug)]
pub struct UserspacePm {
    _selected: Raised<PmType>,
}

impl UserspacePm {
    /// Selects the userspace path manager (root only).
    pub fn select() -> io::Result<UserspacePm> {
        Ok(UserspacePm {
            _selected: Raised::to(USERSPACE)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_address_nests_family_id_and_address() {
        let a = Attr::Addr(
            ATTR_ADDR,
            address("10.9.1.1".parse().unwrap(), Some(1), None),
        );
        let mut buf = vec![0u8; a.buffer_len()];
        a.emit(&mut buf);
        // Outer header: length, then the kind with the nested flag.
        assert_eq!(
            u16::from_ne_bytes([buf[2], buf[3]]),
            ATTR_ADDR | NLA_F_NESTED
        );
        // Family (2 bytes, padded to 4), id (1, padded to 4), IPv4 (4): 8 + 8 + 8 bytes.
        assert_eq!(buf.len(), 4 + 8 + 8 + 8);
        assert_eq!(&buf[buf.len() - 4..], &[10, 9, 1, 1]);
        let r = Attr::Addr(
            ATTR_ADDR_REMOTE,
            address("fd00::2".parse().unwrap(), None, Some(7700)),
        );
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf);
        assert_eq!(buf.len(), 4 + 8 + 20 + 8);
        assert_eq!(
            u16::from_ne_bytes([buf[buf.len() - 4], buf[buf.len() - 3]]),
            7700
        );
    }
}
