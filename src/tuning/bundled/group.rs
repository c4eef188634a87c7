//! DMCTCP groups for plain TCP: the channels of one transfer share a tag, set on each sending
//! socket before its congestion control starts, so the BPF program knows which windows to
//! compare. One tag per transfer; two transfers never share a group. The group's counters
//! (cuts, losses kept, channels) are read back for the transfer summary.

use std::mem::offset_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Mutex, OnceLock};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use super::inspect::find_map;
use crate::transport::tcp::SocketTag;
use crate::tuning::models::dmctcp;

/// What a DMCTCP group did during a transfer (the wire type of the telemetry).
pub use crate::channels::telemetry::DmcCounters as GroupCounters;

/// `struct dmc_group` of bpf/dmctcp.bpf.c, the value of its `PREFIX_groups` map. A unit test
/// checks every field's offset and the size against the BTF of the bundled object.
#[repr(C)]
pub(super) struct GroupValue {
    pub(super) lock: u32,
    pub(super) used: u32,
    pub(super) channels: u32,
    pub(super) channels_peak: u32,
    pub(super) first_ssthresh: u32,
    pub(super) pad: u32,
    pub(super) last_cut_us: u64,
    pub(super) cuts: u64,
    pub(super) losses_kept: u64,
    pub(super) ss_adopted: u64,
    pub(super) cwnd: [u32; DMC_MAX_CHANNELS],
    pub(super) seen_us: [u64; DMC_MAX_CHANNELS],
    pub(super) epoch_us: u64,
    pub(super) w_max: u32,
    pub(super) k_ms: u32,
    pub(super) mptcp_token: u32,
    pub(super) uid: u32,
}

/// `DMC_MAX_CHANNELS` of bpf/dmctcp.bpf.c.
const DMC_MAX_CHANNELS: usize = 32;

/// User space reads only the fields before `seen_us`, which older objects lack.
const GROUP_VALUE_READ: usize = offset_of!(GroupValue, seen_us);

/// Decodes the BPF map value of a group.
pub fn decode(v: &[u8]) -> Option<GroupCounters> {
    if v.len() < GROUP_VALUE_READ {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes(v[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(v[o..o + 8].try_into().unwrap());
    Some(GroupCounters {
        channels: u32_at(offset_of!(GroupValue, channels_peak)),
        cuts: u64_at(offset_of!(GroupValue, cuts)),
        losses_kept: u64_at(offset_of!(GroupValue, losses_kept)),
        slow_start_adopted: u64_at(offset_of!(GroupValue, ss_adopted)),
    })
}

/// `mptcp_token` of a group value, if the value has it (older objects do not).
fn token_of(v: &[u8]) -> Option<u32> {
    let at = offset_of!(GroupValue, mptcp_token);
    v.get(at..at + 4)
        .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
}

/// The DMCTCP group of one transfer. The program removes the group with its last channel.
///
/// TCP channels form the group by its tag. The subflows of an MPTCP connection form one in the
/// kernel by themselves (keyed by their connection, with no tag and no root needed); after
/// [`DmcGroup::follow_mptcp`] the counters are those of that group.
#[derive(Debug)]
pub struct DmcGroup {
    tag: u64,
    tags: MapHandle,
    groups: MapHandle,
    /// The MPTCP connection whose group this is, by its token.
    mptcp_token: OnceLock<u32>,
    /// That group's key in the map once found.
    mptcp_key: Mutex<Option<u64>>,
}

impl DmcGroup {
    /// A fresh group of DMCTCP build `cc` (`dmctcp` or `dmctcp_classic`), if that program is
    /// loaded and this process may reach its maps: root always, any user once `hsxfer cc
    /// load CC --pin` has shared them. Without them, each socket is a group of its own.
    pub fn new(cc: &str) -> Option<DmcGroup> {
        let cc = super::find(cc).filter(|_| dmctcp::grouped(cc))?;
        let tags = find_map(&cc.map_name("tags"), MapType::SkStorage, true)?;
        let groups = find_map(&cc.map_name("groups"), MapType::Hash, false)?;
        // Tags below 2^63: the program keys MPTCP groups by kernel addresses, which are above.
        let tag = loop {
            let t = rand::random::<u64>() >> 1;
            if t != 0 {
                break t;
            }
        };
        Some(DmcGroup {
            tag,
            tags,
            groups,
            mptcp_token: OnceLock::new(),
            mptcp_key: Mutex::new(None),
        })
    }

    /// The group's tag.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Puts `sock` in the group. Call before the socket's congestion control starts (before
    /// `connect`, or before setting `TCP_CONGESTION` on an accepted socket).
    pub fn join(&self, sock: &impl AsFd) -> std::io::Result<()> {
        let fd: i32 = sock.as_fd().as_raw_fd();
        self.tags
            .update(&fd.to_ne_bytes(), &self.tag.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| std::io::Error::other(format!("tagging a socket for dmctcp: {e}")))
    }

    /// Makes this the group of the subflows of the MPTCP connection on `sock`; false when the
    /// connection runs as plain TCP (it fell back), whose socket is in the tagged group.
    pub fn follow_mptcp(&self, sock: &impl AsFd) -> bool {
        match crate::transport::mptcp::token(sock) {
            Some(t) => self.mptcp_token.set(t).is_ok() || self.mptcp_token.get() == Some(&t),
            None => false,
        }
    }

    /// The group's counters so far (None before any channel joined, and for an MPTCP group
    /// once its last subflow closed).
    pub fn counters(&self) -> Option<GroupCounters> {
        let Some(&token) = self.mptcp_token.get() else {
            let v = self
                .groups
                .lookup(&self.tag.to_ne_bytes(), MapFlags::ANY)
                .ok()??;
            return decode(&v);
        };
        let mut key = self.mptcp_key.lock().unwrap_or_else(|e| e.into_inner());
        let ours = |v: &[u8]| token_of(v) == Some(token);
        if let Some(k) = *key {
            match self.groups.lookup(&k.to_ne_bytes(), MapFlags::ANY) {
                Ok(Some(v)) if ours(&v) => return decode(&v),
                _ => *key = None,
            }
        }
        // Found once by a scan: the key is the connection's kernel address.
        for k in self.groups.keys() {
            if let Ok(Some(v)) = self.groups.lookup(&k, MapFlags::ANY) {
                if ours(&v) {
                    *key = k.as_slice().try_into().ok().map(u64::from_ne_bytes);
                    return decode(&v);
                }
            }
        }
        None
    }
}

impl SocketTag for DmcGroup {
    fn what(&self) -> &'static str {
        "joining the dmctcp group"
    }

    fn tag(&self, sock: BorrowedFd<'_>) -> std::io::Result<()> {
        self.join(&sock)
    }
}

impl PartialEq for DmcGroup {
    fn eq(&self, other: &Self) -> bool {
        self.tag == other.tag
    }
}

impl Eq for DmcGroup {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_group_layout() {
        let mut v = vec![0u8; GROUP_VALUE_READ];
        v[12..16].copy_from_slice(&4u32.to_ne_bytes());
        v[32..40].copy_from_slice(&9u64.to_ne_bytes());
        v[40..48].copy_from_slice(&31u64.to_ne_bytes());
        v[48..56].copy_from_slice(&2u64.to_ne_bytes());
        let c = decode(&v).unwrap();
        assert_eq!(
            c,
            GroupCounters {
                cuts: 9,
                losses_kept: 31,
                channels: 4,
                slow_start_adopted: 2
            }
        );
        assert_eq!(decode(&v[..100]), None);
    }
}
