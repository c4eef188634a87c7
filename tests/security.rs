//! Authentication, confinement to the server root, and hostile input: a bad connection must
//! be refused without harming the server or other sessions.

mod common;

use std::fs;
use std::time::Duration;

use common::*;
use hsxfer::session::wire::{control_pair, ControlReader, ControlWriter, Side};
use hsxfer::transport::tls::{ReadPart, Stream, WritePart};
use hsxfer::{Auth, Error, FaultInjection, Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn token(t: &str) -> Auth {
    Auth::Token(t.as_bytes().to_vec())
}

async fn push_ok(addr: std::net::SocketAddr, auth: Auth, src: &std::path::Path, dest: &str) {
    let r = client_with(addr, 2, auth, FaultInjection::default())
        .push(&[src.to_path_buf()], false, dest, &live(2))
        .await
        .expect("a well-behaved client still gets through");
    assert!(r.verified);
}

#[tokio::test]
async fn wrong_or_missing_token_is_refused_and_the_server_keeps_serving() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    random_file(&src.path().join("f"), 100_000, 9);
    let addr = server(root.path(), token("s3cret"), FaultInjection::default()).await;
    for bad in [token("wrong"), Auth::NoAuth] {
        let e = client_with(addr, 2, bad, FaultInjection::default())
            .push(&[src.path().join("f")], false, "f", &live(2))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::AuthRefused(_)), "{e}");
        assert!(
            e.to_string().contains("`token_file`"),
            "the error says what to do: {e}"
        );
    }
    assert!(!root.path().join("f").exists());
    push_ok(addr, token("s3cret\n"), &src.path().join("f"), "f").await;
}

#[tokio::test]
async fn no_auth_is_refused_off_loopback() {
    let root = tempfile::tempdir().unwrap();
    let e = Server::bind(ServerConfig {
        listen: "0.0.0.0:0".parse().unwrap(),
        ..config(root.path(), Auth::NoAuth, FaultInjection::default(), false)
    })
    .await
    .err()
    .expect("refused");
    assert!(e.to_string().contains("loopback"), "{e}");
}

#[tokio::test]
async fn paths_cannot_leave_the_root() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"top secret").unwrap();
    fs::create_dir(root.path().join("inside")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret"),
        root.path().join("secret-link"),
    )
    .unwrap();
    random_file(&src.path().join("f"), 1000, 1);
    let addr = server(root.path(), Auth::NoAuth, FaultInjection::default()).await;
    let out = src.path().join("out");
    let abs = outside.path().join("secret").display().to_string();
    for remote in [
        "../secret",
        abs.as_str(),
        "escape/secret",
        "secret-link",
        "inside/../../x",
    ] {
        let e = client(addr, 1)
            .pull(
                &[remote.to_string()],
                false,
                out.to_str().unwrap(),
                &live(1),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Refused(_)), "pull {remote}: {e}");
        assert!(!out.exists());
    }
    for dest in ["../f", "/tmp/f", "escape/f", "escape"] {
        let e = client(addr, 1)
            .push(&[src.path().join("f")], false, dest, &live(1))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Refused(_)), "push {dest}: {e}");
    }
    assert_eq!(
        fs::read_dir(outside.path()).unwrap().count(),
        1,
        "nothing written outside"
    );
    push_ok(addr, Auth::NoAuth, &src.path().join("f"), "inside").await;
    assert!(root.path().join("inside/f").exists());
}

/// Opens a TLS connection and reads the server's 36-byte hello.
async fn raw(addr: std::net::SocketAddr) -> Stream {
    let mut s = open(addr).await;
    let mut hello = [0u8; 36];
    s.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello[..4], b"HXS4");
    s
}

/// A connection closed before its first byte (a client whose early data-channel connect
/// outlived a refused request, or a port check) ends the server's handshake without an
/// error, whether it closes (FIN) or resets (RST); one that sends part of the clear-text
/// preface, or of a TLS ClientHello, and closes is an error: the peer vanished mid-handshake.
#[tokio::test]
async fn a_connection_closed_before_its_hello_is_no_handshake() {
    use hsxfer::session::handshake;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let tls = server_tls(true);
    for case in ["fin", "rst", "part", "tls-part"] {
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            match case {
                "rst" => socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap(),
                "part" => s.write_all(b"HX").await.unwrap(),
                "tls-part" => s.write_all(&[0x16, 3, 1, 0, 200, 1]).await.unwrap(),
                _ => {}
            }
        });
        let (s, _) = l.accept().await.unwrap();
        let tls = tls.clone();
        let server =
            tokio::spawn(async move { handshake::server_open(s, &tls).await.map(|o| o.is_some()) });
        client.await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(20), server)
            .await
            .expect("the handshake ends")
            .unwrap();
        match case {
            "part" | "tls-part" => {
                assert!(matches!(r, Err(Error::PeerVanished)), "{case}: {r:?}")
            }
            _ => assert!(matches!(r, Ok(false)), "{case}: {r:?}"),
        }
    }
}

