//! Live counters of a lab: every qdisc's packets, drops and backlog (`tc -s -j`), the
//! kernel's netfilter queue counters, the delay element's statistics, and CPU use. Parsing is
//! separate from reading so it is tested on captured output.

use serde::Serialize;
use serde_json::Value;

use super::config::Host;
use super::element::{self, ElementStats};
use super::topology::{run, Lab, BOTTLENECK_HANDLE};
use super::LabError;

/// One qdisc's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QdiscCounters {
    /// Host it is on.
    pub host: String,
    /// Interface.
    pub dev: String,
    /// Kind (`tbf`, `pfifo`, …).
    pub kind: String,
    /// Handle, e.g. `10:`.
    pub handle: String,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped.
    pub drops: u64,
    /// Bytes queued now.
    pub backlog_bytes: u64,
    /// Packets queued now.
    pub qlen: u64,
    /// Queue limit in packets (pfifo), if it has one.
    pub limit: Option<u64>,
}

/// The kernel's view of one netfilter queue (`/proc/net/netfilter/nfnetlink_queue`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NfQueueCounters {
    /// Queue number.
    pub queue: u16,
    /// Packets waiting for a verdict.
    pub waiting: u64,
    /// Dropped because the kernel queue was full.
    pub queue_dropped: u64,
    /// Dropped because user space could not take them.
    pub user_dropped: u64,
}

/// Everything `lab status` shows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// Every qdisc of every host.
    pub qdiscs: Vec<QdiscCounters>,
    /// The router's netfilter queues.
    pub nfqueues: Vec<NfQueueCounters>,
    /// The delay element's own statistics.
    pub element: Option<ElementStats>,
    /// Busy share of each CPU over a short sample, 0–1.
    pub cpu_busy: Vec<f64>,
}

impl Counters {
    /// The bottleneck's drop-tail queue.
    pub fn bottleneck(&self) -> Option<&QdiscCounters> {
        self.qdiscs
            .iter()
            .find(|q| q.host == "router" && q.dev == "to-rcv" && q.handle == BOTTLENECK_HANDLE)
    }

    /// Drops anywhere but the bottleneck queue (qdiscs and netfilter queues): should be 0.
    pub fn drops_elsewhere(&self) -> u64 {
        let qdisc: u64 = self
            .qdiscs
            .iter()
            .filter(|q| !(q.host == "router" && q.dev == "to-rcv"))
            .map(|q| q.drops)
            .sum();
        let nfq: u64 = self
            .nfqueues
            .iter()
            .map(|q| q.queue_dropped + q.user_dropped)
            .sum();
        let element: u64 = self
            .element
            .iter()
            .flat_map(|e| &e.queues)
            .map(|q| q.overflowed)
            .sum();
        qdisc + nfq + element
    }
}

/// Parses `tc -s -j qdisc show` of `host`.
pub fn parse_qdiscs(host: &str, json: &str) -> Vec<QdiscCounters> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(json) else {
        return Vec::new();
    };
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    items
        .iter()
        .filter(|q| q.get("kind").and_then(Value::as_str) != Some("noqueue"))
        .map(|q| QdiscCounters {
            host: host.into(),
            dev: q.get("dev").and_then(Value::as_str).unwrap_or("").into(),
            kind: q.get("kind").and_then(Value::as_str).unwrap_or("").into(),
            handle: q.get("handle").and_then(Value::as_str).unwrap_or("").into(),
            packets: num(q, "packets"),
            drops: num(q, "drops"),
            backlog_bytes: num(q, "backlog"),
            qlen: num(q, "qlen"),
            limit: q
                .get("options")
                .and_then(|o| o.get("limit"))
                .and_then(Value::as_u64),
        })
        .collect()
}

/// Parses `/proc/net/netfilter/nfnetlink_queue`: queue, port id, waiting, copy mode, copy
/// range, queue dropped, user dropped, id sequence, 1.
pub fn parse_nfqueues(text: &str) -> Vec<NfQueueCounters> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .map(|x| x.parse().ok())
                .collect::<Option<Vec<u64>>>()?;
            (f.len() >= 7).then(|| NfQueueCounters {
                queue: f[0] as u16,
                waiting: f[2],
                queue_dropped: f[5],
                user_dropped: f[6],
            })
        })
        .collect()
}

/// Busy and total jiffies per CPU from `/proc/stat`.
fn cpu_times() -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            let total: u64 = v.iter().sum();
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            (total - idle, total)
        })
        .collect()
}

/// Reads every counter of `lab`, sampling CPU use over `cpu_sample`.
pub fn read(lab: &Lab, cpu_sample: std::time::Duration) -> Result<Counters, LabError> {
    let before = cpu_times();
    let mut qdiscs = Vec::new();
    for host in lab.hosts() {
        let ns = lab.spec().namespace(host);
        let json =
            run(std::process::Command::new("tc").args(["-n", &ns, "-s", "-j", "qdisc", "show"]))?;
        qdiscs.extend(parse_qdiscs(&host.to_string(), &json));
    }
    let nf = run(lab
        .command(Host::Router, "cat")
        .arg("/proc/net/netfilter/nfnetlink_queue"))
    .unwrap_or_default();
    std::thread::sleep(cpu_sample);
    let after = cpu_times();
    let cpu_busy = before
        .iter()
        .zip(&after)
        .map(|(b, a)| {
            let total = a.1.saturating_sub(b.1);
            if total == 0 {
                0.0
            } else {
                a.0.saturating_sub(b.0) as f64 / total as f64
            }
        })
        .collect();
    Ok(Counters {
        qdiscs,
        nfqueues: parse_nfqueues(&nf),
        element: element::read_stats(&lab.element_stats_path()),
        cpu_busy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TC: &str = r#"[{"kind":"pfifo","handle":"8001:","dev":"to-s1","root":true,"options":{"limit":10000},"bytes":90,"packets":1,"drops":0,"overlimits":0,"requeues":0,"backlog":0,"qlen":0},
{"kind":"tbf","handle":"1:","dev":"to-rcv","root":true,"options":{"rate":125000000,"burst":62500},"bytes":5000,"packets":5,"drops":0,"overlimits":3,"requeues":0,"backlog":3028,"qlen":2},
{"kind":"pfifo","handle":"10:","dev":"to-rcv","parent":"1:1","options":{"limit":64},"bytes":5000,"packets":5,"drops":7,"overlimits":0,"requeues":0,"backlog":3028,"qlen":2},
{"kind":"noqueue","handle":"0:","dev":"lo","root":true,"options":{},"bytes":0,"packets":0,"drops":0,"overlimits":0,"requeues":0,"backlog":0,"qlen":0}]"#;

    #[test]
    fn qdiscs_parse_and_the_bottleneck_is_found() {
        let mut c = Counters {
            qdiscs: parse_qdiscs("router", TC),
            ..Default::default()
        };
        assert_eq!(c.qdiscs.len(), 3, "noqueue is skipped");
        let b = c.bottleneck().unwrap();
        assert_eq!((b.drops, b.qlen, b.limit), (7, 2, Some(64)));
        assert_eq!(c.drops_elsewhere(), 0);
        c.qdiscs[0].drops = 2;
        c.nfqueues = parse_nfqueues("    1  12345     3 1     0     4     5   999  1\n");
        assert_eq!(c.nfqueues[0].queue, 1);
        assert_eq!(c.drops_elsewhere(), 2 + 4 + 5);
    }

    #[test]
    fn garbage_gives_no_counters() {
        assert!(parse_qdiscs("router", "not json").is_empty());
        assert!(parse_nfqueues("a b c\n1 2\n").is_empty());
    }
}
