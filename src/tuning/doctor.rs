//! Host checks behind `hsxfer doctor`: what on this host limits a transfer's throughput, each
//! finding with the exact commands that fix it.
//!
//! [`run`] first gathers facts (sysctls under `/proc/sys`, `/sys/class/net`, the kernel's BTF,
//! `tc qdisc show`), then judges them. Judging is pure, so every rule is tested on hand-made
//! facts. Nothing is sent on the network: the interface toward a peer is found by connecting a
//! UDP socket, which only makes the kernel pick a route.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use super::bdp::{self, BufferRequest, Direction};
use super::sysctl::{self, BufferLimits, DirectionLimits};
use crate::transport::cc::{self, CcCatalog};
use crate::transport::route;

/// Where the kernel exposes its BTF, which BPF congestion controls are relocated against.
const BTF: &str = "/sys/kernel/btf/vmlinux";
/// The first kernel that registers hsxfer's bundled congestion controls: BPF `struct_ops`
/// congestion controls came in 5.6, but the bundled objects declare theirs as links
/// (`SEC(".struct_ops.link")`, `BPF_F_LINK`), which came in 6.4.
const STRUCT_OPS_KERNEL: (u32, u32) = (6, 4);
/// Round-trip times the buffer limits are translated into throughput at when no path is given.
const TYPICAL_RTTS_MS: [u64; 4] = [20, 60, 120, 250];
/// Appended to findings whose fix is a `sysctl -w`.
const SYSCTL_NOTE: &str = "Fixing needs root; `sysctl -w` lasts until reboot (to keep it, put \
                           the setting in a file under /etc/sysctl.d/). In a network namespace \
                           it applies to that namespace only.";

/// How a finding bears on throughput.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Nothing limits throughput here.
    Ok,
    /// Likely to limit throughput or to skew measurements; the fix says how to lift it.
    Warn,
    /// Transfers will be badly limited or impossible until fixed.
    Fail,
    /// A fact worth knowing (a limit's consequence, a default), not a fault.
    Info,
}

/// One check's result: what was found, why it matters and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable identifier of the check, e.g. `buffers.receive` or `tcp.window_scaling`;
    /// interface checks repeat once per interface checked.
    pub check: String,
    /// How it bears on throughput.
    pub status: Status,
    /// One line saying what was found.
    pub summary: String,
    /// Why it matters, the values behind it, and whether fixing needs root.
    pub detail: Option<String>,
    /// Exact commands that fix it, to be run in order; empty when there is nothing to fix.
    pub fix: Vec<String>,
}

impl Finding {
    fn new(check: &str, status: Status, summary: impl Into<String>) -> Finding {
        Finding {
            check: check.to_string(),
            status,
            summary: summary.into(),
            detail: None,
            fix: Vec::new(),
        }
    }

    fn detail(mut self, detail: impl Into<String>) -> Finding {
        self.detail = Some(detail.into());
        self
    }

    fn fix(mut self, commands: impl IntoIterator<Item = String>) -> Finding {
        self.fix.extend(commands);
        self
    }
}

/// What to check the host against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorOptions {
    /// Bottleneck rate of the path, bits/s. With `rtt`, the socket buffers are checked against
    /// the path; with either missing, their limits are reported at typical round-trip times.
    pub rate_bps: Option<u64>,
    /// Round-trip time of the path.
    pub rtt: Option<Duration>,
    /// Parallel channels the transfer would use: each needs its share of the window.
    pub channels: u16,
    /// The peer: its route's interface is checked. Without it, the default route's interface
    /// (or, with no default route, every interface that is up).
    pub host: Option<IpAddr>,
}

/// Checks this host and returns every finding, in a stable order.
pub fn run(opts: &DoctorOptions) -> Vec<Finding> {
    judge(&Facts::gather(opts.host), opts)
}

/// Everything the checks look at.
struct Facts {
    /// Socket buffer limits; `None` when unreadable.
    buffers: Option<BufferLimits>,
    /// TCP and network-stack sysctls.
    stack: StackSysctls,
    /// Congestion controls; `None` when unreadable.
    cc: Option<CcCatalog>,
    /// Whether the process runs as root.
    root: bool,
    /// How the interfaces to check were chosen.
    route: Route,
    /// The interfaces checked.
    interfaces: Vec<Interface>,
    /// Whether the kernel exposes its BTF.
    btf: bool,
    /// The kernel release (`uname -r`); `None` when unreadable.
    kernel: Option<String>,
}

/// Sysctls read as numbers; `None` when absent (not in this kernel) or unreadable.
struct StackSysctls {
    window_scaling: Option<u64>,
    sack: Option<u64>,
    timestamps: Option<u64>,
    no_metrics_save: Option<u64>,
    mptcp: Option<u64>,
    netdev_max_backlog: Option<u64>,
}

