//! What a lab is: the dumbbell's settings as the user gave them, the values derived from
//! them (bottleneck queue in packets, addresses, namespace names), and the hosts' names.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::LabError;

/// Ethernet header bytes the bottleneck counts on top of each IP packet.
pub const ETHERNET_HEADER: u32 = 14;
/// IPv4 + TCP headers with the timestamp option: what each segment carries besides payload.
pub const TCP_IP_HEADERS: u32 = 52;
/// Most sender hosts a lab builds.
pub const MAX_SENDERS: u16 = 16;

/// The bottleneck's drop-tail queue: a packet count, or a multiple of the path's BDP.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum QueueSize {
    /// Exactly this many packets.
    Packets(u32),
    /// This many bandwidth-delay products (in wire packets at the lab's MTU).
    Bdp(f64),
}

impl FromStr for QueueSize {
    type Err = String;

    /// `64` (packets) or `0.05bdp` / `1bdp` / `5%bdp`.
    fn from_str(s: &str) -> Result<QueueSize, String> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || {
            format!("bad queue size '{s}': give packets (e.g. 64) or a BDP multiple (e.g. 1bdp, 0.05bdp, 5%bdp)")
        };
        if let Some(x) = t.strip_suffix("bdp") {
            let x = x.trim();
            let v = match x.strip_suffix('%') {
                Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
                None if x.is_empty() => 1.0,
                None => x.parse::<f64>().map_err(|_| bad())?,
            };
            if !(v > 0.0 && v <= 100.0) {
                return Err(bad());
            }
            return Ok(QueueSize::Bdp(v));
        }
        match t.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(QueueSize::Packets(n)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for QueueSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueSize::Packets(n) => write!(f, "{n} packets"),
            QueueSize::Bdp(x) => write!(f, "{x} BDP"),
        }
    }
}

/// The settings of `hsxfer lab up`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabSpec {
    /// Lab name: prefix of its namespaces; several labs with different names can coexist.
    pub name: String,
    /// Bottleneck rate, bits/s (at the Ethernet layer, as the shaper counts).
    pub rate_bps: u64,
    /// Round-trip time of each sender's path (the last one repeats for further senders).
    pub rtts: Vec<Duration>,
    /// Bottleneck queue.
    pub queue: QueueSize,
    /// Random loss on the data direction (sender → router), as a fraction.
    pub loss: Option<f64>,
    /// MTU of every link.
    pub mtu: u32,
    /// Number of sender hosts.
    pub senders: u16,
    /// Rate of the reverse direction (receiver → router), if shaped.
    pub reverse_rate_bps: Option<u64>,
    /// Generic receive offload on the veths (real NICs have it on).
    pub gro: bool,
}

impl Default for LabSpec {
    fn default() -> LabSpec {
        LabSpec {
            name: "hsxlab".into(),
            rate_bps: 1_000_000_000,
            rtts: vec![Duration::from_millis(60)],
            queue: QueueSize::Bdp(1.0),
            loss: None,
            mtu: 1500,
            senders: 1,
            reverse_rate_bps: None,
            gro: true,
        }
    }
}

/// Refuses a lab name that is not 1–8 letters, digits or '_': it names namespaces and the
/// state directory under `/run/hsxfer/lab`, so "" or ".." would reach the directories above
/// (`lab down --name "$UNSET"` removed every lab's state).
pub fn check_name(name: &str) -> Result<(), LabError> {
    let fits = !name.is_empty()
        && name.len() <= 8
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if fits {
        Ok(())
    } else {
        Err(LabError::Invalid(format!(
            "lab name '{name}' must be 1–8 letters, digits or '_'"
        )))
    }
}

impl LabSpec {
    /// Checks the settings, with what to change when one is wrong.
    pub fn validate(&self) -> Result<(), LabError> {
        let bad = |m: String| Err(LabError::Invalid(m));
        check_name(&self.name)?;
        if self.senders == 0 || self.senders > MAX_SENDERS {
            return bad(format!("--senders must be 1..={MAX_SENDERS}"));
        }
        if self.rate_bps < 1_000_000 {
            return bad("--rate must be at least 1 Mbit/s".into());
        }
        if self.rtts.is_empty()
            || self
                .rtts
                .iter()
                .any(|r| r.is_zero() || *r > Duration::from_secs(2))
        {
            return bad("--rtt must be above 0 and at most 2 s".into());
        }
        if !(576..=9000).contains(&self.mtu) {
            return bad("--mtu must be 576..=9000".into());
        }
        if let Some(p) = self.loss {
            if !(0.0..0.5).contains(&p) {
                return bad("--loss must be below 50%".into());
            }
        }
        Ok(())
    }

    /// The round-trip time of sender `i` (1-based).
    pub fn rtt_of(&self, sender: u16) -> Duration {
        let k = (sender as usize).saturating_sub(1).min(self.rtts.len() - 1);
        self.rtts[k]
    }

    /// Bytes of one full-sized frame as the shaper counts it.
    pub fn frame_bytes(&self) -> u32 {
        self.mtu + ETHERNET_HEADER
    }

    /// Payload share of a full-sized frame: the most goodput a link of `rate_bps` can give.
    pub fn payload_efficiency(&self) -> f64 {
        (self.mtu - TCP_IP_HEADERS) as f64 / self.frame_bytes() as f64
    }

