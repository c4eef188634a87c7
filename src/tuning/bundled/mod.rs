//! The congestion controls hsxfer bundles as BPF `struct_ops` programs (DMCTCP and the
//! high-speed variants of the research), so they can be used on any kernel with BTF and
//! without building kernel modules.
//!
//! The objects are built from `bpf/*.bpf.c` by `make -C bpf` and committed under `bpf/obj/`,
//! so `cargo build` needs no clang; `make -C bpf check` proves they match their sources.
//! [`Registration`] registers one with the kernel; [`inspect`] reads what is registered, by
//! whom, and the guard's repair counters; [`group`] tags DMCTCP channels with their transfer.

pub mod group;
pub mod inspect;
mod loader;

pub use loader::{detach, ensure_registered, unpin, Pinned, Registration};

use std::path::{Path, PathBuf};

use crate::tuning::models::dmctcp;

/// Where `hsxfer cc load --pin` pins registrations (one link per congestion control).
pub const PIN_DIR: &str = "/sys/fs/bpf/hsxfer";

/// The pin of congestion control `name`.
fn pin_path(name: &str) -> PathBuf {
    Path::new(PIN_DIR).join(name)
}

/// One bundled congestion control.
#[derive(Debug)]
pub struct BundledCc {
    /// The name it registers under (what `TCP_CONGESTION` takes).
    pub name: &'static str,
    /// One line on what it is.
    pub summary: &'static str,
    /// The compiled BPF object (CO-RE, relocated at load).
    object: &'static [u8],
    /// Its source and object under `bpf/` (`FILE.bpf.c`, `obj/FILE.bpf.o`).
    pub file: &'static str,
    /// Its struct_ops map, in the object and in the kernel, and the prefix of its other maps'
    /// names (`PREFIX_stats`): its name where that is a C identifier of at most 9 characters,
    /// since the kernel keeps 15 characters of a map's name.
    pub prefix: &'static str,
}

/// A map of a bundled program that users without root reach through its pin in [`PIN_DIR`]
/// (they cannot look maps up by id). The kernel checks the pin's file mode when they open it.
#[derive(Debug)]
pub struct SharedMap {
    /// The map's name in the object, and its pin's file name.
    pub name: String,
    /// Whether others may write it. Only a socket-storage map is: its key is a socket the
    /// writer holds, so a user can tag only their own sockets.
    pub writable: bool,
}

impl SharedMap {
    /// The pin's file mode: readable by all, and writable by all when [`SharedMap::writable`].
    pub fn mode(&self) -> u32 {
        if self.writable {
            0o666
        } else {
            0o644
        }
    }
}

impl BundledCc {
    /// The compiled BPF object.
    pub fn object(&self) -> &'static [u8] {
        self.object
    }

    /// The name of its map `PREFIX_suffix`: `stats` for every program, and `tags` and
    /// `groups` for a DMCTCP build.
    pub fn map_name(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix)
    }

    /// The maps `hsxfer cc load --pin` pins beside the registration for other users: its
    /// counters, and for a DMCTCP build its groups and (writable) tags, so that any user's
    /// channels form groups.
    pub fn shared_maps(&self) -> Vec<SharedMap> {
        let map = |suffix, writable| SharedMap {
            name: self.map_name(suffix),
            writable,
        };
        let mut maps = vec![map("stats", false)];
        if dmctcp::grouped(self.name) {
            maps.extend([map("tags", true), map("groups", false)]);
        }
        maps
    }
}

macro_rules! object {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/bpf/obj/",
            $name,
            ".bpf.o"
        ))
    };
}

