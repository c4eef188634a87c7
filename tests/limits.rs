//! Bounded resources: a flood of connections that never authenticate, a client that
//! authenticates and then idles, and too many sessions at once are each turned away or timed
//! out, while real copies go on; many clients at once are all served in bounded memory.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use hsxfer::{Auth, Error, FaultInjection, ServerLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The start of a TLS handshake: a record header announcing a 256-byte ClientHello, then
/// its first bytes. A server waits for the rest until its handshake deadline.
fn stalled_client_hello() -> Vec<u8> {
    let mut hello = vec![0x16, 3, 1, 1, 0, 1, 0, 0, 252, 3, 3];
    hello.resize(68, 0);
    hello
}

/// Holds a connection from loopback address `from` that dribbles the start of a TLS
/// handshake one byte every 2 s, so no single read of the server's times out, opening a new
/// one whenever the server drops it, until `stop`; counts the server's busy answers.
async fn hold(from: [u8; 4], port: u16, stop: Arc<AtomicBool>, busy: Arc<AtomicU64>) {
    let hello = stalled_client_hello();
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = connect_from(from, port).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let (mut answer, mut sent, mut buf) = (Vec::new(), 0, [0u8; 64]);
        while !stop.load(Ordering::Relaxed) {
            match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                Err(_) if sent < hello.len() => {
                    if s.write_all(&hello[sent..sent + 1]).await.is_err() {
                        break;
                    }
                    sent += 1;
                }
                Err(_) => {}
            }
        }
        if answer.starts_with(b"HXBZ") {
            busy.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Connections from two loopback addresses that never finish authenticating ([`hold`]), each
/// replaced as soon as the server drops it.
struct Flood {
    stop: Arc<AtomicBool>,
    busy: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    /// Starts `connections` of them, then waits until they are older than a client's
    /// handshake may take, so that a client's connections may take their places.
    async fn start(port: u16, connections: usize) -> Flood {
        let (stop, busy) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let tasks = (0..connections)
            .map(|i| {
                let from = [127, 0, 0, 2 + (i % 2) as u8];
                tokio::spawn(hold(from, port, stop.clone(), busy.clone()))
            })
            .collect();
        tokio::time::sleep(hsxfer::session::admission::MAKE_ROOM_AFTER + Duration::from_secs(1))
            .await;
        Flood { stop, busy, tasks }
    }

    /// Ends the flood; returns how many busy answers it was given.
    async fn end(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.busy.load(Ordering::Relaxed)
    }
}

/// 1,100 connections from two addresses that never finish authenticating are more than the
/// server's 1,024 descriptors: without a cap they leave no descriptor for a real client for
/// longer than it waits for the server's hello. The cap per address turns most away at once;
/// the two addresses fill the server's handshakes (168 at 1,024 descriptors), and a copy from
/// a third address completes all the same, its connections taking the places of the oldest
/// (without that, the copy was turned away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unauthenticated_connections_does_not_stop_a_real_copy() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f");
    random_file(&src, 8 << 20, 11);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let (_server, port) = limited_server(&root);
    let flood = Flood::start(port, 1100).await;
    let mut copy = std::process::Command::new(env!("CARGO_BIN_EXE_hsxfer"));
    copy.args(["copy", "--no-auth", "--port", &port.to_string()])
        .arg(&src)
        .arg("127.0.0.1:");
    let copy = tokio::task::spawn_blocking(move || copy.output().unwrap())
        .await
        .unwrap();
    let turned_away = flood.end().await;
    assert!(
        copy.status.success(),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    assert_eq!(sha256(&src), sha256(&root.join("f")));
    eprintln!("busy answers to the flood: {turned_away}");
    let handshakes = ServerLimits::for_descriptors(1024).handshakes;
    assert!(turned_away >= 1100 - u64::from(handshakes), "{turned_away}");
}

/// A TCP connection to the server at `port` on 127.0.0.1 from the loopback address `from`;
/// only the connect itself may fail.
async fn connect_from(from: [u8; 4], port: u16) -> std::io::Result<TcpStream> {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind((from, 0).into()).unwrap();
    sock.connect(([127, 0, 0, 1], port).into()).await
}

/// A TLS connection to the server at `port` from the loopback address `from`.
async fn open_from(from: [u8; 4], port: u16) -> hsxfer::transport::tls::Stream {
    let tcp = connect_from(from, port).await.unwrap();
    hsxfer::session::handshake::Opener::Tls(hsxfer::transport::tls::ClientTls::new(None))
        .open(tcp, "test")
        .await
        .expect("a TLS connection")
}

/// A token holder's session from `from` that sends no request and joins data channels, one
/// after another, until the server turns one away or `most` have joined. Returns the
/// connections it holds (the session ends when they are dropped) and the answer that
/// ended the joining.
async fn join_until_busy(
    from: [u8; 4],
    port: u16,
    most: u16,
) -> (Vec<hsxfer::transport::tls::Stream>, Option<Error>) {
    use hsxfer::session::handshake::{client_control, client_join};
    let mut ctrl = open_from(from, port).await;
    let key = hsxfer::channels::auth::TokenKey::from_token(b"");
    let (session, skey) = client_control(&mut ctrl, &key, "t").await.unwrap();
    let mut held = vec![ctrl];
    for channel in 0..most {
        let mut s = open_from(from, port).await;
        match client_join(&mut s, &skey, session, channel, "t").await {
            Ok(()) => held.push(s),
            Err(e) => return (held, Some(e)),
        }
    }
    (held, None)
}

/// Sessions that join many data channels and never ask for anything hold the server's
/// descriptors: with the caps of 2,048 descriptors (`ServerLimits::with_channels(256)`; the
/// unit tests check that share) the server takes 256 channels in all and 128 from one
/// address, and turns the next away with which cap it hit, so that accepts and file opens
/// never run out. A copy from another address is served while one address holds its most;
/// once two addresses hold all, a copy is told to retry and how to raise the cap, and it
/// succeeds once they let go. Without the cap every join was admitted. The sessions may
/// wait ten minutes for their requests, however slow the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_channels_are_capped_per_address_and_in_total() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f");
    random_file(&src, 1 << 20, 12);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let limits = ServerLimits {
        request_timeout: Duration::from_secs(600),
        ..ServerLimits::default().with_channels(256)
    };
    let addr = server_with(&root, Auth::NoAuth, FaultInjection::default(), limits).await;
    let port = addr.port();
    let copy = || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_hsxfer"));
        c.args(["copy", "--no-auth", "-n", "4", "--port", &port.to_string()])
            .arg(&src)
            .arg("127.0.0.1:f");
        async move {
            tokio::task::spawn_blocking(move || c.output().unwrap())
                .await
                .unwrap()
        }
    };
    let is_busy = |e: &Option<Error>, per_address: bool| match e {
        Some(Error::Busy { busy, .. }) => {
            busy.cap == hsxfer::channels::busy::Cap::Channels
                && busy.per_address == per_address
                && busy.limit == if per_address { 128 } else { 256 }
        }
        _ => false,
    };

    let (first, _) = join_until_busy([127, 0, 0, 2], port, 128).await;
    let (second, refused) = join_until_busy([127, 0, 0, 2], port, 128).await;
    assert_eq!(first.len() - 1, 128);
    assert_eq!(second.len() - 1, 0);
    assert!(is_busy(&refused, true), "{refused:?}");
    let out = copy().await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha256(&src), sha256(&root.join("f")));

    let (third, refused) = join_until_busy([127, 0, 0, 3], port, 128).await;
    assert_eq!(third.len() - 1, 128, "{refused:?}");
    let (_, refused) = join_until_busy([127, 0, 0, 4], port, 1).await;
    assert!(is_busy(&refused, false), "{refused:?}");
    let out = copy().await;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("256 data channels in total") && said.contains("--max-channels"),
        "{said}"
    );

    drop((first, second, third));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = copy().await;
        if out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the channels were not given back: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A connection that sends its hello one byte at a time is dropped when the whole handshake
