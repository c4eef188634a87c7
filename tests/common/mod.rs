//! Shared helpers for the integration tests: an in-process server on a loopback port, data
//! generators, and comparisons that do not use hsxfer's own hashing.
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

pub mod netns;

use hsxfer::session::handshake::Opener;
use hsxfer::transport::tls::{default_key_path, ClientTls, ServerIdentity, ServerTls, Stream};
use hsxfer::{
    Auth, Client, FaultInjection, LiveStats, Server, ServerConfig, ServerLimits, TransferOptions,
};
use rand::{RngCore, SeedableRng};

/// Points every hsxfer process this test binary starts at a cache and a configuration
/// directory of its own, so that no saved path profile, server key or known-servers entry (of
/// the machine's user, or of another test binary) changes what a test runs. Every server of
/// the binary then has the one key in that directory, so a port reused by another server is
/// not a changed key.
///
/// The directories are named after the test process, which cannot remove them at its exit;
/// each test binary removes those of earlier test processes that have ended.
pub fn isolate_profiles() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let id = std::process::id();
        let tmp = std::env::temp_dir();
        remove_ended_test_dirs(&tmp);
        std::env::set_var(
            "XDG_CACHE_HOME",
            tmp.join(format!("hsxfer-test-cache-{id}")),
        );
        std::env::set_var(
            "XDG_CONFIG_HOME",
            tmp.join(format!("hsxfer-test-config-{id}")),
        );
    });
}