/// Every bundled congestion control, DMCTCP first.
pub const BUNDLED: &[BundledCc] = &[
    BundledCc {
        name: "dmctcp",
        summary: "Desynchronized Multi-Channel TCP: only the largest channel of a transfer cuts, at most once per RTT (Cui 2013 ch. 5); paced, with a CUBIC-form growth curve for the group",
        object: object!("dmctcp"),
        file: "dmctcp",
        prefix: "dmctcp",
    },
    BundledCc {
        name: "highspeed",
        summary: "HighSpeed TCP, RFC 3649 table as Linux's tcp_highspeed",
        object: object!("highspeed"),
        file: "highspeed",
        prefix: "highspeed",
    },
    BundledCc {
        name: "scalable",
        summary: "Scalable TCP: +0.01 per ACKed segment, cut by 1/8, Reno below 16 segments",
        object: object!("scalable"),
        file: "scalable",
        prefix: "scalable",
    },
    BundledCc {
        name: "htcp",
        summary: "H-TCP (Leith & Shorten): increase by time since the last loss, adaptive backoff",
        object: object!("htcp"),
        file: "htcp",
        prefix: "htcp",
    },
    BundledCc {
        name: "bic",
        summary: "BIC-TCP: binary search increase toward the last maximum",
        object: object!("bic"),
        file: "bic",
        prefix: "bic",
    },
    BundledCc {
        name: "dmctcp_classic",
        summary: "DMCTCP with Cui 2013's rules only, for research comparisons: growth counted per ACK, no group curve, no pacing of its own",
        object: object!("dmctcp_classic"),
        file: "dmctcp_classic",
        prefix: "dmcc",
    },
];

/// The bundled congestion control called `name`, if hsxfer has one.
pub fn find(name: &str) -> Option<&'static BundledCc> {
    BUNDLED.iter().find(|b| b.name == name)
}

/// The name of congestion control `name`'s struct_ops map in the kernel: a bundled one's
/// [`BundledCc::prefix`], otherwise the name itself.
pub(crate) fn ops_name(name: &str) -> &str {
    find(name).map_or(name, |cc| cc.prefix)
}

/// Why a bundled congestion control could not be registered, unregistered or read.
#[derive(Debug, thiserror::Error)]
pub enum BundledError {
    /// The name is not one hsxfer bundles.
    #[error("hsxfer bundles no congestion control named '{0}'; bundled: dmctcp highspeed scalable htcp bic dmctcp_classic")]
    Unknown(String),
    /// The kernel already has a congestion control of that name (its own module, or ours
    /// registered by another process).
    #[error("congestion control '{0}' is already registered ({1})")]
    AlreadyRegistered(String, &'static str),
    /// Registering needs CAP_BPF and CAP_NET_ADMIN.
    #[error("registering congestion control '{0}' needs root (CAP_BPF and CAP_NET_ADMIN); run `sudo hsxfer cc load {0} --pin`")]
    NotPermitted(String),
    /// libbpf or the kernel refused (verifier, BTF, struct_ops support).
    #[error("{what} '{name}': {source}")]
    Bpf {
        /// What was being done.
        what: &'static str,
        /// The congestion control.
        name: String,
        /// The libbpf error.
        source: libbpf_rs::Error,
    },
    /// A file-system step (bpffs, pins) failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_object_is_a_bpf_elf_named_after_its_cc() {
        for cc in BUNDLED {
            let o = cc.object();
            assert_eq!(&o[..4], b"\x7fELF", "{}", cc.name);
            // e_machine 247 = EM_BPF, little-endian at offset 18.
            assert_eq!(u16::from_le_bytes([o[18], o[19]]), 247, "{}", cc.name);
            let name = format!("{}\0", cc.name);
            assert!(
                o.windows(name.len()).any(|w| w == name.as_bytes()),
                "{} object does not carry its name",
                cc.name
            );
            for map in cc.shared_maps() {
                let name = format!("{}\0", map.name);
                assert!(
                    o.windows(name.len()).any(|w| w == name.as_bytes()),
                    "{} object has no map {}",
                    cc.name,
                    map.name
                );
            }
        }
        assert!(find("dmctcp").is_some());
        assert!(find("cubic").is_none());
    }

    #[test]
    fn bpf_makefile_builds_exactly_the_catalogue() {
        let makefile = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/Makefile"));
        let ccs = makefile
            .lines()
            .find_map(|l| l.strip_prefix("CCS := "))
            .expect("bpf/Makefile has a CCS := line");
        let files: Vec<&str> = BUNDLED.iter().map(|b| b.file).collect();
        assert_eq!(ccs.split_whitespace().collect::<Vec<_>>(), files);
    }

