//! What is registered: kernel or BPF congestion controls, pinned or held by a process, and
//! the guard's counters of hsxfer's own programs. Reading BPF objects by id needs root;
//! without it the answers fall back to what `/proc` says.

use std::mem::offset_of;

use libbpf_rs::query::{LinkInfoIter, LinkTypeInfo, MapInfoIter};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};
use serde::Serialize;

use super::{ops_name, pin_path};
use crate::channels::telemetry::GuardCounters;
use crate::transport::cc::CcCatalog;

/// Who provides a registered congestion control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Not registered.
    Absent,
    /// Built into the kernel or a kernel module.
    Kernel,
    /// A BPF struct_ops program held by a running process.
    Bpf,
    /// A BPF struct_ops program pinned under /sys/fs/bpf/hsxfer (stays until unloaded).
    BpfPinned,
    /// Registered, but this process may not look at BPF objects (not root).
    Unknown,
}

impl Origin {
    /// Words for messages and `cc list`.
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Absent => "not registered",
            Origin::Kernel => "kernel",
            Origin::Bpf => "BPF, held by a running process",
            Origin::BpfPinned => "BPF, pinned",
            Origin::Unknown => "registered (run as root to see by whom)",
        }
    }
}

/// Where congestion control `name` comes from on this host.
pub fn origin(name: &str) -> Origin {
    let registered = CcCatalog::read()
        .map(|c| c.available.iter().any(|a| a == name))
        .unwrap_or(false);
    if !registered {
        return Origin::Absent;
    }
    if !crate::transport::cc::privileged() {
        return Origin::Unknown;
    }
    if struct_ops_links(ops_name(name)).is_empty() {
        Origin::Kernel
    } else if pin_path(name).exists() {
        Origin::BpfPinned
    } else {
        Origin::Bpf
    }
}

/// Ids of the struct_ops links whose map is called `name` (a congestion control's
/// `ops_name`).
pub fn struct_ops_links(name: &str) -> Vec<u32> {
    LinkInfoIter::default()
        .filter_map(|l| match l.info {
            LinkTypeInfo::StructOps(s) => Some((l.id, s.map_id)),
            _ => None,
        })
        .filter(|(_, map_id)| map_name(*map_id).as_deref() == Some(name))
        .map(|(id, _)| id)
        .collect()
}

fn map_name(id: u32) -> Option<String> {
    MapInfoIter::default()
        .find(|m| m.id == id)
        .map(|m| m.name.to_string_lossy().into_owned())
}

/// The map called `name` of type `ty`: the newest live one, opened by id (root), or else
/// the one `hsxfer cc load --pin` shared in [`super::PIN_DIR`], opened read-only unless
/// `write` (any user, as the pin's mode allows).
pub(crate) fn find_map(name: &str, ty: MapType, write: bool) -> Option<MapHandle> {
    let newest = MapInfoIter::default()
        .filter(|m| m.ty == ty && m.name.to_string_lossy() == name)
        .map(|m| m.id)
        .max();
    if let Some(map) = newest.and_then(|id| MapHandle::from_map_id(id).ok()) {
        return Some(map);
    }
    let flags = if write {
        0
    } else {
        libbpf_rs::libbpf_sys::BPF_F_RDONLY
    };
    MapHandle::from_pinned_path_with_file_flags(super::pin_path(name), flags)
        .ok()
        .filter(|m| m.map_type() == ty)
}

/// How many of the latest ssthresh repairs [`CcStats::recent`] keeps (`HSX_RECENT_REPAIRS`).
pub const RECENT_REPAIRS: usize = 16;

/// One ssthresh repair of the guard (`struct hsx_repair` of bpf/hsxfer_cc.h): a garbage value
/// seen in TCP_INFO can be matched with the repair that removed it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[repr(C)]
pub struct Repair {
    /// The garbage ssthresh replaced.
    pub garbage: u32,
    /// Microseconds since the guard last ran on the socket: how long no hook of the program
    /// ran while the garbage could be there.
    pub gap_us: u32,
    /// The repair's number, from 1 (`ssthresh_repairs` counts them).
    pub seq: u32,
    /// The socket's congestion-avoidance state then (a `set_state` hook runs before the
    /// kernel changes it: 0 or 1 means the repair came as recovery began).
    pub state: u8,
    /// The kernel stored the garbage without running the program's ssthresh hook.
    pub skipped: bool,
}