/// A TLS connection that ends before its hello's first byte (a data channel dialed while its
/// control connection authenticated, unused because the session did not open), with TLS's
/// close_notify or dropped without it, ends the server's handshake without an error; one that
/// sends part of a hello and closes is an error.
#[tokio::test]
async fn a_tls_connection_closed_before_its_hello_is_no_handshake() {
    use hsxfer::session::handshake;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let tls = server_tls(false);
    for case in ["close", "drop", "part"] {
        let client = tokio::spawn(async move {
            let mut s = open(addr).await;
            match case {
                "close" => s.shutdown().await.unwrap(),
                "part" => {
                    s.write_all(b"HXS").await.unwrap();
                    s.shutdown().await.unwrap();
                }
                _ => drop(s),
            }
        });
        let (tcp, _) = l.accept().await.unwrap();
        let (mut s, m) = handshake::server_open(tcp, &tls)
            .await
            .unwrap()
            .expect("a TLS connection");
        client.await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(20), handshake::server_accept(&mut s, m))
            .await
            .expect("the handshake ends")
            .map(|m| m.is_some());
        match case {
            "part" => assert!(matches!(r, Err(Error::PeerVanished)), "{case}: {r:?}"),
            _ => assert!(matches!(r, Ok(false)), "{case}: {r:?}"),
        }
    }
}

/// True when the server closes the connection (after an optional refusal tag).
async fn closed(mut s: Stream) -> bool {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        let mut total = 0;
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    });
    read.await.is_ok()
}

#[tokio::test]
async fn garbage_forged_joins_and_malformed_control_are_rejected() {
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    random_file(&src.path().join("f"), 5 << 20, 2);
    let addr = server(root.path(), Auth::NoAuth, FaultInjection::default()).await;

    // Not our protocol at all, in clear text and inside TLS.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert!(closed(Stream::clear(s)).await);
    let mut s = raw(addr).await;
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    s.flush().await.unwrap();
    assert!(closed(s).await);

    // A join for a session that does not exist, with a made-up MAC.
    let mut s = raw(addr).await;
    let mut join = b"HXCJ".to_vec();
    join.extend([7u8; 50]);
    s.write_all(&join).await.unwrap();
    s.flush().await.unwrap();
    let mut answer = [0u8; 4];
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HXNO");

    // An authenticated control connection that then sends a malformed message under a tag
    // that is not its MAC.
    let mut s = open(addr).await;
    let key = hsxfer::channels::auth::TokenKey::from_token(b"");
    hsxfer::session::handshake::client_control(&mut s, &key, "test")
        .await
        .unwrap();
    let mut frame = vec![5, 0, 0, 0, b'{', b'x', b'}', b'!', b'!'];
    frame.extend([0u8; hsxfer::channels::control::TAG_LEN]);
    s.write_all(&frame).await.unwrap();
    s.flush().await.unwrap();
    assert!(closed(s).await);

    // An oversized control frame is refused without allocating it.
    let mut s = open(addr).await;
    hsxfer::session::handshake::client_control(&mut s, &key, "test")
        .await
        .unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
    s.flush().await.unwrap();
    assert!(closed(s).await);

    // Meanwhile the server still serves real clients.
    push_ok(addr, Auth::NoAuth, &src.path().join("f"), "f").await;
}

#[tokio::test]
async fn a_data_channel_sending_garbage_ends_only_its_session() {
    use hsxfer::channels::auth::TokenKey;
    use hsxfer::channels::control::Message;
    use hsxfer::session::handshake;
    let (root, src, addr) = server_and_a_file().await;
    let key = TokenKey::from_token(b"");
    let mut ctrl = open(addr).await;
    let (session, skey) = handshake::client_control(&mut ctrl, &key, "t")
        .await
        .unwrap();
    let (mut r, mut w) = control_pair(ctrl, &skey, Side::Client);
    w.send(&push_of_one_file("evil")).await.unwrap();
    let mut data = open(addr).await;
    handshake::client_join(&mut data, &skey, session, 0, "t")
        .await
        .unwrap();
    // A replayed join for the same channel is refused: the channel is taken.
    let mut again = open(addr).await;
    assert!(handshake::client_join(&mut again, &skey, session, 0, "t")
        .await
        .is_err());
    // Announce one file, then send a frame header that is garbage.
    let m = Message::Manifest {
        entries: vec![hsxfer::channels::manifest::Entry {
            id: 0,
            path: "x".into(),
            mode: 0o644,
            mtime_ns: 0,
            kind: hsxfer::channels::manifest::EntryKind::File { size: 10 },
        }],
        last: true,
    };
    w.send(&m).await.unwrap();
    data.write_all(&[0xAB; 24]).await.unwrap();
    data.flush().await.unwrap();
    let ended = async { while let Ok(Some(_)) = r.recv().await {} };
    assert!(
        tokio::time::timeout(Duration::from_secs(15), ended)
            .await
            .is_ok(),
        "the session is aborted"
    );
    assert!(
        !root.path().join("evil").exists(),
        "no partial file under the final name"
    );
    push_ok(addr, Auth::NoAuth, &src.path().join("f"), "fine").await;
}

