//! Building, finding and removing a lab: namespaces, veth pairs, addresses and routes,
//! per-namespace sysctls, offloads, qdiscs (the bottleneck and a plain queue on every other
//! transmitting veth), the delay element with its netfilter rules, and an hsxfer server on
//! the receiver. State lives in `/run/hsxfer/lab/NAME/` so later commands find the lab.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::config::{check_name, Host, LabSpec};
use super::element;
use super::own::Claim;
use super::LabError;

/// Where labs keep their state.
pub const STATE_ROOT: &str = "/run/hsxfer/lab";
/// Port of the lab's hsxfer server on the receiver.
pub const SERVER_PORT: u16 = 7420;
/// Handle of the bottleneck's drop-tail queue (child of the shaper `1:`).
pub const BOTTLENECK_HANDLE: &str = "10:";
/// Packets every other transmitting veth may queue (never the place that drops).
const PLAIN_QUEUE: u32 = 10_000;
/// CPU the delay element is pinned to; end hosts steer receive work to the next one.
const ELEMENT_CPU: usize = 0;
/// Real-time priority of the delay element.
const ELEMENT_PRIORITY: i32 = 50;

/// What a lab remembers between commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabState {
    /// The settings it was built with.
    pub spec: LabSpec,
    /// Bottleneck queue in packets.
    pub queue_packets: u32,
    /// The hsxfer program the lab runs on its hosts.
    pub program: PathBuf,
    /// Process id of the delay element.
    pub element_pid: u32,
    /// Process id of the hsxfer server on the receiver.
    pub server_pid: Option<u32>,
    /// Token file the server and lab clients share.
    pub token_file: PathBuf,
    /// Unix time the lab came up.
    pub created_unix: u64,
    /// The self-check's results, when it ran.
    pub check: Option<SelfCheck>,
}

/// Results of the self-check (`selfcheck::run_checks`), kept in the lab's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfCheck {
    /// RTT set for sender 1, ms.
    pub rtt_set_ms: f64,
    /// Median RTT of the pings from sender 1 to the receiver, ms.
    pub rtt_measured_ms: f64,
    /// Within `selfcheck::RTT_TOLERANCE`.
    pub rtt_ok: bool,
    /// Goodput of one BBR flow with a 1 BDP queue after its ramp-up, bits/s.
    pub single_flow_bps: f64,
    /// That goodput over the ceiling the rate allows at this MTU.
    pub single_flow_utilization: f64,
    /// At least `selfcheck::RATE_TARGET`.
    pub rate_ok: bool,
    /// Packets the bottleneck dropped during the check.
    pub bottleneck_drops: u64,
    /// Packets dropped anywhere else (qdiscs, netfilter queue, delay element): must be 0.
    pub drops_elsewhere: u64,
    /// The bottleneck queue limit the kernel reports.
    pub queue_limit: Option<u64>,
    /// Drops only at the bottleneck and the limit as configured.
    pub queue_ok: bool,
    /// 99th percentile of the delay element's release lateness, µs.
    pub lateness_p99_us: u64,
    /// What to tell the user when a check failed.
    pub notes: Vec<String>,
}

impl SelfCheck {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.rtt_ok && self.rate_ok && self.queue_ok
    }
}

/// A lab that is up.
#[derive(Debug)]
pub struct Lab {
    /// Its state.
    pub state: LabState,
    dir: PathBuf,
    /// This process's claim, on a lab it built: while it is held, a signal that stops the
    /// process removes the lab ([`own`](super::own)).
    claim: Option<Claim>,
}

/// Runs a command to completion; fails with its stderr when it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<String, LabError> {
    let line = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(LabError::io(format!("running {line}")))?;
    if !out.status.success() {
        return Err(LabError::Command {
            command: line,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// True when `program` is found in a directory of `PATH`.
pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).exists()))
}

/// Fails unless running as root with every program the lab drives.
pub fn preflight() -> Result<(), LabError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(LabError::NotRoot);
    }
    for (program, package) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("ethtool", "ethtool"),
        ("iptables-legacy", "iptables"),
        ("ping", "iputils-ping"),
        ("sysctl", "procps"),
    ] {
        if !on_path(program) {
            return Err(LabError::Missing {
                program: program.into(),
                hint: format!(
                    "install it with `apt-get install {package}` (scripts/setup.sh does)"
                ),
            });
        }
    }
    Ok(())
}