/// Removes the profile directories ([`isolate_profiles`]) of test processes that have ended.
fn remove_ended_test_dirs(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| {
            n.strip_prefix("hsxfer-test-cache-")
                .or_else(|| n.strip_prefix("hsxfer-test-config-"))
        });
        let ended =
            pid.is_some_and(|p| p.parse::<u32>().is_ok() && !Path::new("/proc").join(p).exists());
        if ended {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The TLS configuration of this test binary's in-process servers: its one key, and clear
/// text allowed or not.
pub fn server_tls(allow_clear: bool) -> ServerTls {
    isolate_profiles();
    let path = default_key_path().expect("XDG_CONFIG_HOME is set");
    let (id, _) = ServerIdentity::load_or_create(&path).expect("a server key");
    ServerTls::new(&id, allow_clear)
}

/// Opens a connection to a server the way clients do, in TLS (any key), ready for the
/// handshake.
pub async fn open(addr: SocketAddr) -> Stream {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    Opener::Tls(ClientTls::new(None))
        .open(tcp, "test")
        .await
        .expect("a TLS connection")
}

/// Starts a server on an ephemeral loopback port, serving `root`.
pub async fn server(root: &Path, auth: Auth, faults: FaultInjection) -> SocketAddr {
    server_with(root, auth, faults, ServerLimits::default()).await
}

/// Starts a server with explicit limits.
pub async fn server_with(
    root: &Path,
    auth: Auth,
    faults: FaultInjection,
    limits: ServerLimits,
) -> SocketAddr {
    serve(ServerConfig {
        limits,
        ..config(root, auth, faults, false)
    })
    .await
}

/// A loopback server's configuration; `allow_clear` also serves clear-text clients.
pub fn config(root: &Path, auth: Auth, faults: FaultInjection, allow_clear: bool) -> ServerConfig {
    ServerConfig {
        root: root.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        auth,
        faults,
        limits: ServerLimits::default(),
        mptcp: false,
        mptcp_pm: Default::default(),
        tls: server_tls(allow_clear),
    }
}

/// Starts a server with this configuration; returns its address.
pub async fn serve(cfg: ServerConfig) -> SocketAddr {
    let s = Server::bind(cfg).await.expect("server binds");
    let addr = s.local_addr();
    tokio::spawn(s.run());
    addr
}

/// A client of `addr` with `channels` channels and no token.
pub fn client(addr: SocketAddr, channels: u16) -> Client {
    client_with(addr, channels, Auth::NoAuth, FaultInjection::default())
}

/// A client with explicit auth and faults.
pub fn client_with(addr: SocketAddr, channels: u16, auth: Auth, faults: FaultInjection) -> Client {
    isolate_profiles();
    Client::new(
        &addr.ip().to_string(),
        TransferOptions {
            channels,
            port: addr.port(),
            auth,
            faults,
            ..Default::default()
        },
    )
}

/// Fresh live counters for `n` channels.
pub fn live(n: u16) -> Arc<LiveStats> {
    Arc::new(LiveStats::new(n as usize))
}

/// Writes `size` pseudo-random bytes (seeded) to `path`.
pub fn random_file(path: &Path, size: u64, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut f = fs::File::create(path).unwrap();
    let mut buf = vec![0u8; 8 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
}

/// SHA-256 of a file by coreutils' `sha256sum`: independent of hsxfer's own hashing.
pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// One entry of a [`snapshot`]: relative path, is-directory, size, mode, mtime (s), content hash.
pub type Snap = (PathBuf, bool, u64, u32, i64, Option<[u8; 32]>);

/// Every entry below `root`, sorted.
pub fn snapshot(root: &Path) -> Vec<Snap> {
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Snap>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_path_buf();
        if m.is_dir() {
            out.push((rel, true, 0, m.mode() & 0o7777, m.mtime(), None));
            walk(root, &p, out);
        } else if m.is_file() {
            let h = *blake3::hash(&fs::read(&p).unwrap()).as_bytes();
            out.push((rel, false, m.len(), m.mode() & 0o7777, m.mtime(), Some(h)));
        }
    }
}

/// Builds a tree: nested and empty directories, empty files, and `small` small files.
pub fn make_tree(top: &Path, small: usize) {
    fs::create_dir_all(top.join("a/b/c")).unwrap();
    fs::create_dir_all(top.join("empty/deeper-empty")).unwrap();
    fs::write(top.join("a/zero"), b"").unwrap();
    fs::write(top.join("a/b/c/one"), b"1").unwrap();
    random_file(&top.join("a/b/odd"), 5 * 1024 * 1024 + 4321, 7);
    fs::set_permissions(top.join("a/b/odd"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::create_dir(top.join("many")).unwrap();
    for i in 0..small {
        let d = top.join(format!("many/d{:02}", i % 20));
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join(format!("f{i:05}")),
            format!("file {i}\n").repeat(i % 50),
        )
        .unwrap();
    }
}

/// Parses NDJSON output and checks every line against docs/json-schema.json.
pub fn validated_events(stdout: &[u8]) -> Vec<serde_json::Value> {
    let schema: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/json-schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let text = String::from_utf8(stdout.to_vec()).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    for e in &events {
        let errors: Vec<String> = validator.iter_errors(e).map(|x| x.to_string()).collect();
        assert!(errors.is_empty(), "{e}\n{errors:#?}");
        // A transfer's events are the library's typed events, field for field.
        if [
            "start", "progress", "channel", "warning", "summary", "error",
        ]
        .contains(&e["type"].as_str().unwrap_or(""))
        {
            let typed: hsxfer::session::events::Event =
                serde_json::from_value(e.clone()).unwrap_or_else(|x| panic!("{x}: {e}"));
            assert_eq!(&serde_json::to_value(&typed).unwrap(), e);
        }
    }
    // The validator is not vacuous: a summary, a probe or an error missing a field is
    // rejected.
    let mut broken = events.last().unwrap().clone();
    let field = match broken["type"].as_str() {
        Some("probe") => "loss_is_random",
        Some("error") => "message",
        _ => "loss_sync",
    };
    broken.as_object_mut().unwrap().remove(field);
    assert!(!validator.is_valid(&broken), "{broken}");
    events
}

/// A loopback port nothing uses right now, below the kernel's ephemeral range. A port the
/// kernel picked from that range (bind to port 0) could go to another test's outgoing
/// connection before the server under test bound it: the server then exited and a test
/// waited in vain for it to listen (CI, `tests/tls.rs`). Ports below the range are never
/// handed out that way. The ports returned are 32 apart, and each call in a test process
/// tries the next: an MPTCP server also takes the ports above its own for its subflows, and
/// leaves them announced when it is killed. Where the range starts below 20,160 (or cannot
/// be read, and is taken to start at 32,768 as is usual), the kernel's pick is the fallback.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOWEST: u16 = 20_000;
    const STRIDE: u16 = 32;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let ephemeral_start = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let slots = ephemeral_start.saturating_sub(LOWEST) / STRIDE;
    if slots > 4 {
        // Each test binary starts somewhere else.
        let first = (std::process::id() % u32::from(slots)) as u16;
        for _ in 0..slots {
            let slot = (first + NEXT.fetch_add(1, Ordering::Relaxed) % slots) % slots;
            let port = LOWEST + slot * STRIDE;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An `hsxfer serve` process, killed when dropped. One started with [`ServerProc::logged`]
/// keeps its stderr in a file and prints it when the test fails, so that a CI log says why
/// a server did not start or ended a session.
pub struct ServerProc(pub std::process::Child, Option<tempfile::NamedTempFile>);

impl ServerProc {
    /// A server whose stderr the caller chose (or discarded).
    pub fn new(child: std::process::Child) -> ServerProc {
        ServerProc(child, None)
    }

    /// Spawns `cmd` with its stderr kept for the failure message.
    pub fn logged(cmd: &mut Command) -> ServerProc {
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = cmd.stderr(log.reopen().unwrap()).spawn().unwrap();
        ServerProc(child, Some(log))
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if let Some(log) = self.1.as_ref().filter(|_| std::thread::panicking()) {
            let text = fs::read_to_string(log.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- the server's stderr, last {} lines:", tail.len());
            tail.iter().rev().for_each(|l| eprintln!("{l}"));
        }
    }
}

/// Waits until something accepts connections on loopback `port`.
pub fn wait_listening(port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "server did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The hsxfer binary run with its open-files limit at `nofile`, soft and hard (1,024 on many
/// hosts).
pub fn limited_to(nofile: u32) -> Command {
    isolate_profiles();
    let mut c = Command::new("prlimit");
    c.arg(format!("--nofile={nofile}:{nofile}"))
        .arg(env!("CARGO_BIN_EXE_hsxfer"));
    c
}

/// `hsxfer serve --no-auth` at `ulimit -n 1024` on a free loopback port, serving `root`.
pub fn limited_server(root: &Path) -> (ServerProc, u16) {
    limited_server_at(root, 1024)
}

/// `hsxfer serve --no-auth` at `ulimit -n NOFILE` on a free loopback port, serving `root`.
pub fn limited_server_at(root: &Path, nofile: u32) -> (ServerProc, u16) {
    limited_server_with(root, nofile, &[])
}

/// [`limited_server_at`] with more arguments for `hsxfer serve`.
pub fn limited_server_with(root: &Path, nofile: u32, args: &[&str]) -> (ServerProc, u16) {
    let port = free_port();
    let server = ServerProc::logged(
        limited_to(nofile)
            .args(["serve", "--no-auth", "--port", &port.to_string(), "--root"])
            .arg(root)
            .args(args),
    );
    wait_listening(port);
    (server, port)
}

/// A lab run's share of delay-element releases over 1 ms late, for failure messages.
pub fn late_text(late: Option<f64>) -> String {
    late.map_or("releases not counted".into(), |s| {
        format!("{:.1} % of the releases over 1 ms late", s * 100.0)
    })
}
