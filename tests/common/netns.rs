//! A dumbbell path in network namespaces for tests that need a real bottleneck: sender →
//! router → receiver over veth pairs, the router's egress toward the receiver shaped by TBF
//! (rate, with a peak rate far above it and one-packet MTU so GSO bursts are cut into wire
//! packets) feeding a drop-tail `pfifo` of a given number of packets. Sender segmentation
//! offloads are off so the queue counts wire packets. Everything is removed on drop.

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Address of the receiver host inside its namespace.
pub const RECEIVER: &str = "10.9.2.2";
/// Address of the sender host inside its namespace.
pub const SENDER: &str = "10.9.1.1";
/// The sender's address on the second path ([`Dumbbell::second_path`]).
pub const SENDER2: &str = "10.9.3.1";

/// A dumbbell of three namespaces.
pub struct Dumbbell {
    prefix: String,
}

/// True when the test runs as root (namespaces need it); prints why a test is skipped if not.
pub fn root_or_skip(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("SKIPPED {test}: network namespaces need root (CI runs as root)");
    }
    root
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Dumbbell {
    /// Builds the path with a `rate_mbit` bottleneck and a `queue` packet drop-tail queue.
    pub fn up(rate_mbit: u32, queue: u32) -> Dumbbell {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let prefix = format!(
            "hx{}{}",
            std::process::id() % 10000,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let d = Dumbbell { prefix };
        let (s, r, v) = (d.ns("s"), d.ns("r"), d.ns("d"));
        for ns in [&s, &r, &v] {
            run(&["ip", "netns", "add", ns]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        let (sa, ra, rb, db) = (d.dev("sa"), d.dev("ra"), d.dev("rb"), d.dev("db"));
        run(&[
            "ip", "link", "add", &sa, "netns", &s, "type", "veth", "peer", "name", &ra, "netns", &r,
        ]);
        run(&[
            "ip", "link", "add", &rb, "netns", &r, "type", "veth", "peer", "name", &db, "netns", &v,
        ]);
        for (ns, dev, addr) in [
            (&s, &sa, "10.9.1.1/24"),
            (&r, &ra, "10.9.1.2/24"),
            (&r, &rb, "10.9.2.1/24"),
            (&v, &db, "10.9.2.2/24"),
        ] {
            run(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        run(&["ip", "-n", &s, "route", "add", "default", "via", "10.9.1.2"]);
        run(&["ip", "-n", &v, "route", "add", "default", "via", "10.9.2.1"]);
        run(&[
            "ip",
            "netns",
            "exec",
            &r,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ]);
        run(&[
            "ip", "netns", "exec", &s, "ethtool", "-K", &sa, "tso", "off", "gso", "off",
        ]);
        run(&[
            "ip", "netns", "exec", &v, "ethtool", "-K", &db, "tso", "off", "gso", "off",
        ]);
        d.bottleneck(&r, &rb, rate_mbit, queue);
        d
    }

    /// Adds a second, disjoint path between the sender and the receiver through a router of
    /// its own (`q`), with a `rate_mbit` bottleneck and a `queue` packet drop-tail queue, as
    /// a host with two uplinks has: the sender's second address [`SENDER2`] is routed out
    /// through it by a routing rule (`ip rule from`), and the receiver reaches its subnet
    /// back through it. Traffic from the sender's first address still takes the first path.
    pub fn second_path(&self, rate_mbit: u32, queue: u32) {
        let (s, q, v) = (self.ns("s"), self.ns("q"), self.ns("d"));
        run(&["ip", "netns", "add", &q]);
        run(&["ip", "-n", &q, "link", "set", "lo", "up"]);
        let (sc, qa, qb, dc) = (
            self.dev("sc"),
            self.dev("qa"),
            self.dev("qb"),
            self.dev("dc"),
        );
        run(&[
            "ip", "link", "add", &sc, "netns", &s, "type", "veth", "peer", "name", &qa, "netns", &q,
        ]);
        run(&[
            "ip", "link", "add", &qb, "netns", &q, "type", "veth", "peer", "name", &dc, "netns", &v,
        ]);
        for (ns, dev, addr) in [
            (&s, &sc, "10.9.3.1/24"),
            (&q, &qa, "10.9.3.2/24"),
            (&q, &qb, "10.9.4.1/24"),
            (&v, &dc, "10.9.4.2/24"),
        ] {
            run(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        run(&[
            "ip", "-n", &s, "rule", "add", "from", SENDER2, "lookup", "103",
        ]);
        run(&[
            "ip", "-n", &s, "route", "add", "default", "via", "10.9.3.2", "table", "103",
        ]);
        run(&[
            "ip",
            "-n",
            &q,
            "route",
            "add",
            "10.9.2.0/24",
            "via",
            "10.9.4.2",
        ]);
        run(&[
            "ip",
            "-n",
            &v,
            "route",
            "add",
            "10.9.3.0/24",
            "via",
            "10.9.4.1",
        ]);
        run(&[
            "ip",
            "netns",
            "exec",
            &q,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ]);
        for (ns, dev) in [(&s, &sc), (&v, &dc)] {
            run(&[
                "ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off",
            ]);
        }
        self.bottleneck(&q, &qb, rate_mbit, queue);
    }

    /// Bytes the bottleneck of path 1 (`r`) or path 2 (`q`) has sent.
    pub fn bottleneck_sent(&self, router: &str) -> u64 {
        let dev = match router {
            "r" => self.dev("rb"),
            _ => self.dev("qb"),
        };
        let out = Command::new("tc")
            .args(["-n", &self.ns(router), "-s", "qdisc", "show", "dev", &dev])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut words = text.split_whitespace();
        words.find(|w| *w == "Sent");
        words.next().and_then(|n| n.parse().ok()).unwrap_or(0)
    }

    /// Gives `host` (`s` or `d`) a route toward the other end's subnet that carries
    /// `congctl WORDS` (e.g. `["lock", "cubic"]`), as a data-transfer node's default may be set.
    pub fn congctl_route(&self, host: &str, words: &[&str]) {
        let (subnet, via) = match host {
            "s" => ("10.9.2.0/24", "10.9.1.2"),
            _ => ("10.9.1.0/24", "10.9.2.1"),
        };
        let ns = self.ns(host);
        let mut args = vec![
            "ip", "-n", &ns, "route", "replace", subnet, "via", via, "congctl",
        ];
        args.extend_from_slice(words);
        run(&args);
    }

    /// Shapes `dev`'s egress in namespace `ns`: TBF at `rate_mbit` into a `queue` packet
    /// drop-tail `pfifo`.
    fn bottleneck(&self, ns: &str, dev: &str, rate_mbit: u32, queue: u32) {
        let rate = format!("{rate_mbit}mbit");
        run(&[
            "tc",
            "-n",
            ns,
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
            "20000",
            "limit",
            "100000",
            "peakrate",
            "10000gbit",
            "mtu",
            "1514",
        ]);
        let limit = queue.to_string();
        run(&[
            "tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "pfifo",
            "limit", &limit,
        ]);
    }

    /// The namespace of `host`: `s` (sender), `r` (router) or `d` (receiver), and `q` (the
    /// second path's router).
    pub fn ns(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    fn dev(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A command run inside `host`'s namespace.
    pub fn command(&self, host: &str, program: &str) -> Command {
        super::isolate_profiles();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(host), program]);
        c
    }

    /// Starts `hsxfer serve` on the receiver host with a token.
    pub fn serve(&self, root: &std::path::Path, token: &std::path::Path, port: u16) -> ServerProc {
        self.serve_with(root, token, port, &[])
    }

    /// Starts `hsxfer serve ... EXTRA` on the receiver host with a token.
    pub fn serve_with(
        &self,
        root: &std::path::Path,
        token: &std::path::Path,
        port: u16,
        extra: &[&str],
    ) -> ServerProc {
        let child = self
            .command("d", env!("CARGO_BIN_EXE_hsxfer"))
            .args([
                "serve",
                "--root",
                root.to_str().unwrap(),
                "--listen",
                RECEIVER,
            ])
            .args([
                "--port",
                &port.to_string(),
                "--token-file",
                token.to_str().unwrap(),
            ])
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .expect("start the server");
        // Wait until it accepts connections.
        self.wait_listening(port, Duration::from_secs(5));
        ServerProc(child)
    }

    /// Waits (at most `limit`) until the receiver host accepts connections on `port` from the
    /// sender host; false if it never did.
    pub fn wait_listening(&self, port: u16, limit: Duration) -> bool {
        accepts_within(&self.ns("s"), RECEIVER, port, limit)
    }

    /// Runs `hsxfer ARGS` on the sender host and waits for it.
    pub fn client(&self, args: &[&str]) -> Output {
        self.command("s", env!("CARGO_BIN_EXE_hsxfer"))
            .args(args)
            .output()
            .expect("run the client")
    }

    /// The bottleneck queue's statistics line (`Sent ... dropped ...`).
    pub fn bottleneck_stats(&self) -> String {
        let out = Command::new("tc")
            .args([
                "-n",
                &self.ns("r"),
                "-s",
                "qdisc",
                "show",
                "dev",
                &self.dev("rb"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Dumbbell {
    fn drop(&mut self) {
        for host in ["s", "r", "d", "q"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(host)])
                .output();
        }
    }
}

/// Whether `addr`:`port` accepts a connection from namespace `ns` within `limit` (tried
/// every 50 ms).
fn accepts_within(ns: &str, addr: &str, port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let probe = format!("exec 3<>/dev/tcp/{addr}/{port}");
    while Instant::now() < deadline {
        let tried = Command::new("ip")
            .args(["netns", "exec", ns, "bash", "-c", &probe])
            .output()
            .unwrap();
        if tried.status.success() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A server process, killed on drop.
pub struct ServerProc(Child);

impl ServerProc {
    /// Stops the server as an operator would (SIGTERM), so that it puts back what it set,
    /// and waits for it.
    pub fn terminate(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A network namespace with only loopback up, removed on drop: for tests whose servers set
/// the namespace's MPTCP path manager (announced ports, limits), which a killed server
/// cannot put back.
pub struct LoopbackNs(String);

impl LoopbackNs {
    /// Makes the namespace and brings its loopback up.
    pub fn up() -> LoopbackNs {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "hxl{}{}",
            std::process::id() % 10000,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run(&["ip", "netns", "add", &name]);
        run(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        LoopbackNs(name)
    }

    /// `program` run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        super::isolate_profiles();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, program]);
        c
    }

    /// The output of `ip mptcp WHAT` in the namespace (`limits`, `endpoint`).
    pub fn ip_mptcp(&self, what: &str) -> String {
        let out = self.command("ip").args(["mptcp", what]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts `hsxfer serve --no-auth --port PORT --root ROOT ARGS` in the namespace, with
    /// `env` set and its stderr dropped, and waits until it accepts.
    pub fn serve(
        &self,
        root: &std::path::Path,
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ServerProc {
        let child = self
            .command(env!("CARGO_BIN_EXE_hsxfer"))
            .args(["serve", "--no-auth", "--port", &port.to_string(), "--root"])
            .arg(root)
            .args(args)
            .envs(env.iter().copied())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the server");
        self.wait_listening(port);
        ServerProc(child)
    }

    /// Waits (at most 10 s) until something in the namespace accepts connections on
    /// 127.0.0.1:`port`.
    pub fn wait_listening(&self, port: u16) {
        assert!(
            accepts_within(&self.0, "127.0.0.1", port, Duration::from_secs(10)),
            "server did not start"
        );
    }
}

impl Drop for LoopbackNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}