impl Lab {
    /// The state directory of lab `name`.
    pub fn state_dir(name: &str) -> PathBuf {
        Path::new(STATE_ROOT).join(name)
    }

    /// Builds a lab running `program` (the hsxfer binary) on its hosts. Refuses to build over
    /// an existing lab of the same name; removes whatever it built if a step fails.
    /// Until [`Lab::release`], a signal that stops the process removes the lab.
    pub fn up(spec: &LabSpec, program: &Path) -> Result<Lab, LabError> {
        spec.validate()?;
        preflight()?;
        let dir = Lab::state_dir(&spec.name);
        if dir.exists() || !namespaces_of(&spec.name)?.is_empty() {
            return Err(LabError::Exists(spec.name.clone()));
        }
        let claim = Claim::new(&spec.name);
        fs::create_dir_all(&dir).map_err(LabError::io(format!("creating {}", dir.display())))?;
        let token_file = dir.join("token");
        crate::session::token::new(&token_file)
            .map_err(|e| LabError::io("writing the lab's token")(std::io::Error::other(e)))?;
        let mut lab = Lab {
            state: LabState {
                spec: spec.clone(),
                queue_packets: spec.queue_packets(),
                program: program.to_path_buf(),
                element_pid: 0,
                server_pid: None,
                token_file,
                created_unix: crate::session::probe::unix_now(),
                check: None,
            },
            dir,
            claim: Some(claim),
        };
        match lab.build() {
            Ok(()) => {
                lab.save()?;
                Ok(lab)
            }
            Err(e) => {
                let _ = lab.teardown();
                Err(e)
            }
        }
    }

    /// Finds a lab that is up.
    pub fn open(name: &str) -> Result<Lab, LabError> {
        check_name(name)?;
        let dir = Lab::state_dir(name);
        let text = fs::read(dir.join("state.json")).map_err(|_| LabError::NotFound(name.into()))?;
        let state: LabState = serde_json::from_slice(&text).map_err(|e| {
            LabError::Invalid(format!("lab state {} is damaged: {e}", dir.display()))
        })?;
        Ok(Lab {
            state,
            dir,
            claim: None,
        })
    }