/// Data channels may join as soon as their session has authenticated, before its request
/// (clients dial them beside the control connection), but only into the slots the request
/// then names: one that joined as channel 3 of a session that asks for 1 ends it, and no
/// file is made.
#[tokio::test]
async fn a_channel_that_joined_before_the_request_beyond_its_count_ends_the_session() {
    use hsxfer::channels::auth::TokenKey;
    use hsxfer::session::handshake;
    let (root, src, addr) = server_and_a_file().await;
    let key = TokenKey::from_token(b"");
    let mut ctrl = open(addr).await;
    // Opened first, so that the joins leave the moment the session is welcomed, as a
    // client's do.
    let mut early = [open(addr).await, open(addr).await];
    let (session, skey) = handshake::client_control(&mut ctrl, &key, "t")
        .await
        .unwrap();
    for (data, channel) in early.iter_mut().zip([0, 3]) {
        handshake::client_join(data, &skey, session, channel, "t")
            .await
            .expect("a join before the request is admitted");
    }
    let (mut r, mut w) = control_pair(ctrl, &skey, Side::Client);
    w.send(&push_of_one_file("early")).await.unwrap();
    let mut said = Vec::new();
    let heard = async {
        while let Ok(Some(m)) = r.recv().await {
            said.push(format!("{m:?}"));
        }
    };
    tokio::time::timeout(Duration::from_secs(15), heard)
        .await
        .expect("the session ends");
    assert!(
        said.iter()
            .any(|m| m.contains("data channel 3 joined a session of 1 channels")),
        "the server says why: {said:?}"
    );
    assert!(!root.path().join("early").exists());
    push_ok(addr, Auth::NoAuth, &src.path().join("f"), "fine").await;
}

/// A server without authentication on an empty root, and a source directory holding `f`
/// (1 MiB), for the tests that speak the protocol by hand; returns (root, source, address).
async fn server_and_a_file() -> (tempfile::TempDir, tempfile::TempDir, std::net::SocketAddr) {
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    random_file(&src.path().join("f"), 1 << 20, 4);
    let addr = server(root.path(), Auth::NoAuth, FaultInjection::default()).await;
    (root, src, addr)
}

/// The request of a push of one file into `dest` over one channel.
fn push_of_one_file(dest: &str) -> hsxfer::channels::control::Message {
    use hsxfer::channels::control::{Message, Operation, Request, Tuning, PROTOCOL_VERSION};
    Message::Request(Request {
        version: PROTOCOL_VERSION,
        op: Operation::Push {
            dest: dest.into(),
            sources: 1,
        },
        channels: 1,
        block_size: 1 << 20,
        tuning: Tuning::kernel_defaults(1),
    })
}

/// A session's control connection, authenticated, with its id and key.
struct Opened {
    r: ControlReader<ReadPart>,
    w: ControlWriter<WritePart>,
    session: hsxfer::channels::auth::SessionId,
    key: hsxfer::channels::auth::SessionKey,
}

/// Opens a session with `request`; returns it and the server's first answer.
async fn ask(
    addr: std::net::SocketAddr,
    request: hsxfer::channels::control::Request,
) -> (Opened, hsxfer::channels::control::Message) {
    use hsxfer::channels::control::Message;
    let token = hsxfer::channels::auth::TokenKey::from_token(b"");
    let mut ctrl = open(addr).await;
    let (session, key) = hsxfer::session::handshake::client_control(&mut ctrl, &token, "t")
        .await
        .unwrap();
    let (mut r, mut w) = control_pair(ctrl, &key, Side::Client);
    w.send(&Message::Request(request)).await.unwrap();
    let answer = answer(&mut r).await;
    (Opened { r, w, session, key }, answer)
}

/// The next control message from the peer.
async fn answer<R: tokio::io::AsyncRead + Unpin>(
    r: &mut ControlReader<R>,
) -> hsxfer::channels::control::Message {
    tokio::time::timeout(Duration::from_secs(15), r.expect())
        .await
        .expect("the peer answers")
        .unwrap()
}

fn bench_request(
    direction: hsxfer::channels::control::BenchDirection,
    seconds: f64,
) -> hsxfer::channels::control::Request {
    use hsxfer::channels::control::{Operation, Request, Tuning, PROTOCOL_VERSION};
    Request {
        version: PROTOCOL_VERSION,
        op: Operation::Bench {
            direction,
            bytes: None,
            seconds: Some(seconds),
        },
        channels: 1,
        block_size: 4 << 20,
        tuning: Tuning::kernel_defaults(1),
    }
}