/// takes longer than the limit, not only when one read does.
#[tokio::test]
async fn a_handshake_dribbled_byte_by_byte_is_cut_off_at_the_deadline() {
    let root = tempfile::tempdir().unwrap();
    let limits = ServerLimits {
        handshake_timeout: Duration::from_secs(1),
        ..ServerLimits::default()
    };
    let addr = server_with(root.path(), Auth::NoAuth, FaultInjection::default(), limits).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    // 68 bytes: 27 s at this pace.
    for b in stalled_client_hello() {
        if s.write_all(&[b]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut probe = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::ZERO, s.read(&mut probe)).await {
            break;
        }
    }
    let held = started.elapsed();
    assert!(held < Duration::from_secs(5), "held for {held:?}");
}

/// A session past the per-address cap is told which cap and to retry; a session that
/// authenticates and never asks for anything is dropped after the request timeout, which
/// frees its slot.
#[tokio::test]
async fn a_session_past_the_cap_is_told_to_retry_and_an_idle_one_frees_its_slot() {
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    random_file(&src.path().join("f"), 100_000, 3);
    let limits = ServerLimits {
        sessions_per_address: 1,
        request_timeout: Duration::from_secs(2),
        ..ServerLimits::default()
    };
    let addr = server_with(root.path(), Auth::NoAuth, FaultInjection::default(), limits).await;
    let mut idle = open(addr).await;
    let key = hsxfer::channels::auth::TokenKey::from_token(b"");
    hsxfer::session::handshake::client_control(&mut idle, &key, "t")
        .await
        .unwrap();
    let push = || async {
        client(addr, 2)
            .push(&[src.path().join("f")], false, "f", &live(2))
            .await
    };
    let e = push().await.unwrap_err();
    assert!(matches!(e, Error::Busy { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("1 sessions from this client's address")
            && text.contains("retry later")
            && text.contains("`ServerLimits::sessions_per_address`"),
        "{text}"
    );
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(_)) | Ok(Err(_))),
        "idle session dropped"
    );
    let r = push().await.expect("the slot is free again");
    assert!(r.verified);
}