    /// Names of the labs that are up.
    pub fn list() -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(STATE_ROOT)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().join("state.json").exists())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Removes lab `name`: its processes, namespaces and state. Also cleans up what a failed
    /// or killed `up` left behind.
    pub fn down(name: &str) -> Result<(), LabError> {
        check_name(name)?;
        match Lab::open(name) {
            Ok(lab) => lab.teardown(),
            Err(_) => {
                let spec = LabSpec {
                    name: name.into(),
                    ..LabSpec::default()
                };
                let dir = Lab::state_dir(name);
                if !dir.exists() && namespaces_of(name)?.is_empty() {
                    return Err(LabError::NotFound(name.into()));
                }
                remove_namespaces(&spec.name)?;
                let _ = fs::remove_dir_all(dir);
                Ok(())
            }
        }
    }

    /// Removes every lab this process claimed (what was built of it so far, for one being
    /// built); returns their names. For a process about to end on a signal.
    pub fn remove_claimed() -> Vec<String> {
        let names = super::own::take_claimed();
        for name in &names {
            let _ = Lab::down(name);
        }
        names
    }

    /// Gives up this process's claim on a lab it built: the lab stays up after the process
    /// ends, whatever stops it.
    pub fn release(&mut self) {
        self.claim.take();
    }

    /// The settings.
    pub fn spec(&self) -> &LabSpec {
        &self.state.spec
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A command that runs `program` inside `host`'s namespace, kept off the delay element's
    /// CPU: a process there runs the emulated path's softirq work (a 4 MiB `send` pushes
    /// thousands of packets through router and shaper inline) and cannot be preempted
    /// meanwhile, which delayed ACK releases by tens of milliseconds. Its cache directory is
    /// the lab's own, so saved path profiles belong to this lab and leave with it.
    pub fn command(&self, host: Host, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.env("XDG_CACHE_HOME", self.dir.join("cache"));
        c.args(["netns", "exec", &self.spec().namespace(host)]);
        if let Some(cpus) = host_cpus() {
            c.args(["taskset", "-c", &cpus]);
        }
        c.arg(program);
        c
    }

    /// A command that runs the lab's hsxfer inside `host`'s namespace.
    pub fn hsxfer(&self, host: Host) -> Command {
        self.command(host, &self.state.program)
    }

    /// The hosts of this lab.
    pub fn hosts(&self) -> Vec<Host> {
        self.spec().hosts()
    }

    /// Fails unless `host` exists in this lab.
    pub fn check_host(&self, host: Host) -> Result<(), LabError> {
        if self.hosts().contains(&host) {
            Ok(())
        } else {
            Err(LabError::Invalid(format!(
                "this lab has no {host}: it has {} sender(s), a router and a receiver",
                self.spec().senders
            )))
        }
    }

    /// Sets the bottleneck queue to `packets` (experiments switch between tiny and BDP).
    pub fn set_queue(&mut self, packets: u32) -> Result<(), LabError> {
        let limit = packets.to_string();
        let router = self.spec().namespace(Host::Router);
        run(&mut cmd(
            "tc",
            &[
                "-n",
                &router,
                "qdisc",
                "change",
                "dev",
                "to-rcv",
                "parent",
                "1:1",
                "handle",
                BOTTLENECK_HANDLE,
                "pfifo",
                "limit",
                &limit,
            ],
        ))?;
        self.state.queue_packets = packets;
        self.save()
    }

    /// Saves the state file.
    pub fn save(&self) -> Result<(), LabError> {
        let text = serde_json::to_vec_pretty(&self.state).expect("state serializes");
        fs::write(self.dir.join("state.json"), text).map_err(LabError::io("saving the lab's state"))
    }

    /// The delay element's statistics file.
    pub fn element_stats_path(&self) -> PathBuf {
        self.dir.join("delay.json")
    }

    /// The delay element's release counts as last published (every 500 ms), if it runs.
    pub fn releases(&self) -> Option<element::Releases> {
        element::Releases::read(&self.element_stats_path())
    }

    fn ns(&self, host: Host) -> String {
        self.spec().namespace(host)
    }

    fn in_ns(&self, host: Host, program: &str, args: &[&str]) -> Result<String, LabError> {
        let ns = self.ns(host);
        let mut c = cmd("ip", &["netns", "exec", &ns, program]);
        c.args(args);
        run(&mut c)
    }

    fn build(&mut self) -> Result<(), LabError> {
        let spec = self.spec().clone();
        let router = self.ns(Host::Router);
        for host in spec.hosts() {
            let ns = self.ns(host);
            run(&mut cmd("ip", &["netns", "add", &ns]))?;
            run(&mut cmd("ip", &["-n", &ns, "link", "set", "lo", "up"]))?;
        }
        let mtu = spec.mtu.to_string();
        let ends: Vec<Host> = (1..=spec.senders)
            .map(Host::Sender)
            .chain([Host::Receiver])
            .collect();
        for &host in &ends {
            let ns = self.ns(host);
            let port = host.router_port();
            run(&mut cmd(
                "ip",
                &[
                    "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                    "netns", &router,
                ],
            ))?;
            let own = format!("{}/24", host.addr());
            let gw = format!("{}/24", host.gateway());
            for (space, dev, addr) in [(&ns, "eth0", &own), (&router, port.as_str(), &gw)] {
                run(&mut cmd(
                    "ip",
                    &["-n", space, "link", "set", dev, "mtu", &mtu],
                ))?;
                run(&mut cmd(
                    "ip",
                    &["-n", space, "addr", "add", addr, "dev", dev],
                ))?;
                run(&mut cmd("ip", &["-n", space, "link", "set", dev, "up"]))?;
            }
            run(&mut cmd(
                "ip",
                &[
                    "-n",
                    &ns,
                    "route",
                    "add",
                    "default",
                    "via",
                    &host.gateway().to_string(),
                ],
            ))?;
        }
        self.set_sysctls()?;
        self.set_offloads(&ends)?;
        self.set_qdiscs(&ends)?;
        self.start_element()?;
        for i in 1..=spec.senders {
            let queue = i.to_string();
            let out = Host::Sender(i).router_port();
            self.in_ns(
                Host::Router,
                "iptables-legacy",
                &[
                    "-A",
                    "FORWARD",
                    "-i",
                    "to-rcv",
                    "-o",
                    &out,
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    &queue,
                ],
            )?;
        }
        self.start_server()
    }

    fn set_sysctls(&self) -> Result<(), LabError> {
        let spec = self.spec();
        let max = spec.socket_buffer_max();
        let rmem = format!("net.ipv4.tcp_rmem=4096 131072 {max}");
        let wmem = format!("net.ipv4.tcp_wmem=4096 16384 {max}");
        self.in_ns(Host::Router, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        for host in spec.hosts() {
            if host == Host::Router {
                continue;
            }
            self.in_ns(
                host,
                "sysctl",
                &["-qw", &rmem, &wmem, "net.ipv4.tcp_no_metrics_save=1"],
            )?;
        }
        Ok(())
    }

    fn set_offloads(&self, ends: &[Host]) -> Result<(), LabError> {
        let gro = if self.spec().gro { "on" } else { "off" };
        for &host in ends {
            self.in_ns(
                host,
                "ethtool",
                &["-K", "eth0", "tso", "off", "gso", "off", "gro", gro],
            )?;
            self.in_ns(
                Host::Router,
                "ethtool",
                &["-K", &host.router_port(), "gro", gro],
            )?;
            if host_cpus().is_some() {
                let mask = format!("{:x}", 1u64 << (ELEMENT_CPU + 1));
                self.in_ns(
                    host,
                    "sh",
                    &[
                        "-c",
                        &format!("echo {mask} > /sys/class/net/eth0/queues/rx-0/rps_cpus"),
                    ],
                )?;
            }
        }
        Ok(())
    }

    fn set_qdiscs(&self, ends: &[Host]) -> Result<(), LabError> {
        let spec = self.spec();
        let plain = PLAIN_QUEUE.to_string();
        for &host in ends {
            let shaped_reverse = host == Host::Receiver && spec.reverse_rate_bps.is_some();
            if !shaped_reverse {
                let ns = self.ns(host);
                run(&mut cmd(
                    "tc",
                    &[
                        "-n", &ns, "qdisc", "add", "dev", "eth0", "root", "pfifo", "limit", &plain,
                    ],
                ))?;
            }
            if host != Host::Receiver {
                let router = self.ns(Host::Router);
                let port = host.router_port();
                run(&mut cmd(
                    "tc",
                    &[
                        "-n", &router, "qdisc", "add", "dev", &port, "root", "pfifo", "limit",
                        &plain,
                    ],
                ))?;
            }
        }
        self.shape(Host::Router, "to-rcv", spec.rate_bps)?;
        if let Some(rate) = spec.reverse_rate_bps {
            self.shape(Host::Receiver, "eth0", rate)?;
        }
        Ok(())
    }

    /// A token bucket at `rate` with a peak rate far above it and one frame as its MTU (so
    /// GRO/GSO packets are cut into wire packets), feeding a drop-tail queue of the lab's
    /// size in packets.
    fn shape(&self, host: Host, dev: &str, rate_bps: u64) -> Result<(), LabError> {
        let ns = self.ns(host);
        let rate = format!("{rate_bps}bit");
        let burst = (rate_bps / 8 / 2000).max(20_000).to_string();
        let frame = self.spec().frame_bytes().to_string();
        run(&mut cmd(
            "tc",
            &[
                "-n",
                &ns,
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "handle",
                "1:",
                "tbf",
                "rate",
                &rate,
                "burst",
                &burst,
                "limit",
                "1000000",
                "peakrate",
                "10000gbit",
                "mtu",
                &frame,
            ],
        ))?;
        let limit = self.state.queue_packets.to_string();
        run(&mut cmd(
            "tc",
            &[
                "-n",
                &ns,
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                "1:1",
                "handle",
                BOTTLENECK_HANDLE,
                "pfifo",
                "limit",
                &limit,
            ],
        ))?;
        Ok(())
    }

    fn start_element(&mut self) -> Result<(), LabError> {
        let spec = self.spec().clone();
        let stats = self.element_stats_path();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(Host::Router)])
            .arg(&self.state.program)
            .args(["lab", "element", "--stats"])
            .arg(&stats);
        for i in 1..=spec.senders {
            c.arg("--queue")
                .arg(format!("{i}:{}us", spec.rtt_of(i).as_micros()));
        }
        if host_cpus().is_some() {
            c.args(["--cpu", &ELEMENT_CPU.to_string()]);
        }
        c.args(["--realtime", &ELEMENT_PRIORITY.to_string()]);
        if let Some(p) = spec.loss {
            c.args(["--loss", &p.to_string()]);
            for i in 1..=spec.senders {
                c.args(["--loss-dev", &Host::Sender(i).router_port()]);
            }
        }
        let pid = self.spawn_daemon(c, "delay.log")?;
        self.state.element_pid = pid;
        let deadline = Instant::now() + Duration::from_secs(5);
        while element::read_stats(&stats).is_none() {
            if !alive(pid) || Instant::now() > deadline {
                let log = fs::read_to_string(self.dir.join("delay.log")).unwrap_or_default();
                return Err(LabError::Timeout(format!(
                    "the delay element did not start: {}",
                    log.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn start_server(&mut self) -> Result<(), LabError> {
        let data = self.dir.join("data");
        fs::create_dir_all(&data).map_err(LabError::io("creating the server's root"))?;
        let mut c = self.hsxfer(Host::Receiver);
        // With MPTCP as well (TCP clients are served as before), so `--mptcp` flows work.
        c.args(["serve", "--mptcp"])
            .arg("--root")
            .arg(&data)
            .args(["--listen", &Host::Receiver.addr().to_string()])
            .args(["--port", &SERVER_PORT.to_string()])
            .arg("--token-file")
            .arg(&self.state.token_file);
        let pid = self.spawn_daemon(c, "server.log")?;
        self.state.server_pid = Some(pid);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let listening = self
                .in_ns(
                    Host::Receiver,
                    "ss",
                    &["-Htln", &format!("sport = :{SERVER_PORT}")],
                )
                .map(|o| !o.trim().is_empty())
                .unwrap_or(false);
            if listening {
                return Ok(());
            }
            if !alive(pid) || Instant::now() > deadline {
                let log = fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                return Err(LabError::Timeout(format!(
                    "the lab's hsxfer server did not start: {}",
                    log.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a long-lived process in its own process group with output to a log file.
    fn spawn_daemon(&self, mut c: Command, log: &str) -> Result<u32, LabError> {
        let log_path = self.dir.join(log);
        let file = fs::File::create(&log_path).map_err(LabError::io("creating a log file"))?;
        let err = file
            .try_clone()
            .map_err(LabError::io("creating a log file"))?;
        let child = c
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(LabError::io("starting a lab process"))?;
        Ok(child.id())
    }

    /// Stops the lab's processes and removes its namespaces and state.
    pub fn teardown(&self) -> Result<(), LabError> {
        for pid in [Some(self.state.element_pid), self.state.server_pid]
            .into_iter()
            .flatten()
            .filter(|p| *p > 0)
        {
            stop(pid);
        }
        remove_namespaces(&self.spec().name)?;
        let _ = fs::remove_dir_all(&self.dir);
        Ok(())
    }

    /// The address of `host` inside the lab.
    pub fn addr(&self, host: Host) -> Ipv4Addr {
        host.addr()
    }
}

/// The CPUs end-host processes run on (all but the delay element's), as a `taskset` list;
/// `None` on a one-CPU host, where nothing is pinned.
fn host_cpus() -> Option<String> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (n >= 2).then(|| format!("{}-{}", ELEMENT_CPU + 1, n - 1))
}

/// True while process `pid` exists and is not a zombie.
pub(crate) fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// SIGTERM, then SIGKILL after 2 s.
pub(crate) fn stop(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    let p = nix::unistd::Pid::from_raw(pid as i32);
    if kill(p, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if alive(pid) {
        let _ = kill(p, Signal::SIGKILL);
    }
}

/// The namespaces whose names mark them as lab `name`'s.
fn namespaces_of(name: &str) -> Result<Vec<String>, LabError> {
    let out = run(&mut cmd("ip", &["netns", "list"]))?;
    let prefix = format!("{name}-");
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| {
            n.strip_prefix(&prefix)
                .is_some_and(|host| host.parse::<Host>().is_ok())
        })
        .map(str::to_string)
        .collect())
}

/// Kills every process left in lab `name`'s namespaces, then deletes them.
fn remove_namespaces(name: &str) -> Result<(), LabError> {
    for ns in namespaces_of(name)? {
        if let Ok(pids) = run(&mut cmd("ip", &["netns", "pids", &ns])) {
            for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                stop(pid);
            }
        }
        run(&mut cmd("ip", &["netns", "del", &ns]))?;
    }
    Ok(())
}