/// How the interfaces to check were chosen.
enum Route {
    /// Toward a peer: the source address the kernel picked and the interface holding it.
    Host {
        host: IpAddr,
        source: IpAddr,
        interface: Option<String>,
    },
    /// The kernel has no route toward the peer.
    Unreachable { host: IpAddr, error: String },
    /// No peer given: the interface of the default route.
    Default(String),
    /// No peer given and no default route: every interface that is up, loopback aside.
    NoDefault(Vec<String>),
}

/// One network interface's settings.
struct Interface {
    name: String,
    mtu: Option<u64>,
    tx_queue_len: Option<u64>,
    /// Link speed, Mbit/s; `None` for virtual devices and links that are down.
    speed_mbps: Option<u64>,
    qdisc: Qdisc,
}

/// What `tc qdisc show dev IF` said.
enum Qdisc {
    /// The qdisc kinds, in `tc`'s order (root first).
    Kinds(Vec<String>),
    /// `tc` is not installed.
    NoTc,
    /// `tc` failed, with its message.
    Failed(String),
}

impl Facts {
    /// Reads the facts from this host; toward `host` when given.
    fn gather(host: Option<IpAddr>) -> Facts {
        let route = Route::find(host);
        let interfaces = route
            .interfaces()
            .iter()
            .map(|n| Interface::read(n))
            .collect();
        Facts {
            buffers: BufferLimits::read().ok(),
            stack: StackSysctls::read(),
            cc: CcCatalog::read().ok(),
            root: cc::privileged(),
            route,
            interfaces,
            btf: Path::new(BTF).exists(),
            kernel: sysctl::read("kernel.osrelease").ok(),
        }
    }
}

impl StackSysctls {
    fn read() -> StackSysctls {
        let num = |name: &str| sysctl::read_u64(name).ok();
        StackSysctls {
            window_scaling: num("net.ipv4.tcp_window_scaling"),
            sack: num("net.ipv4.tcp_sack"),
            timestamps: num("net.ipv4.tcp_timestamps"),
            no_metrics_save: num("net.ipv4.tcp_no_metrics_save"),
            mptcp: num("net.mptcp.enabled"),
            netdev_max_backlog: num("net.core.netdev_max_backlog"),
        }
    }
}

impl Route {
    fn find(host: Option<IpAddr>) -> Route {
        match host {
            Some(host) => match route::source_addr(host) {
                // The interface the route leaves by, which need not hold the source address
                // (a local address leaves by lo; a route's `src` may be on another).
                Ok(source) => Route::Host {
                    host,
                    source,
                    interface: route::egress(host, None)
                        .map(|e| e.dev)
                        .ok()
                        .or_else(|| route::interface_of(source).ok().flatten()),
                },
                Err(e) => Route::Unreachable {
                    host,
                    error: e.to_string(),
                },
            },
            None => match route::default_interface().ok().flatten() {
                Some(name) => Route::Default(name),
                None => Route::NoDefault(route::up_interfaces().unwrap_or_default()),
            },
        }
    }

    fn interfaces(&self) -> Vec<String> {
        match self {
            Route::Host { interface, .. } => interface.iter().cloned().collect(),
            Route::Unreachable { .. } => Vec::new(),
            Route::Default(name) => vec![name.clone()],
            Route::NoDefault(names) => names.clone(),
        }
    }
}