/// Fifty clients at once, two channels each, all served by one server process at
/// `ulimit -n 1024`; its peak memory is reported and stays small. Each block's write takes
/// 1 s more, so that every session has a block received and not yet written at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clients_at_once_are_all_served_in_bounded_memory() {
    const CLIENTS: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let (server, port) = limited_server_with(&root, 1024, &["--debug-slow-block-writes", "1s"]);
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut copies = tokio::task::JoinSet::new();
    for i in 0..CLIENTS {
        let f = dir.path().join(format!("c{i}"));
        random_file(&f, 4 << 20, i as u64);
        copies.spawn(async move {
            let dest = format!("c{i}");
            let r = client(addr, 2).push(&[f], false, &dest, &live(2)).await;
            (i, r)
        });
    }
    while let Some(done) = copies.join_next().await {
        let (i, r) = done.unwrap();
        let r = r.unwrap_or_else(|e| panic!("client {i}: {e}"));
        assert!(r.verified);
        let name = format!("c{i}");
        assert_eq!(sha256(&dir.path().join(&name)), sha256(&root.join(&name)));
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.0.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    eprintln!(
        "server peak RSS with {CLIENTS} clients: {} MiB",
        peak_kib >> 10
    );
    // The server's blocks being received share its 64 MiB of block memory. Every session
    // holding its 4 MiB block at once would be 200 MiB.
    assert!(peak_kib >> 10 <= 128, "{} MiB", peak_kib >> 10);
}

/// A tree of 600 files of three 4 KiB blocks each (so each is journaled while it is
/// received) in ten directories, made as `src` in `dir`; returns its path.
fn large_tree(dir: &std::path::Path) -> std::path::PathBuf {
    let src = dir.join("src");
    for i in 0..600 {
        let d = src.join(format!("d{:02}", i % 10));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i:04}")), vec![(i % 251) as u8; 9000 + i]).unwrap();
    }
    src
}