    /// The highest goodput the bottleneck allows, bits/s.
    pub fn goodput_ceiling_bps(&self) -> f64 {
        self.rate_bps as f64 * self.payload_efficiency()
    }

    /// The bandwidth-delay product of sender 1's path in full-sized frames.
    pub fn bdp_packets(&self) -> f64 {
        self.rate_bps as f64 * self.rtt_of(1).as_secs_f64() / 8.0 / self.frame_bytes() as f64
    }

    /// The bottleneck queue in packets.
    pub fn queue_packets(&self) -> u32 {
        match self.queue {
            QueueSize::Packets(n) => n,
            QueueSize::Bdp(x) => (x * self.bdp_packets()).ceil().max(1.0) as u32,
        }
    }

    /// Largest socket buffer a host needs: four times the largest path BDP in bytes (window
    /// plus a full queue, with room for the kernel's overhead), at least 64 MiB.
    pub fn socket_buffer_max(&self) -> u64 {
        let rtt = self.rtts.iter().max().copied().unwrap_or_default();
        let bdp = self.rate_bps as f64 * rtt.as_secs_f64() / 8.0;
        ((4.0 * bdp) as u64).max(64 << 20)
    }

    /// Namespace name of a host.
    pub fn namespace(&self, host: Host) -> String {
        format!("{}-{host}", self.name)
    }

    /// Every host of the lab.
    pub fn hosts(&self) -> Vec<Host> {
        let mut v: Vec<Host> = (1..=self.senders).map(Host::Sender).collect();
        v.push(Host::Router);
        v.push(Host::Receiver);
        v
    }
}

/// A host of the dumbbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Host {
    /// Sender `i`, 1-based.
    Sender(u16),
    /// The router: bottleneck and delay element.
    Router,
    /// The receiver.
    Receiver,
}

impl Host {
    /// The host's address inside the lab (the router's on the receiver's side).
    pub fn addr(self) -> Ipv4Addr {
        match self {
            Host::Sender(i) => Ipv4Addr::new(10, 77, i as u8, 2),
            Host::Router => Ipv4Addr::new(10, 77, 0, 1),
            Host::Receiver => Ipv4Addr::new(10, 77, 0, 2),
        }
    }

    /// The router's address facing this end host (its gateway).
    pub fn gateway(self) -> Ipv4Addr {
        match self {
            Host::Sender(i) => Ipv4Addr::new(10, 77, i as u8, 1),
            _ => Ipv4Addr::new(10, 77, 0, 1),
        }
    }

    /// The router's interface toward this end host.
    pub fn router_port(self) -> String {
        match self {
            Host::Sender(i) => format!("to-s{i}"),
            _ => "to-rcv".into(),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Sender(i) => write!(f, "sender{i}"),
            Host::Router => f.write_str("router"),
            Host::Receiver => f.write_str("receiver"),
        }
    }
}

impl FromStr for Host {
    type Err = String;

    fn from_str(s: &str) -> Result<Host, String> {
        match s {
            "router" => Ok(Host::Router),
            "receiver" => Ok(Host::Receiver),
            "sender" => Ok(Host::Sender(1)),
            _ => s
                .strip_prefix("sender")
                .and_then(|n| n.parse::<u16>().ok())
                .filter(|n| (1..=MAX_SENDERS).contains(n))
                .map(Host::Sender)
                .ok_or_else(|| {
                    format!("unknown host '{s}': use sender1, sender2, …, router or receiver")
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_sizes_parse_as_packets_or_bdp_multiples() {
        assert_eq!("64".parse(), Ok(QueueSize::Packets(64)));
        assert_eq!("1bdp".parse(), Ok(QueueSize::Bdp(1.0)));
        assert_eq!("bdp".parse(), Ok(QueueSize::Bdp(1.0)));
        assert_eq!("0.05BDP".parse(), Ok(QueueSize::Bdp(0.05)));
        assert_eq!("5%bdp".parse(), Ok(QueueSize::Bdp(0.05)));
        for bad in ["0", "-3", "x", "0bdp", "%bdp"] {
            assert!(bad.parse::<QueueSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn bdp_in_packets_matches_the_design_note() {
        // 1 Gbit/s × 60 ms at MTU 1500: 4954 frames of 1514 bytes.
        let spec = LabSpec::default();
        assert_eq!(spec.queue_packets(), 4954);
        let tiny = LabSpec {
            queue: QueueSize::Bdp(0.05),
            ..LabSpec::default()
        };
        assert_eq!(tiny.queue_packets(), 248);
        assert!((spec.payload_efficiency() - 1448.0 / 1514.0).abs() < 1e-12);
    }

    #[test]
    fn hosts_round_trip_through_their_names() {
        for h in [Host::Sender(3), Host::Router, Host::Receiver] {
            assert_eq!(h.to_string().parse::<Host>(), Ok(h));
        }
        assert!("sender0".parse::<Host>().is_err());
        assert!("client".parse::<Host>().unwrap_err().contains("sender1"));
    }

    #[test]
    fn validation_names_the_wrong_setting() {
        let mut s = LabSpec {
            name: "bad name".into(),
            ..LabSpec::default()
        };
        assert!(s.validate().unwrap_err().to_string().contains("lab name"));
        s.name = "ok".into();
        s.loss = Some(0.6);
        assert!(s.validate().unwrap_err().to_string().contains("--loss"));
        s.loss = Some(0.01);
        s.validate().unwrap();
        assert_eq!(s.rtt_of(5), Duration::from_millis(60));
    }
}