impl Interface {
    fn read(name: &str) -> Interface {
        let attr = |a: &str| {
            std::fs::read_to_string(format!("/sys/class/net/{name}/{a}"))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        Interface {
            name: name.to_string(),
            mtu: attr("mtu").and_then(|v| u64::try_from(v).ok()),
            tx_queue_len: attr("tx_queue_len").and_then(|v| u64::try_from(v).ok()),
            speed_mbps: crate::transport::route::link_speed_bps(name).map(|b| b / 1_000_000),
            qdisc: Qdisc::show(name),
        }
    }
}

impl Qdisc {
    fn show(dev: &str) -> Qdisc {
        match Command::new("tc")
            .args(["qdisc", "show", "dev", dev])
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Qdisc::NoTc,
            Err(e) => Qdisc::Failed(e.to_string()),
            Ok(out) if !out.status.success() => {
                Qdisc::Failed(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
            Ok(out) => Qdisc::Kinds(qdisc_kinds(&String::from_utf8_lossy(&out.stdout))),
        }
    }
}

/// The qdisc kinds in `tc qdisc show` output (`qdisc fq 8001: root ...` → `fq`).
fn qdisc_kinds(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("qdisc "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Judges all facts, in the order the findings are shown.
fn judge(f: &Facts, o: &DoctorOptions) -> Vec<Finding> {
    let mut out = buffer_findings(f.buffers.as_ref(), o);
    out.extend(stack_findings(&f.stack));
    out.push(route_finding(&f.route));
    for i in &f.interfaces {
        out.extend(interface_findings(i, o.rate_bps));
    }
    out.extend(cc_findings(f.cc.as_ref(), f.root));
    out.push(bpf_finding(f.btf, f.root, f.kernel.as_deref()));
    out
}

fn buffer_findings(limits: Option<&BufferLimits>, o: &DoctorOptions) -> Vec<Finding> {
    let Some(limits) = limits else {
        return vec![Finding::new(
            "buffers",
            Status::Info,
            "cannot read the socket buffer limits (net.core.rmem_max, net.core.wmem_max, \
             net.ipv4.tcp_rmem, net.ipv4.tcp_wmem)",
        )];
    };
    [
        (Direction::Receive, &limits.receive),
        (Direction::Send, &limits.send),
    ]
    .into_iter()
    .map(|(dir, l)| match (o.rate_bps, o.rtt) {
        (Some(rate), Some(rtt)) => buffers_for_path(dir, l, rate, rtt, o.channels),
        _ => buffers_at_typical_rtts(dir, l, o.channels),
    })
    .collect()
}

fn buffer_check(dir: Direction) -> String {
    format!("buffers.{}", dir.noun())
}

/// The sysctl values that bound one direction's buffers, for details.
fn limits_text(dir: Direction, l: &DirectionLimits) -> String {
    let (max_name, tcp_name) = dir.sysctls();
    format!(
        "{max_name} = {} (an explicit request is doubled by the kernel), {tcp_name} = \"{} {} {}\" \
         (autotuning). These count when this host {}s.",
        l.request_max,
        l.autotune.min,
        l.autotune.default,
        l.autotune.max,
        dir.noun(),
    )
}

/// Checks one direction against a path: the window every channel needs, planned the way a
/// transfer plans it ([`bdp::plan`]).
fn buffers_for_path(
    dir: Direction,
    l: &DirectionLimits,
    rate: u64,
    rtt: Duration,
    channels: u16,
) -> Finding {
    let window = bdp::channel_window(rate, rtt, channels);
    let needed = window.saturating_mul(2);
    let plan = bdp::plan(BufferRequest::Window(window), l, dir, channels, rtt);
    let path = format!(
        "{} × {} over {channels} channels",
        mbit(rate as f64),
        ms(rtt)
    );
    let why = format!(
        "Each channel needs a window of twice its share of the bandwidth-delay product (room \
         for a queue of up to one BDP), {window} bytes, and the kernel keeps half of a buffer \
         for its own overhead: {needed} bytes per socket."
    );
    if plan.expected >= needed {
        let how = match plan.request {
            Some(r) => format!("hsxfer requests {r} bytes with SO_*BUF"),
            None => "kernel autotuning grows them".to_string(),
        };
        return Finding::new(
            &buffer_check(dir),
            Status::Ok,
            format!(
                "{} buffers reach {} per channel, enough for {path} ({how})",
                dir.noun(),
                mib(plan.expected)
            ),
        )
        .detail(format!("{why} {}", limits_text(dir, l)));
    }
    Finding::new(
        &buffer_check(dir),
        Status::Warn,
        format!(
            "{} buffers too small for {path}: {} per channel, {} needed",
            dir.noun(),
            mib(plan.expected),
            mib(needed)
        ),
    )
    .detail(format!(
        "{why} This host allows {} bytes, which carries at most about {} at {} even with an \
         empty queue. {} {SYSCTL_NOTE}{}",
        plan.expected,
        mbit(bdp::buffer_rate(plan.expected, channels, rtt)),
        ms(rtt),
        limits_text(dir, l),
        bdp::channels_within_sysctls(needed, channels)
            .map(|n| format!(
                " A socket buffer cannot exceed 2 GiB (the limits are C ints): the commands \
                 raise them that far, and the path needs {n} channels or more."
            ))
            .unwrap_or_default(),
    ))
    .fix(bdp::fix_commands(dir, l, needed))
}

/// Without a path: the largest buffer and the throughput it allows at typical RTTs.
fn buffers_at_typical_rtts(dir: Direction, l: &DirectionLimits, channels: u16) -> Finding {
    let most = l.reachable();
    let rates: Vec<String> = TYPICAL_RTTS_MS
        .iter()
        .map(|&r| {
            let rtt = Duration::from_millis(r);
            format!(
                "{} at {}",
                mbit(bdp::buffer_rate(most, channels, rtt)),
                ms(rtt)
            )
        })
        .collect();
    Finding::new(
        &buffer_check(dir),
        Status::Info,
        format!(
            "{} buffers reach at most {} per socket: {channels} channels carry about {}",
            dir.noun(),
            mib(most),
            rates.join(", ")
        ),
    )
    .detail(format!(
        "{} Give `rate` and `rtt` to check them against a path.",
        limits_text(dir, l)
    ))
}

fn stack_findings(s: &StackSysctls) -> Vec<Finding> {
    vec![
        must_be_on(
            "tcp.window_scaling",
            "net.ipv4.tcp_window_scaling",
            s.window_scaling,
            Status::Fail,
            "TCP window scaling",
            "Without it every TCP window is capped at 64 KiB: about 5 Mbit/s per channel at \
             100 ms, whatever the buffers.",
        ),
        must_be_on(
            "tcp.sack",
            "net.ipv4.tcp_sack",
            s.sack,
            Status::Warn,
            "selective acknowledgments (SACK)",
            "Without SACK, several losses in one window are repaired about one segment per \
             round trip, so a fast path stalls after every loss burst.",
        ),
        must_be_on(
            "tcp.timestamps",
            "net.ipv4.tcp_timestamps",
            s.timestamps,
            Status::Warn,
            "TCP timestamps",
            "Without them RTT is sampled less often (worse retransmission timeouts) and \
             protection against wrapped sequence numbers (PAWS), needed at multi-Gbit/s \
             rates, is lost.",
        ),
        metrics_finding(s.no_metrics_save),
        must_be_on(
            "mptcp.enabled",
            "net.mptcp.enabled",
            s.mptcp,
            Status::Info,
            "MPTCP",
            "Multipath TCP sockets cannot be created, so channels cannot run as MPTCP \
             subflows.",
        ),
        backlog_finding(s.netdev_max_backlog),
    ]
}

fn unreadable(check: &str, name: &str) -> Finding {
    Finding::new(
        check,
        Status::Info,
        format!("cannot read {name} (not in this kernel, or /proc/sys not mounted)"),
    )
}

/// A switch that should be on: `off` is the status when it is 0.
fn must_be_on(
    check: &str,
    name: &str,
    value: Option<u64>,
    off: Status,
    what: &str,
    why: &str,
) -> Finding {
    match value {
        None => unreadable(check, name),
        Some(0) => Finding::new(check, off, format!("{what}: off ({name} = 0)"))
            .detail(format!("{why} {SYSCTL_NOTE}"))
            .fix([format!("sysctl -w {name}=1")]),
        Some(v) => Finding::new(check, Status::Ok, format!("{what}: on ({name} = {v})")),
    }
}

fn metrics_finding(value: Option<u64>) -> Finding {
    const CHECK: &str = "tcp.no_metrics_save";
    const NAME: &str = "net.ipv4.tcp_no_metrics_save";
    match value {
        None => unreadable(CHECK, NAME),
        Some(0) => Finding::new(
            CHECK,
            Status::Info,
            format!("TCP reuses the previous connection's metrics per destination ({NAME} = 0)"),
        )
        .detail(format!(
            "A new connection to a host starts from the ssthresh and RTT the last one ended \
             with, so repeated benchmarks are not independent. For benchmarks set it to 1, or \
             run `ip tcp_metrics flush all` before each run. {SYSCTL_NOTE}"
        ))
        .fix([format!("sysctl -w {NAME}=1")]),
        Some(v) => Finding::new(
            CHECK,
            Status::Ok,
            format!("every connection starts fresh ({NAME} = {v})"),
        ),
    }
}

fn backlog_finding(value: Option<u64>) -> Finding {
    const CHECK: &str = "net.netdev_max_backlog";
    const NAME: &str = "net.core.netdev_max_backlog";
    let Some(v) = value else {
        return unreadable(CHECK, NAME);
    };
    Finding::new(
        CHECK,
        Status::Info,
        format!("receive backlog: {v} packets per CPU ({NAME})"),
    )
    .detail(format!(
        "Packets received but not yet processed by the stack; beyond it they are dropped and \
         TCP takes the drops for congestion. Drops are the second column of \
         /proc/net/softnet_stat (hexadecimal, per CPU); if it grows during transfers, raise it, \
         e.g. sysctl -w {NAME}={}.",
        v.max(1000) * 4
    ))
}

fn route_finding(r: &Route) -> Finding {
    const CHECK: &str = "route.interface";
    match r {
        Route::Host {
            host,
            source,
            interface: Some(name),
        } => Finding::new(
            CHECK,
            Status::Info,
            format!("traffic to {host} leaves from {source} on {name}"),
        ),
        Route::Host {
            host,
            source,
            interface: None,
        } => Finding::new(
            CHECK,
            Status::Info,
            format!("traffic to {host} leaves from {source}, which no interface lists"),
        ),
        Route::Unreachable { host, error } => {
            Finding::new(CHECK, Status::Fail, format!("no route to {host}: {error}")).detail(
                format!(
            "`ip route get {host}` shows what the kernel would do; add a route or an address \
             on the right network first."
        ),
            )
        }
        Route::Default(name) => Finding::new(
            CHECK,
            Status::Info,
            format!("checking {name}, the interface of the default route"),
        )
        .detail("Give HOST to check the interface toward a particular peer."),
        Route::NoDefault(names) if names.is_empty() => Finding::new(
            CHECK,
            Status::Info,
            "no default route and no interface up besides loopback: no interface checked",
        ),
        Route::NoDefault(names) => Finding::new(
            CHECK,
            Status::Info,
            format!(
                "no default route: checking every interface that is up ({})",
                names.join(", ")
            ),
        ),
    }
}

fn interface_findings(i: &Interface, rate_bps: Option<u64>) -> Vec<Finding> {
    vec![
        mtu_finding(&i.name, i.mtu),
        txqueuelen_finding(&i.name, i.tx_queue_len),
        speed_finding(&i.name, i.speed_mbps, rate_bps),
        qdisc_finding(&i.name, &i.qdisc),
    ]
}

fn mtu_finding(dev: &str, mtu: Option<u64>) -> Finding {
    const CHECK: &str = "interface.mtu";
    match mtu {
        None => Finding::new(CHECK, Status::Info, format!("{dev}: MTU unreadable")),
        Some(m) if m < 1500 => Finding::new(
            CHECK,
            Status::Info,
            format!("{dev}: MTU {m}, below Ethernet's 1500"),
        )
        .detail(
            "Typical of tunnels and overlays. Each packet carries less payload, so the same \
             rate costs more packets (CPU per byte rises). Nothing to fix on this host unless \
             the whole path carries larger packets.",
        ),
        Some(m) if m >= 9000 => {
            Finding::new(CHECK, Status::Ok, format!("{dev}: MTU {m} (jumbo frames)"))
        }
        Some(m) => Finding::new(CHECK, Status::Ok, format!("{dev}: MTU {m}")).detail(format!(
            "Jumbo frames halve the per-packet CPU cost at high rates, but only if every hop \
             carries them: ip link set dev {dev} mtu 9000 (root)."
        )),
    }
}

fn txqueuelen_finding(dev: &str, len: Option<u64>) -> Finding {
    const CHECK: &str = "interface.txqueuelen";
    match len {
        None => Finding::new(CHECK, Status::Info, format!("{dev}: txqueuelen unreadable")),
        Some(0) => Finding::new(
            CHECK,
            Status::Info,
            format!("{dev}: txqueuelen 0 (no transmit queue, typical of virtual devices)"),
        ),
        Some(n) if n < 1000 => Finding::new(
            CHECK,
            Status::Warn,
            format!("{dev}: txqueuelen {n} is short"),
        )
        .detail(
            "Bursts at line rate overflow a short transmit queue and the drops cut TCP's \
             window. Fixing needs root and lasts until the interface is recreated.",
        )
        .fix([format!("ip link set dev {dev} txqueuelen 10000")]),
        Some(n) => Finding::new(CHECK, Status::Ok, format!("{dev}: txqueuelen {n}")),
    }
}

fn speed_finding(dev: &str, speed_mbps: Option<u64>, rate_bps: Option<u64>) -> Finding {
    const CHECK: &str = "interface.speed";
    match (speed_mbps, rate_bps) {
        (None, _) => Finding::new(
            CHECK,
            Status::Info,
            format!("{dev}: link speed not reported (virtual device or link down)"),
        ),
        (Some(s), Some(rate)) if rate > s * 1_000_000 => Finding::new(
            CHECK,
            Status::Warn,
            format!(
                "{dev}: link speed {s} Mbit/s is below the {} asked",
                mbit(rate as f64)
            ),
        )
        .detail("This interface cannot carry the rate; check the path's rate or another route."),
        (Some(s), _) => Finding::new(CHECK, Status::Ok, format!("{dev}: link speed {s} Mbit/s")),
    }
}

fn qdisc_finding(dev: &str, q: &Qdisc) -> Finding {
    const CHECK: &str = "interface.qdisc";
    match q {
        Qdisc::NoTc => Finding::new(
            CHECK,
            Status::Info,
            format!("{dev}: qdisc unknown: `tc` is not installed"),
        )
        .fix(["apt-get install -y iproute2".to_string()]),
        Qdisc::Failed(e) => Finding::new(
            CHECK,
            Status::Info,
            format!("{dev}: `tc qdisc show dev {dev}` failed: {e}"),
        ),
        Qdisc::Kinds(kinds) if kinds.iter().any(|k| k == "fq") => Finding::new(
            CHECK,
            Status::Ok,
            format!("{dev}: qdisc {} (fq paces each flow)", kinds.join(", ")),
        ),
        Qdisc::Kinds(kinds) => Finding::new(
            CHECK,
            Status::Info,
            format!(
                "{dev}: qdisc {} (no fq): TCP paces internally",
                kinds.first().map_or("none", String::as_str)
            ),
        )
        .detail(format!(
            "Pacing (hsxfer's `pace`, SO_MAX_PACING_RATE, BBR) then runs inside TCP, which works; \
             fq would do it in the qdisc with fewer timers. Not every kernel has fq \
             (CONFIG_NET_SCH_FQ); where it does: tc qdisc replace dev {dev} root fq (root)."
        )),
    }
}

fn cc_findings(cat: Option<&CcCatalog>, root: bool) -> Vec<Finding> {
    let Some(cat) = cat else {
        return vec![unreadable(
            "cc.default",
            "net.ipv4.tcp_available_congestion_control",
        )];
    };
    vec![cc_default_finding(cat), cc_allowed_finding(cat, root)]
}

fn cc_default_finding(cat: &CcCatalog) -> Finding {
    Finding::new(
        "cc.default",
        Status::Info,
        format!(
            "default congestion control: {} (registered: {})",
            cat.default,
            cat.available.join(" ")
        ),
    )
    .detail(format!(
        "A socket that does not choose one runs {}: experiments must set the congestion \
         control explicitly (TCP_CONGESTION) and report it.",
        cat.default
    ))
}

fn cc_allowed_finding(cat: &CcCatalog, root: bool) -> Finding {
    const CHECK: &str = "cc.allowed";
    const NAME: &str = "net.ipv4.tcp_allowed_congestion_control";
    let restricted: Vec<&String> = cat
        .available
        .iter()
        .filter(|a| !cat.usable(a, false))
        .collect();
    if restricted.is_empty() {
        return Finding::new(
            CHECK,
            Status::Ok,
            format!("any process may select every registered congestion control ({NAME})"),
        );
    }
    let names: Vec<&str> = restricted.iter().map(|s| s.as_str()).collect();
    let who = if restricted.iter().all(|n| cat.usable(n, root)) {
        "This process runs as root and may select them anyway."
    } else {
        "This process is not root and cannot select them."
    };
    let everyone: Vec<&str> = cat
        .allowed
        .iter()
        .map(String::as_str)
        .chain(names.iter().copied())
        .collect();
    Finding::new(
        CHECK,
        Status::Info,
        format!(
            "{} registered but not allowed for unprivileged processes ({NAME} = \"{}\")",
            names.join(", "),
            cat.allowed.join(" ")
        ),
    )
    .detail(format!(
        "Selecting them needs CAP_NET_ADMIN. {who} {SYSCTL_NOTE}"
    ))
    .fix([format!("sysctl -w {NAME}=\"{}\"", everyone.join(" "))])
}

/// Whether BPF `struct_ops` congestion controls can be registered here.
fn bpf_finding(btf: bool, root: bool, kernel: Option<&str>) -> Finding {
    const CHECK: &str = "bpf.struct_ops";
    let mut problems = Vec::new();
    let version = kernel.and_then(kernel_version);
    match (kernel, version) {
        (Some(k), Some(v)) if v < STRUCT_OPS_KERNEL => problems.push(format!(
            "kernel {k} predates 6.4, the first that registers struct_ops congestion controls \
             as links, as the bundled ones are"
        )),
        (_, None) => problems.push("the kernel version is unknown".to_string()),
        _ => {}
    }
    if !btf {
        problems.push(format!(
            "no kernel BTF at {BTF} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)"
        ));
    }
    if !root {
        problems.push("registering needs CAP_BPF and CAP_NET_ADMIN: run as root".to_string());
    }
    let note = "Privilege is judged by the effective user id alone: CAP_BPF with CAP_NET_ADMIN \
                also suffice but are not checked.";
    if problems.is_empty() {
        return Finding::new(
            CHECK,
            Status::Ok,
            format!(
                "BPF congestion controls can be registered: kernel {}, BTF present, running as root",
                kernel.unwrap_or_default()
            ),
        )
        .detail(note);
    }
    Finding::new(
        CHECK,
        Status::Warn,
        format!(
            "BPF congestion controls cannot be registered: {}",
            problems.join("; ")
        ),
    )
    .detail(note)
}

/// Major and minor version of a kernel release such as `6.18.44-generic`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn mbit(bps: f64) -> String {
    format!("{:.0} Mbit/s", bps / 1e6)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn ms(d: Duration) -> String {
    format!("{} ms", (d.as_secs_f64() * 1e4).round() / 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::sysctl::Triple;

    const MIB: u64 = 1 << 20;

    fn direction(max: u64) -> DirectionLimits {
        DirectionLimits {
            request_max: max,
            autotune: Triple {
                min: 4096,
                default: 131072,
                max,
            },
        }
    }

    fn eth0() -> Interface {
        Interface {
            name: "eth0".into(),
            mtu: Some(1500),
            tx_queue_len: Some(1000),
            speed_mbps: Some(10_000),
            qdisc: Qdisc::Kinds(vec!["fq".into()]),
        }
    }

    /// A host with nothing to complain about.
    fn healthy() -> Facts {
        Facts {
            buffers: Some(BufferLimits {
                send: direction(64 * MIB),
                receive: direction(64 * MIB),
            }),
            stack: StackSysctls {
                window_scaling: Some(1),
                sack: Some(1),
                timestamps: Some(1),
                no_metrics_save: Some(1),
                mptcp: Some(1),
                netdev_max_backlog: Some(1000),
            },
            cc: Some(CcCatalog {
                available: vec!["reno".into(), "cubic".into()],
                allowed: vec!["reno".into(), "cubic".into()],
                default: "cubic".into(),
            }),
            root: true,
            route: Route::Default("eth0".into()),
            interfaces: vec![eth0()],
            btf: true,
            kernel: Some("6.18.44-generic".into()),
        }
    }

    fn path(rate_bps: u64, rtt_ms: u64) -> DoctorOptions {
        DoctorOptions {
            rate_bps: Some(rate_bps),
            rtt: Some(Duration::from_millis(rtt_ms)),
            channels: 4,
            host: None,
        }
    }

    fn find<'a>(fs: &'a [Finding], check: &str) -> &'a Finding {
        fs.iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no {check} in {fs:#?}"))
    }

    #[test]
    fn a_healthy_host_has_no_warnings() {
        let fs = judge(&healthy(), &path(1_000_000_000, 100));
        let bad: Vec<_> = fs
            .iter()
            .filter(|f| matches!(f.status, Status::Warn | Status::Fail))
            .collect();
        assert!(bad.is_empty(), "{bad:#?}");
        assert_eq!(find(&fs, "buffers.receive").status, Status::Ok);
    }

    #[test]
    fn low_rmem_max_warns_with_the_sysctl_lines() {
        let mut f = healthy();
        f.buffers = Some(BufferLimits {
            send: direction(64 * MIB),
            receive: direction(4 * MIB),
        });
        // 1 Gbit/s × 100 ms = 12.5 MB; 4 channels: 3.125 MB each, × 2 headroom = 6.25 MB
        // window, 12.5 MB kernel buffer, rounded up to 12 MiB.
        let fs = judge(&f, &path(1_000_000_000, 100));
        let r = find(&fs, "buffers.receive");
        assert_eq!(r.status, Status::Warn);
        assert_eq!(
            r.fix,
            [
                "sysctl -w net.core.rmem_max=12582912",
                "sysctl -w net.ipv4.tcp_rmem=\"4096 131072 12582912\"",
            ]
        );
        assert!(r.detail.as_ref().unwrap().contains("needs root"));
        assert_eq!(find(&fs, "buffers.send").status, Status::Ok);
    }

    /// The sysctls are C ints: a fix never asks for more than 2047 MiB (2,500,853,760 was
    /// refused when pasted, and a huge path wrapped it to 0), and says how many channels the
    /// path needs instead.
    #[test]
    fn a_fix_stays_within_what_the_sysctls_take() {
        for (rate, rtt_ms) in [(100_000_000_000, 200), (u64::MAX, 100_000_000)] {
            let fs = judge(&healthy(), &path(rate, rtt_ms));
            let r = find(&fs, "buffers.receive");
            assert_eq!(r.status, Status::Warn, "{r:#?}");
            assert_eq!(
                r.fix,
                [
                    "sysctl -w net.core.rmem_max=2146435072",
                    "sysctl -w net.ipv4.tcp_rmem=\"4096 131072 2146435072\"",
                ]
            );
            assert!(
                r.detail.as_ref().unwrap().contains("channels or more"),
                "{r:#?}"
            );
        }
        // 100 Gbit/s × 200 ms: 2.5 GB per channel of 4, with headroom 5 GB kernel buffers.
        assert_eq!(bdp::channels_within_sysctls(5_001_707_520, 4), Some(10));
        assert_eq!(bdp::channels_within_sysctls(1 << 30, 4), None);
    }

    #[test]
    fn without_a_path_buffers_are_reported_at_typical_rtts() {
        let mut f = healthy();
        f.buffers = Some(BufferLimits {
            send: direction(4 * MIB),
            receive: direction(4 * MIB),
        });
        let opts = DoctorOptions {
            rate_bps: None,
            ..path(0, 100)
        };
        let r = find(&judge(&f, &opts), "buffers.receive").clone();
        assert_eq!(r.status, Status::Info);
        // 8 MiB per socket (4 MiB doubled), half usable, 4 channels, 120 ms: 1118 Mbit/s.
        assert!(r.summary.contains("8.0 MiB per socket"), "{}", r.summary);
        assert!(r.summary.contains("1118 Mbit/s at 120 ms"), "{}", r.summary);
        assert!(r.summary.contains("at 20 ms") && r.summary.contains("at 250 ms"));
        assert!(r.fix.is_empty());
    }

    #[test]
    fn window_scaling_off_fails() {
        let mut f = healthy();
        f.stack.window_scaling = Some(0);
        let w = find(&judge(&f, &path(1_000_000_000, 100)), "tcp.window_scaling").clone();
        assert_eq!(w.status, Status::Fail);
        assert_eq!(w.fix, ["sysctl -w net.ipv4.tcp_window_scaling=1"]);
    }

    #[test]
    fn sack_and_timestamps_off_warn_and_metrics_saving_is_noted() {
        let mut f = healthy();
        f.stack.sack = Some(0);
        f.stack.timestamps = Some(0);
        f.stack.no_metrics_save = Some(0);
        f.stack.mptcp = None;
        let fs = judge(&f, &path(1_000_000_000, 100));
        assert_eq!(find(&fs, "tcp.sack").status, Status::Warn);
        assert_eq!(find(&fs, "tcp.timestamps").status, Status::Warn);
        let m = find(&fs, "tcp.no_metrics_save");
        assert_eq!(m.status, Status::Info);
        assert_eq!(m.fix, ["sysctl -w net.ipv4.tcp_no_metrics_save=1"]);
        assert_eq!(find(&fs, "mptcp.enabled").status, Status::Info);
    }

    #[test]
    fn a_registered_but_restricted_cc_names_the_allowed_sysctl() {
        let mut f = healthy();
        f.cc = Some(CcCatalog {
            available: vec!["reno".into(), "bbr".into(), "cubic".into()],
            allowed: vec!["reno".into(), "bbr".into()],
            default: "bbr".into(),
        });
        f.root = false;
        let fs = judge(&f, &path(1_000_000_000, 100));
        let a = find(&fs, "cc.allowed");
        assert_eq!(a.status, Status::Info);
        assert!(a.summary.starts_with("cubic registered"), "{}", a.summary);
        assert!(a
            .summary
            .contains("net.ipv4.tcp_allowed_congestion_control"));
        assert!(a.detail.as_ref().unwrap().contains("cannot select"));
        assert_eq!(
            a.fix,
            ["sysctl -w net.ipv4.tcp_allowed_congestion_control=\"reno bbr cubic\""]
        );
        assert!(find(&fs, "cc.default").summary.contains("bbr"));
    }

    #[test]
    fn bpf_needs_btf_privilege_and_a_recent_kernel() {
        let ok = bpf_finding(true, true, Some("6.18.44"));
        assert_eq!(ok.status, Status::Ok);
        let no_btf = bpf_finding(false, true, Some("6.18.44"));
        assert_eq!(no_btf.status, Status::Warn);
        assert!(no_btf.summary.contains(BTF));
        assert!(bpf_finding(true, false, Some("6.1.0"))
            .summary
            .contains("run as root"));
        assert!(bpf_finding(true, true, Some("5.4.0-150-generic"))
            .summary
            .contains("predates 6.4"));
        // Debian 12's kernel has struct_ops, but not as links: the bundled ones fail there.
        let debian12 = bpf_finding(true, true, Some("6.1.0-18-amd64"));
        assert_eq!(debian12.status, Status::Warn);
        assert_eq!(bpf_finding(true, true, Some("6.4.0")).status, Status::Ok);
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("weird"), None);
    }

    #[test]
    fn interface_checks() {
        let mut i = eth0();
        i.tx_queue_len = Some(100);
        i.qdisc = Qdisc::Kinds(vec!["pfifo_fast".into()]);
        i.speed_mbps = Some(100);
        let fs = interface_findings(&i, Some(1_000_000_000));
        let t = find(&fs, "interface.txqueuelen");
        assert_eq!(t.status, Status::Warn);
        assert_eq!(t.fix, ["ip link set dev eth0 txqueuelen 10000"]);
        let q = find(&fs, "interface.qdisc");
        assert_eq!(q.status, Status::Info);
        assert!(q.summary.contains("TCP paces internally"), "{}", q.summary);
        assert_eq!(find(&fs, "interface.speed").status, Status::Warn);
        assert_eq!(find(&fs, "interface.mtu").status, Status::Ok);
        let no_tc = qdisc_finding("eth0", &Qdisc::NoTc);
        assert_eq!(no_tc.fix, ["apt-get install -y iproute2"]);
        assert_eq!(
            qdisc_kinds("qdisc mq 0: root\nqdisc fq 0: parent :1 limit 10000p\n"),
            ["mq", "fq"]
        );
    }

    #[test]
    fn an_unreachable_host_fails() {
        let r = route_finding(&Route::Unreachable {
            host: "192.0.2.1".parse().unwrap(),
            error: "Network is unreachable".into(),
        });
        assert_eq!(r.status, Status::Fail);
    }

    #[test]
    fn checks_this_host_toward_loopback() {
        let fs = run(&DoctorOptions {
            host: Some("127.0.0.1".parse().unwrap()),
            ..path(1_000_000_000, 10)
        });
        assert!(find(&fs, "route.interface").summary.ends_with("on lo"));
        assert!(find(&fs, "interface.mtu").summary.starts_with("lo:"));
        find(&fs, "buffers.send");
        find(&fs, "bpf.struct_ops");
    }
}