/// Counters every hsxfer BPF congestion control keeps (its `NAME_stats` map): `struct
/// hsx_stats` of bpf/hsxfer_cc.h, field for field (a unit test checks the layout against
/// the BTF of every bundled object).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[repr(C)]
pub struct CcStats {
    /// Sockets that ran it, each counted at the first of its hooks that ran (the kernel
    /// skips a call now and then, `init` included).
    pub sockets: u64,
    /// Sockets that stopped using it.
    pub released: u64,
    /// Garbage ssthresh values the guard replaced.
    pub ssthresh_repairs: u64,
    /// Absurd cwnd jumps the guard clamped.
    pub cwnd_repairs: u64,
    /// Of the ssthresh repairs, those written while the program's ssthresh hook provably did
    /// not run (the kernel skipped the call: docs/cc.md, "The guard").
    pub skipped_ssthresh: u64,
    /// The last garbage ssthresh the guard replaced (0: none yet).
    pub last_garbage: u64,
    /// The latest ssthresh repairs, oldest first (at most [`RECENT_REPAIRS`]).
    #[serde(rename = "recent_repairs", serialize_with = "in_order")]
    pub recent: [Repair; RECENT_REPAIRS],
}

/// The ring of recent repairs as a list, oldest first, without its empty slots.
fn in_order<S: serde::Serializer>(
    ring: &[Repair; RECENT_REPAIRS],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(CcStats::ordered(ring))
}

impl CcStats {
    /// Decodes the map value (native-endian, as the kernel holds it).
    pub fn decode(v: &[u8]) -> Option<CcStats> {
        if v.len() < size_of::<CcStats>() {
            return None;
        }
        let word = |o: usize| u64::from_ne_bytes(v[o..o + 8].try_into().unwrap());
        let half = |o: usize| u32::from_ne_bytes(v[o..o + 4].try_into().unwrap());
        let mut recent = [Repair::default(); RECENT_REPAIRS];
        for (i, r) in recent.iter_mut().enumerate() {
            let at = offset_of!(CcStats, recent) + i * size_of::<Repair>();
            *r = Repair {
                garbage: half(at + offset_of!(Repair, garbage)),
                gap_us: half(at + offset_of!(Repair, gap_us)),
                seq: half(at + offset_of!(Repair, seq)),
                state: v[at + offset_of!(Repair, state)],
                skipped: v[at + offset_of!(Repair, skipped)] != 0,
            };
        }
        Some(CcStats {
            sockets: word(offset_of!(CcStats, sockets)),
            released: word(offset_of!(CcStats, released)),
            ssthresh_repairs: word(offset_of!(CcStats, ssthresh_repairs)),
            cwnd_repairs: word(offset_of!(CcStats, cwnd_repairs)),
            skipped_ssthresh: word(offset_of!(CcStats, skipped_ssthresh)),
            last_garbage: word(offset_of!(CcStats, last_garbage)),
            recent,
        })
    }

    /// Repairs of both kinds.
    pub fn repairs(&self) -> u64 {
        self.ssthresh_repairs + self.cwnd_repairs
    }

    /// The latest ssthresh repairs, oldest first.
    pub fn recent_repairs(&self) -> Vec<Repair> {
        Self::ordered(&self.recent)
    }

    fn ordered(ring: &[Repair; RECENT_REPAIRS]) -> Vec<Repair> {
        let mut v: Vec<Repair> = ring.iter().copied().filter(|r| r.seq != 0).collect();
        v.sort_by_key(|r| r.seq);
        v
    }
}

/// The counters of hsxfer's program `name`, if one is loaded and this process may read it.
pub fn stats(name: &str) -> Option<CcStats> {
    let map = find_map(&super::find(name)?.map_name("stats"), MapType::Array, false)?;
    let v = map.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).ok()??;
    CcStats::decode(&v)
}