/// A bench upload of `seconds` and a push into `dest` with the same settings.
fn upload_and_push(dest: &str, seconds: f64) -> [hsxfer::channels::control::Request; 2] {
    use hsxfer::channels::control::{BenchDirection, Operation, Request};
    let upload = bench_request(BenchDirection::Upload, seconds);
    let push = Request {
        op: Operation::Push {
            dest: dest.into(),
            sources: 1,
        },
        ..upload.clone()
    };
    [upload, push]
}

/// Opens a session with `request`, which the server must accept, and joins its one data
/// channel; returns the session and the channel, which must stay open while it runs.
async fn accepted(
    addr: std::net::SocketAddr,
    request: hsxfer::channels::control::Request,
) -> (Opened, Stream) {
    use hsxfer::channels::control::Message;
    let (s, answer) = ask(addr, request).await;
    assert!(matches!(answer, Message::Accepted { .. }), "{answer:?}");
    let mut data = open(addr).await;
    hsxfer::session::handshake::client_join(&mut data, &s.key, s.session, 0, "t")
        .await
        .unwrap();
    (s, data)
}

/// Values a client sends that would panic a task in a timer or a duration conversion, and a
/// manifest entry of 2^63 bytes whose block table would abort the process, are refused or
/// cost nothing; the server goes on serving.
#[tokio::test]
async fn hostile_values_in_a_request_or_manifest_end_only_their_session() {
    use hsxfer::channels::control::{BenchDirection, Message, Operation, PROTOCOL_VERSION};
    use hsxfer::channels::manifest::{Entry, EntryKind};
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    random_file(&src.path().join("f"), 1 << 20, 4);
    let addr = server(root.path(), Auth::NoAuth, FaultInjection::default()).await;
    let download = || bench_request(BenchDirection::Download, 1.0);
    let older = format!("protocol version {}", PROTOCOL_VERSION - 1);
    let mut cases = vec![
        ("interval 0 ms", download()),
        ("1e300 s", bench_request(BenchDirection::Download, 1e300)),
        ("offset of 18446744073709551615", download()),
        ("RTT of 18446744073709551615", download()),
        (older.as_str(), download()),
    ];
    cases[0].1.tuning.interval_ms = 0;
    cases[2].1.tuning.stagger_us = vec![u64::MAX];
    cases[3].1.tuning.rtt_us = u64::MAX;
    cases[4].1.version = PROTOCOL_VERSION - 1;
    for (needle, request) in cases {
        match ask(addr, request).await.1 {
            Message::Abort { message, .. } => assert!(message.contains(needle), "{message}"),
            other => panic!("{needle}: {other:?}"),
        }
    }

    // A file of 2^63 bytes announced into a bench upload (discarded: nothing on disk refuses
    // it, but it has more blocks than a file may have) and into a push (the file system
    // refuses it first).
    for request in upload_and_push("huge", 1.0) {
        let pushing = matches!(request.op, Operation::Push { .. });
        let (mut s, _data) = accepted(addr, request).await;
        let manifest = Message::Manifest {
            entries: vec![Entry {
                id: 0,
                path: "huge".into(),
                mode: 0o644,
                mtime_ns: 0,
                kind: EntryKind::File { size: 1 << 63 },
            }],
            last: true,
        };
        s.w.send(&manifest).await.unwrap();
        match answer(&mut s.r).await {
            Message::Abort { message, .. } if !pushing => {
                assert!(message.contains("more than 4194304 blocks"), "{message}")
            }
            Message::Abort { message, .. } if pushing => {
                assert!(message.contains("creating huge"), "{message}");
                let root = root.path().to_str().unwrap();
                assert!(
                    !message.contains(root),
                    "the server's root stays hidden: {message}"
                );
            }
            other => panic!("push {pushing}: {other:?}"),
        }
    }
    assert!(!root.path().join("huge").exists());

    // More files in one piece of the manifest than a receiver's budget takes at once, or more
    // announced and not done than a receiver holds open: refused before any is opened.
    for (pieces, message) in [
        (vec![300], "more than 256"),
        (vec![256, 256, 256, 256, 1], "more than 1024 files"),
    ] {
        let [_, push] = upload_and_push("many", 1.0);
        let (mut s, _data) = accepted(addr, push).await;
        let mut next = 1;
        for (i, &count) in pieces.iter().enumerate() {
            let dir = Entry {
                id: 0,
                path: "many".into(),
                mode: 0o755,
                mtime_ns: 0,
                kind: EntryKind::Dir,
            };
            let files = (next..next + count).map(|id| Entry {
                id,
                path: format!("many/{id}"),
                mode: 0o644,
                mtime_ns: 0,
                kind: EntryKind::File { size: 1 },
            });
            let entries = (i == 0).then_some(dir).into_iter().chain(files).collect();
            next += count;
            let last = i + 1 == pieces.len();
            s.w.send(&Message::Manifest { entries, last })
                .await
                .unwrap();
        }
        loop {
            match answer(&mut s.r).await {
                Message::Plan { .. } => {}
                Message::Abort { message: m, .. } => {
                    assert!(m.contains(message), "{pieces:?}: {m}");
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        if pieces.len() == 1 {
            assert!(
                !root.path().join("many").exists(),
                "a refused piece opens nothing"
            );
        }
    }
    push_ok(addr, Auth::NoAuth, &src.path().join("f"), "fine").await;
}

/// A sender may end a timed bench at its time (`Message::TimeUp`), abandoning what it
/// announced; a push it cannot: the receiver refuses, and the file it had announced is not
/// committed.
#[tokio::test]
async fn only_a_bench_may_end_before_its_files_are_done() {
    use hsxfer::channels::control::{Message, Operation};
    use hsxfer::channels::manifest::{Entry, EntryKind};
    let root = tempfile::tempdir().unwrap();
    let addr = server(root.path(), Auth::NoAuth, FaultInjection::default()).await;
    for request in upload_and_push("cut", 60.0) {
        let pushing = matches!(request.op, Operation::Push { .. });
        let (mut s, _data) = accepted(addr, request).await;
        let file = Entry {
            id: 0,
            path: "cut".into(),
            mode: 0o644,
            mtime_ns: 0,
            kind: EntryKind::File { size: 1 << 20 },
        };
        s.w.send(&Message::Manifest {
            entries: vec![file],
            last: true,
        })
        .await
        .unwrap();
        assert!(matches!(answer(&mut s.r).await, Message::Plan { .. }));
        s.w.send(&Message::TimeUp).await.unwrap();
        match answer(&mut s.r).await {
            Message::Halted { received } if !pushing => assert_eq!(received, vec![0]),
            Message::Abort { message, .. } if pushing => {
                assert!(message.contains("TimeUp"), "{message}")
            }
            other => panic!("push {pushing}: {other:?}"),
        }
    }
    assert!(!root.path().join("cut").exists());
}

/// A server that answers any pull with a manifest of `entries` (a compromised or hostile
/// server); returns its address.
async fn hostile_server(entries: Vec<hsxfer::channels::manifest::Entry>) -> std::net::SocketAddr {
    hostile_server_doing(entries, Trick::Nothing).await
}

/// What a [`hostile_server_doing`] does after its manifest.
enum Trick {
    Nothing,
    /// Sends a 4-byte block at offset 0 of this file on its first data channel.
    StrayBlock(u32),
    /// Sends this control message.
    Tell(Box<hsxfer::channels::control::Message>),
}

/// [`hostile_server`], which plays `trick` after the manifest.
async fn hostile_server_doing(
    entries: Vec<hsxfer::channels::manifest::Entry>,
    trick: Trick,
) -> std::net::SocketAddr {
    use hsxfer::channels::auth::TokenKey;
    use hsxfer::channels::control::Message;
    use hsxfer::session::handshake;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let tls = server_tls(false);
    tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        let (mut ctrl, m) = handshake::server_open(tcp, &tls).await.unwrap().unwrap();
        let mut m = handshake::server_accept(&mut ctrl, m)
            .await
            .unwrap()
            .expect("a hello");
        let key = m
            .accept_control(&TokenKey::from_token(b""), [1; 16])
            .unwrap();
        m.welcome();
        handshake::answer(&mut ctrl, &mut m).await.unwrap();
        let (mut r, mut w) = control_pair(ctrl, &key, Side::Server);
        let channels = loop {
            match answer(&mut r).await {
                Message::Ping { seq } => w.send(&Message::Pong { seq }).await.unwrap(),
                Message::Request(r) => break r.channels,
                other => panic!("{other:?}"),
            }
        };
        let accepted = Message::Accepted {
            channels,
            notes: vec![],
        };
        w.send(&accepted).await.unwrap();
        let mut joined = Vec::new();
        for _ in 0..channels {
            let (tcp, _) = l.accept().await.unwrap();
            let (mut d, m) = handshake::server_open(tcp, &tls).await.unwrap().unwrap();
            let mut m = handshake::server_accept(&mut d, m)
                .await
                .unwrap()
                .expect("a hello");
            assert!(m.admit_join(Some(&key), true));
            handshake::answer(&mut d, &mut m).await.unwrap();
            joined.push(d);
        }
        let manifest = Message::Manifest {
            entries,
            last: true,
        };
        w.send(&manifest).await.unwrap();
        if let Trick::Tell(m) = &trick {
            w.send(m).await.unwrap();
        }
        if let Trick::StrayBlock(file) = trick {
            use hsxfer::channels::frame::{BlockHeader, DigestKey};
            use hsxfer::session::wire::{write_block, Damage, Digesting};
            let header = BlockHeader {
                file,
                offset: 0,
                len: 4,
            };
            let key = DigestKey::default();
            let sent = write_block(
                &mut joined[0],
                &header,
                b"abcd",
                Digesting::Hash(&key),
                Damage::None,
            );
            sent.await.unwrap();
        }
        while let Ok(Some(_)) = r.recv().await {}
    });
    addr
}

/// A pull of one 4-byte file `data` from a [`hostile_server_doing`] `trick`: the error it
/// ends with, within 20 s.
async fn pull_one_file_from(trick: Trick) -> Error {
    use hsxfer::channels::manifest::{Entry, EntryKind};
    let home = tempfile::tempdir().unwrap();
    let dest = home.path().join("dest");
    let entries = vec![Entry {
        id: 0,
        path: "data".into(),
        mode: 0o600,
        mtime_ns: 0,
        kind: EntryKind::File { size: 4 },
    }];
    let addr = hostile_server_doing(entries, trick).await;
    let (c, sources, counters) = (client(addr, 1), ["data".to_string()], live(1));
    let pull = c.pull(&sources, false, dest.to_str().unwrap(), &counters);
    tokio::time::timeout(Duration::from_secs(20), pull)
        .await
        .expect("refused, not left waiting")
        .expect_err("the server's trick is refused")
}

/// A pull into an empty destination lets the server send its first files' blocks before
/// their plans; once the manifest is over, a block for a file it never announced ends the
/// session instead of parking its data channel for good.
#[tokio::test]
async fn a_block_for_a_file_never_announced_ends_a_pull() {
    let e = pull_one_file_from(Trick::StrayBlock(9)).await;
    assert!(e.to_string().contains("block for unknown file 9"), "{e}");
}

/// A stop (SIGTERM) reaches a session whose request was accepted and whose data channels
/// have yet to join: its client is told that the server is stopping and to run again, not
/// left to find its connection closed once the server exits (the stop waits 3 s).
#[tokio::test]
async fn a_stop_reaches_a_session_waiting_for_its_channels() {
    use hsxfer::channels::control::{BenchDirection, Message};
    let root = tempfile::tempdir().unwrap();
    let server = Server::bind(config(
        root.path(),
        Auth::NoAuth,
        FaultInjection::default(),
        false,
    ))
    .await
    .unwrap();
    let (addr, stopper) = (server.local_addr(), server.stopper());
    tokio::spawn(server.run());
    let (mut o, accepted) = ask(addr, bench_request(BenchDirection::Upload, 5.0)).await;
    assert!(matches!(accepted, Message::Accepted { .. }), "{accepted:?}");
    let (said, ()) = tokio::join!(answer(&mut o.r), stopper.stop("a test"));
    match said {
        Message::Abort { message, transient } => {
            assert!(message.contains("stopping (a test)"), "{message}");
            assert!(transient, "a client may run the copy again");
        }
        other => panic!("{other:?}"),
    }
}

/// A token holder that asks to pull a file, takes its manifest and then says nothing (no
/// plan) held the serving session, and the slot it took, for good. The session ends after
/// the server's idle time, telling the client why, and the slot serves another copy.
#[tokio::test]
async fn a_pull_whose_client_goes_silent_ends_after_the_idle_time() {
    use hsxfer::channels::control::{BenchDirection, Message, Operation, Request};
    let root = tempfile::tempdir().unwrap();
    random_file(&root.path().join("f"), 1 << 20, 5);
    let limits = hsxfer::ServerLimits {
        sessions_per_address: 1,
        idle: Duration::from_secs(2),
        ..hsxfer::ServerLimits::default()
    };
    let addr = server_with(root.path(), Auth::NoAuth, FaultInjection::default(), limits).await;
    let pull = Request {
        op: Operation::Pull {
            sources: vec!["f".into()],
            recursive: false,
            unplanned_files: 0,
        },
        ..bench_request(BenchDirection::Download, 1.0)
    };
    let (mut silent, _data) = accepted(addr, pull).await;
    let started = std::time::Instant::now();
    let why = loop {
        match answer(&mut silent.r).await {
            Message::Abort { message, .. } => break message,
            Message::Manifest { .. } | Message::Telemetry(_) => {}
            other => panic!("{other:?}"),
        }
    };
    assert!(
        why.contains("took no block bytes for the idle time"),
        "{why}"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    let home = tempfile::tempdir().unwrap();
    let dest = home.path().join("f");
    let r = client(addr, 1)
        .pull(&["f".into()], false, dest.to_str().unwrap(), &live(1))
        .await
        .expect("the slot is free again");
    assert!(r.verified);
    assert_eq!(sha256(&dest), sha256(&root.path().join("f")));
}

/// A server that tells its pulling client to open 1,000 data channels from 60,000 (which
/// the client once dialed, each a connection and a TLS handshake) ends the pull instead.
#[tokio::test]
async fn a_server_may_not_make_its_client_open_channels_out_of_turn() {
    use hsxfer::channels::control::Message;
    for (first, count) in [(60_000, 1000), (1, u16::MAX), (1, 200)] {
        let tell = Trick::Tell(Box::new(Message::OpenChannels { first, count }));
        let e = pull_one_file_from(tell).await;
        let said = format!("open {count} data channels from {first}");
        assert!(e.to_string().contains(&said), "{e}");
    }
}

/// A server whose telemetry names a congestion control of terminal escapes (which the
/// summary printed as they were: it could rewrite what the terminal showed) or a channel
/// past the protocol's (the client kept a row for each index up to it) ends the pull.
#[tokio::test]
async fn a_servers_telemetry_may_not_rewrite_the_terminal_or_name_absurd_channels() {
    use hsxfer::channels::control::Message;
    use hsxfer::channels::telemetry::{ChannelSetup, TelemetryBatch};
    let setup = |index, cc: &str| ChannelSetup {
        index,
        cc: cc.into(),
        ..ChannelSetup::default()
    };
    for (s, needle) in [
        (setup(0, "\x1b[2K\rok"), "not a valid name"),
        (setup(65_535, "cubic"), "row 65535"),
    ] {
        let batch = TelemetryBatch {
            setups: vec![s],
            ..TelemetryBatch::default()
        };
        let e = pull_one_file_from(Trick::Tell(Box::new(Message::Telemetry(batch)))).await;
        assert!(e.to_string().contains(needle), "{e}");
    }
}

/// A pulling client writes only what it asked for, only inside its destination: a server
/// that answers a pull of `data` with `../escape` or `.ssh/authorized_keys` is refused and
/// nothing lands outside `data`.
#[tokio::test]
async fn a_pulling_client_refuses_names_it_did_not_ask_for() {
    use hsxfer::channels::manifest::{Entry, EntryKind};
    let home = tempfile::tempdir().unwrap();
    let dest = home.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let entry = |id, path: &str, kind| Entry {
        id,
        path: path.into(),
        mode: 0o600,
        mtime_ns: 0,
        kind,
    };
    let file = EntryKind::File { size: 4 };
    for (entries, needle) in [
        (vec![entry(0, "../escape", file)], "'..' may not leave"),
        (
            vec![
                entry(0, ".ssh", EntryKind::Dir),
                entry(1, ".ssh/authorized_keys", file),
            ],
            "sent '.ssh', which is not under what was asked for",
        ),
        (
            vec![entry(0, "data/../../escape", file)],
            "'..' may not leave",
        ),
    ] {
        let addr = hostile_server(entries).await;
        let (c, sources, counters) = (client(addr, 1), ["data".to_string()], live(1));
        let pull = c.pull(&sources, true, dest.to_str().unwrap(), &counters);
        // A client that accepts the entries waits for their data, which never comes.
        let e = tokio::time::timeout(Duration::from_secs(20), pull)
            .await
            .expect("refused at once, not left waiting for data")
            .expect_err(needle);
        assert!(e.to_string().contains(needle), "{e}");
    }
    let left: Vec<_> = fs::read_dir(home.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["dest"], "nothing written beside the destination");
    assert_eq!(fs::read_dir(&dest).unwrap().count(), 0, "nor inside it");
}

/// Two pushes to one destination at once: the file ends up as one of the two sources,
/// never a mix, and a push that was refused says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pushes_to_one_destination_never_mix_their_bytes() {
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let (a, b) = (src.path().join("a"), src.path().join("b"));
    random_file(&a, 64 << 20, 1);
    random_file(&b, 64 << 20, 2);
    let addr = server(root.path(), Auth::NoAuth, FaultInjection::default()).await;
    let (ca, cb) = (client(addr, 4), client(addr, 4));
    let (la, lb) = (live(4), live(4));
    let (pa, pb) = (
        ca.push(std::slice::from_ref(&a), false, "same", &la),
        cb.push(std::slice::from_ref(&b), false, "same", &lb),
    );
    let (ra, rb) = tokio::join!(pa, pb);
    let got = sha256(&root.path().join("same"));
    let winners: Vec<_> = [(&ra, &a), (&rb, &b)]
        .into_iter()
        .filter(|(r, _)| r.is_ok())
        .map(|(_, s)| sha256(s))
        .collect();
    assert!(!winners.is_empty(), "{ra:?} {rb:?}");
    eprintln!("pushes that got through: {} of 2", winners.len());
    assert!(
        winners.contains(&got),
        "the file is one of the sources pushed"
    );
    for r in [&ra, &rb] {
        if let Err(e) = r {
            let e = e.to_string();
            assert!(e.contains("being received by another transfer"), "{e}");
            assert!(!e.contains(root.path().to_str().unwrap()), "{e}");
        }
    }
}

/// An on-path attacker: relays every connection to `server`, lets the handshakes through,
/// and on control connections replaces `from` with `to` in each message of the client,
/// keeping the frame's MAC (it cannot compute one) and fixing the length prefix.
async fn rewriting_relay(
    server: std::net::SocketAddr,
    from: &'static str,
    to: &'static str,
) -> std::net::SocketAddr {
    use hsxfer::channels::auth::CONTROL_BODY_LEN;
    use hsxfer::channels::control::TAG_LEN;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            tokio::spawn(async move {
                let srv = TcpStream::connect(server).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = srv.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    let _ = cw.shutdown().await;
                });
                let mut tag = [0u8; 4];
                // The clear-text preface, then the hello's tag.
                for _ in 0..2 {
                    if cr.read_exact(&mut tag).await.is_err() || sw.write_all(&tag).await.is_err() {
                        return;
                    }
                }
                if &tag != b"HXCC" {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    return;
                }
                let mut hello = [0u8; CONTROL_BODY_LEN];
                cr.read_exact(&mut hello).await.unwrap();
                sw.write_all(&hello).await.unwrap();
                loop {
                    let mut len = [0u8; 4];
                    if cr.read_exact(&mut len).await.is_err() {
                        break;
                    }
                    let n = u32::from_le_bytes(len) as usize;
                    let mut frame = vec![0u8; n + TAG_LEN];
                    if cr.read_exact(&mut frame).await.is_err() {
                        break;
                    }
                    let body = String::from_utf8_lossy(&frame[..n]).replace(from, to);
                    let mut out = (body.len() as u32).to_le_bytes().to_vec();
                    out.extend_from_slice(body.as_bytes());
                    out.extend_from_slice(&frame[n..]);
                    if sw.write_all(&out).await.is_err() {
                        break;
                    }
                }
                let _ = sw.shutdown().await;
            });
        }
    });
    addr
}