/// Pushes `src` to `t0`, `t1`, ... on the server at `port`, `clients` copies at once, two
/// channels each; checks that every copy succeeds and arrives whole.
async fn push_at_once(src: &std::path::Path, root: &std::path::Path, port: u16, clients: usize) {
    let pushes: Vec<_> = (0..clients)
        .map(|i| {
            let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_hsxfer"));
            c.args(["copy", "--no-auth", "-r", "--block-size", "4K", "-n", "2"])
                .args(["--port", &port.to_string()])
                .arg(src)
                .arg(format!("127.0.0.1:t{i}"));
            tokio::task::spawn_blocking(move || c.output().unwrap())
        })
        .collect();
    for (i, p) in pushes.into_iter().enumerate() {
        let out = p.await.unwrap();
        assert!(
            out.status.success(),
            "push {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(snapshot(src), snapshot(&root.join(format!("t{i}"))));
    }
}

/// Four pushes of a 600-file tree at once into one server at `ulimit -n 1024`: each session
/// may hold up to 256 unfinished files (a partial file and a journal each), together twice
/// what the server may open. The server hands out open files from one budget, so the
/// sessions take turns instead of failing with "Too many open files".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_large_trees_share_the_servers_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let (src, root) = (large_tree(dir.path()), dir.path().join("root"));
    std::fs::create_dir(&root).unwrap();
    let (_server, port) = limited_server(&root);
    push_at_once(&src, &root, port, 4).await;
}

/// The same four pushes beside a flood of connections that never authenticate, which fills
/// the server's handshakes: the handshakes, the files the pushes hold open, and their
/// sessions and channels fit the server's 1,024 descriptors together, so every push
/// completes. With 512 handshakes beside the files' 512 descriptors they did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_beside_large_pushes_leaves_the_server_its_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let (src, root) = (large_tree(dir.path()), dir.path().join("root"));
    std::fs::create_dir(&root).unwrap();
    let (_server, port) = limited_server(&root);
    let flood = Flood::start(port, 1100).await;
    push_at_once(&src, &root, port, 4).await;
    flood.end().await;
}

/// A pull into a FIFO, whose bytes must go in file order, from a server whose first channel
/// is slow (it waits 500 ms before each block): the other seven channels' blocks arrive
/// ahead of their turn. The client holds at most its limit of them (64 MiB here) and the
/// channels that deliver them wait, so its memory stays small; it once held every block
/// that came early, most of the file.
#[test]
fn a_pull_into_a_fifo_holds_a_bounded_number_of_blocks_ahead_of_their_turn() {
    const SIZE: u64 = 384 << 20;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    random_file(&root.join("big.bin"), SIZE, 17);
    let (_server, port) =
        limited_server_with(&root, 1024, &["--debug-slow-first-channel", "500ms"]);
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let out = dir.path().join("out.bin");
    let reader = {
        let (fifo, out) = (fifo.clone(), out.clone());
        std::thread::spawn(move || {
            let mut from = std::fs::File::open(fifo).unwrap();
            std::io::copy(&mut from, &mut std::fs::File::create(out).unwrap()).unwrap()
        })
    };
    let mut client = limited_to(1024)
        .args(["copy", "--no-auth", "-n", "8", "--tune", "off"])
        .args(["--port", &port.to_string(), "127.0.0.1:big.bin"])
        .arg(&fifo)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The client's peak resident memory, read until it exits.
    let mut peak_kib = 0u64;
    let status = loop {
        if let Some(status) = client.try_wait().unwrap() {
            break status;
        }
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{}/status", client.id())) {
            if let Some(kib) = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = std::io::read_to_string(client.stderr.take().unwrap()).unwrap();
    assert!(status.success(), "{stderr}");
    assert_eq!(reader.join().unwrap(), SIZE);
    assert_eq!(sha256(&out), sha256(&root.join("big.bin")));
    eprintln!("client peak RSS: {} MiB", peak_kib >> 10);
    // 64 MiB held at most, a block more before the channels notice, a block being received
    // on each of the 8 channels (32 MiB), and the process itself.
    assert!(peak_kib >> 10 <= 160, "{} MiB", peak_kib >> 10);
}