/// The guard counters of some bundled congestion controls at one moment, so a transfer can
/// report the repairs made while it ran.
#[derive(Debug, Clone)]
pub struct GuardBaseline {
    start: Vec<(String, CcStats)>,
}

impl GuardBaseline {
    /// Reads the counters of those of `names` that are hsxfer's programs and readable here
    /// (root); None when there are none.
    pub fn read<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<GuardBaseline> {
        let mut start: Vec<(String, CcStats)> = Vec::new();
        for name in names {
            if start.iter().any(|(n, _)| n == name) {
                continue;
            }
            if let Some(s) = stats(name) {
                start.push((name.to_string(), s));
            }
        }
        (!start.is_empty()).then_some(GuardBaseline { start })
    }

    /// The repairs made since the baseline was read.
    pub fn since(&self) -> GuardCounters {
        let mut sum = GuardCounters::default();
        for (name, before) in &self.start {
            let now = stats(name).unwrap_or(*before);
            sum.ssthresh_repairs += now.ssthresh_repairs.saturating_sub(before.ssthresh_repairs);
            sum.cwnd_repairs += now.cwnd_repairs.saturating_sub(before.cwnd_repairs);
            sum.skipped_ssthresh += now.skipped_ssthresh.saturating_sub(before.skipped_ssthresh);
        }
        sum
    }
}

/// One line of `hsxfer cc list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CcEntry {
    /// Its name.
    pub name: String,
    /// Whether hsxfer bundles a BPF version.
    pub bundled: bool,
    /// Who provides the registered one.
    pub origin: Origin,
    /// Whether unprivileged processes may select it (`tcp_allowed_congestion_control`, or a
    /// BPF program registered with TCP_CONG_NON_RESTRICTED).
    pub allowed: bool,
    /// Whether it is the host default.
    pub default: bool,
    /// The guard's counters, for hsxfer's own programs.
    pub stats: Option<CcStats>,
}

/// Every congestion control the kernel has registered plus every bundled one.
pub fn list() -> std::io::Result<Vec<CcEntry>> {
    let cat = CcCatalog::read()?;
    let mut names: Vec<String> = cat.available.clone();
    for b in super::BUNDLED {
        if !names.iter().any(|n| n == b.name) {
            names.push(b.name.to_string());
        }
    }
    Ok(names
        .into_iter()
        .map(|name| {
            let origin = origin(&name);
            let ours = matches!(origin, Origin::Bpf | Origin::BpfPinned);
            CcEntry {
                bundled: super::find(&name).is_some(),
                allowed: cat.allowed.contains(&name),
                default: cat.default == name,
                stats: if ours { stats(&name) } else { None },
                origin,
                name,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_decode_counters_and_recent_repairs_in_order() {
        let mut v = Vec::new();
        for w in [7u64, 5, 18, 1, 1, 0x02e1_d340] {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        // Repairs 17 and 18 took the ring's slots 1 and 2 after 3..=16 filled the others.
        for slot in 0..RECENT_REPAIRS as u32 {
            let seq = if slot <= 2 { slot + 16 } else { slot };
            let (garbage, gap_us, state, skipped) = (1000 + seq, 4200, 3u8, seq % 2);
            for h in [garbage, gap_us, seq] {
                v.extend_from_slice(&h.to_ne_bytes());
            }
            v.extend_from_slice(&[state, skipped as u8, 0, 0]);
        }
        let s = CcStats::decode(&v).unwrap();
        assert_eq!((s.sockets, s.released, s.repairs()), (7, 5, 19));
        assert_eq!((s.skipped_ssthresh, s.last_garbage), (1, 0x02e1_d340));
        let recent = s.recent_repairs();
        let seqs: Vec<u32> = recent.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (3..=18).collect::<Vec<u32>>());
        assert_eq!(
            recent.last().copied(),
            Some(Repair {
                garbage: 1018,
                gap_us: 4200,
                seq: 18,
                state: 3,
                skipped: false
            })
        );
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["recent_repairs"][0]["seq"], 3);
        assert_eq!(json["recent_repairs"][15]["garbage"], 1018);
        assert_eq!(CcStats::decode(&v[..v.len() - 1]), None);
    }
}