/// In clear text (`--no-encrypt` on both ends), a relay that turns a push into `mine` into a
/// push into `evil` is caught by the MACs on control frames: the server refuses the altered
/// request, says why, and writes nothing. The same relay that changes nothing is harmless.
#[tokio::test]
async fn a_relay_that_rewrites_control_messages_is_caught() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    random_file(&src.path().join("f"), 100_000, 3);
    let secret = token("0123456789abcdef0123456789abcdef");
    let addr = serve(config(
        root.path(),
        secret.clone(),
        FaultInjection::default(),
        true,
    ))
    .await;
    let relay = rewriting_relay(addr, "\"dest\":\"mine\"", "\"dest\":\"evil\"").await;
    let clear = |auth: Auth| {
        hsxfer::Client::new(
            "127.0.0.1",
            hsxfer::TransferOptions {
                channels: 2,
                port: relay.port(),
                auth,
                security: hsxfer::session::secure::Security::Clear,
                ..Default::default()
            },
        )
    };
    let e = clear(secret.clone())
        .push(&[src.path().join("f")], false, "mine", &live(2))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("failed its authentication check"),
        "{e}"
    );
    assert!(!root.path().join("evil").exists());
    assert!(!root.path().join("mine").exists());
    let r = clear(secret)
        .push(&[src.path().join("f")], false, "other", &live(2))
        .await
        .expect("an honest relay is harmless");
    assert!(r.verified && !r.encrypted);
    assert!(root.path().join("other").exists());
}