    /// Member names and byte offsets of struct `name` in a bundled object's BTF, and its size.
    fn btf_layout(cc: &BundledCc, name: &str) -> (Vec<(String, u32)>, usize) {
        use libbpf_rs::btf::types::{MemberAttr, Struct};
        use libbpf_rs::btf::{Btf, HasSize};
        let btf = Btf::from_raw(cc.name, cc.object())
            .expect("the object parses")
            .expect("the object has BTF");
        let s: Struct = btf
            .type_by_name(name)
            .unwrap_or_else(|| panic!("{}: no struct {name}", cc.name));
        let members = s
            .iter()
            .map(|m| {
                let MemberAttr::Normal { offset } = m.attr else {
                    panic!("{}: {name} has a bitfield", cc.name)
                };
                let field = m
                    .name
                    .expect("named members")
                    .to_string_lossy()
                    .into_owned();
                (field, offset / 8)
            })
            .collect();
        (members, s.size())
    }

    fn fields(layout: &[(&str, usize)]) -> Vec<(String, u32)> {
        layout
            .iter()
            .map(|&(n, o)| (n.to_string(), o as u32))
            .collect()
    }

    /// Asserts that struct `name` has these fields and size in every bundled object's BTF.
    fn in_every_object(name: &str, layout: &[(&str, usize)], size: usize) {
        for cc in BUNDLED {
            assert_eq!(
                btf_layout(cc, name),
                (fields(layout), size),
                "{}: struct {name}",
                cc.name
            );
        }
    }

    #[test]
    fn the_rust_mirrors_of_bpf_structs_match_the_objects_btf() {
        use std::mem::{offset_of, size_of};
        let stats = [
            ("sockets", offset_of!(inspect::CcStats, sockets)),
            ("released", offset_of!(inspect::CcStats, released)),
            (
                "ssthresh_repairs",
                offset_of!(inspect::CcStats, ssthresh_repairs),
            ),
            ("cwnd_repairs", offset_of!(inspect::CcStats, cwnd_repairs)),
            (
                "skipped_ssthresh",
                offset_of!(inspect::CcStats, skipped_ssthresh),
            ),
            ("last_garbage", offset_of!(inspect::CcStats, last_garbage)),
            ("recent", offset_of!(inspect::CcStats, recent)),
        ];
        in_every_object("hsx_stats", &stats, size_of::<inspect::CcStats>());
        let repair = [
            ("garbage", offset_of!(inspect::Repair, garbage)),
            ("gap_us", offset_of!(inspect::Repair, gap_us)),
            ("seq", offset_of!(inspect::Repair, seq)),
            ("state", offset_of!(inspect::Repair, state)),
            ("skipped", offset_of!(inspect::Repair, skipped)),
        ];
        in_every_object("hsx_repair", &repair, size_of::<inspect::Repair>());
        use group::GroupValue as G;
        let group = [
            ("lock", offset_of!(G, lock)),
            ("used", offset_of!(G, used)),
            ("channels", offset_of!(G, channels)),
            ("channels_peak", offset_of!(G, channels_peak)),
            ("first_ssthresh", offset_of!(G, first_ssthresh)),
            ("pad", offset_of!(G, pad)),
            ("last_cut_us", offset_of!(G, last_cut_us)),
            ("cuts", offset_of!(G, cuts)),
            ("losses_kept", offset_of!(G, losses_kept)),
            ("ss_adopted", offset_of!(G, ss_adopted)),
            ("cwnd", offset_of!(G, cwnd)),
            ("seen_us", offset_of!(G, seen_us)),
            ("epoch_us", offset_of!(G, epoch_us)),
            ("w_max", offset_of!(G, w_max)),
            ("k_ms", offset_of!(G, k_ms)),
            ("mptcp_token", offset_of!(G, mptcp_token)),
            ("uid", offset_of!(G, uid)),
        ];
        let dmctcp = find("dmctcp").unwrap();
        assert_eq!(
            btf_layout(dmctcp, "dmc_group"),
            (fields(&group), size_of::<G>())
        );
    }
}