/// A server writes only files and directories under its root: a push onto a FIFO or, when
/// run as root (as CI does), a block device there is refused, and the node stays.
#[tokio::test]
async fn a_push_onto_a_device_or_fifo_under_the_root_is_refused() {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    use std::os::unix::fs::FileTypeExt;
    let (root, src, addr) = server_and_a_file().await;
    let mut nodes = vec![("fifo", SFlag::S_IFIFO)];
    if nix::unistd::geteuid().is_root() {
        nodes.push(("blk", SFlag::S_IFBLK));
    } else {
        eprintln!("SKIPPED a push onto a block device: making one needs root (CI runs as root)");
    }
    for (name, kind) in nodes {
        let node = root.path().join(name);
        mknod(
            &node,
            kind,
            Mode::from_bits_truncate(0o600),
            makedev(7, 200),
        )
        .unwrap();
        let e = client(addr, 2)
            .push(&[src.path().join("f")], false, name, &live(2))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "'{name}' is a device or FIFO: a server writes only files and directories"
            )),
            "{e}"
        );
        let t = fs::symlink_metadata(&node).unwrap().file_type();
        assert!(t.is_fifo() || t.is_block_device(), "{name}: {t:?}");
    }
}

/// A destination that ends in `/` names a directory, as `cp` takes it: a file of that name
/// is refused, not replaced, on the server and by a pulling client.
#[tokio::test]
async fn a_destination_ending_in_a_slash_never_replaces_a_file() {
    let (root, src, addr) = server_and_a_file().await;
    fs::write(root.path().join("notes.txt"), b"keep").unwrap();
    let e = client(addr, 2)
        .push(&[src.path().join("f")], false, "notes.txt/", &live(2))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("target 'notes.txt/' is not a directory"), "{e}");
    assert_eq!(fs::read(root.path().join("notes.txt")).unwrap(), b"keep");

    fs::copy(src.path().join("f"), root.path().join("f")).unwrap();
    let here = src.path().join("notes.txt");
    fs::write(&here, b"keep").unwrap();
    let dst = format!("{}/", here.display());
    let e = client(addr, 2)
        .pull(&["f".into()], false, &dst, &live(2))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("target '{dst}' is not a directory")),
        "{e}"
    );
    assert_eq!(fs::read(&here).unwrap(), b"keep");
}
