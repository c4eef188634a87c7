//! TLS on every connection: what the wire shows, how a client trusts a server's key (first
//! contact recorded, a changed key refused, a pinned key checked), and clear text only when
//! both ends allow it. Real `hsxfer` processes on loopback.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_hsxfer");

/// `hsxfer serve --no-auth` on `port` with its key in `key` and the given extra flags.
fn serve(root: &Path, port: u16, key: &Path, extra: &[&str]) -> ServerProc {
    isolate_profiles();
    let server = ServerProc::logged(
        Command::new(BIN)
            .args([
                "serve",
                "--no-auth",
                "--port",
                &port.to_string(),
                "--key-file",
            ])
            .arg(key)
            .arg("--root")
            .arg(root)
            .args(extra),
    );
    wait_listening(port);
    server
}

/// `hsxfer copy --no-auth --json` of `src` to the server on `port`, with extra flags.
fn copy(src: &Path, port: u16, dest: &str, extra: &[&str]) -> Output {
    isolate_profiles();
    Command::new(BIN)
        .args(["copy", "--no-auth", "--json", "--port", &port.to_string()])
        .args(extra)
        .arg(src)
        .arg(format!("127.0.0.1:{dest}"))
        .output()
        .unwrap()
}

fn summary(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().expect("a summary")).unwrap()
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The fingerprint of the key in `key` (made there if there is none yet).
fn fingerprint(key: &Path) -> String {
    let (id, _) = hsxfer::transport::tls::ServerIdentity::load_or_create(key).unwrap();
    id.fingerprint().to_string()
}

/// Captures loopback traffic to `port` while `run` runs; returns the capture's bytes.
fn captured(port: u16, run: impl FnOnce()) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("cap.pcap");
    let mut dump = Command::new("tcpdump")
        .args(["-i", "lo", "-U", "-s", "0", "-w"])
        .arg(&pcap)
        .args(["tcp", "port", &port.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (scripts/setup.sh installs it)");
    // tcpdump says "listening on lo" once it captures.
    let mut err = dump.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("listening on") {
        let n = std::io::Read::read(&mut err, &mut buf).unwrap();
        assert!(n > 0, "tcpdump ended: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    run();
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dump.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    dump.wait().unwrap();
    fs::read(&pcap).unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A file full of a marker string crosses loopback without the marker appearing in a packet
/// capture; the same copy with `--no-encrypt` on both ends shows it, so the capture sees
/// the copy's traffic.
#[test]
fn an_encrypted_copy_shows_none_of_its_data_on_the_wire() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "tcpdump needs root (CI runs as root)"
    );
    let (src, root, keys) = (tempdir(), tempdir(), tempdir());
    let marker = b"hsxfer-wire-marker-7f3a";
    let file = src.path().join("marked");
    fs::write(&file, marker.repeat(50_000)).unwrap();
    let port = free_port();
    let _server = serve(root.path(), port, &keys.path().join("k"), &["--no-encrypt"]);
    // Each test has its own known-servers file: a port that another test's server (with
    // another key) had before is not a changed key.
    let known = keys.path().join("known_servers");
    let known_arg = ["--known-servers", known.to_str().unwrap()];
    let mut encrypted = None;
    let wire = captured(port, || {
        encrypted = Some(copy(&file, port, "a", &known_arg))
    });
    let s = summary(&encrypted.unwrap());
    assert_eq!(s["encrypted"], true);
    assert_eq!(s["cipher_suite"], "TLS13_AES_128_GCM_SHA256");
    let size = fs::metadata(&file).unwrap().len() as usize;
    assert!(
        wire.len() > size / 2,
        "the copy was captured: {} bytes",
        wire.len()
    );
    assert!(!contains(&wire, marker), "the marker crossed in clear text");
    assert_eq!(sha256(&file), sha256(&root.path().join("a")));

    let mut clear = None;
    let wire = captured(port, || {
        clear = Some(copy(&file, port, "b", &["--no-encrypt"]))
    });
    let s = summary(&clear.unwrap());
    assert_eq!(s["encrypted"], false);
    assert!(s["cipher_suite"].is_null());
    assert!(
        contains(&wire, marker),
        "a clear-text copy shows the marker"
    );
}

/// The first copy to a server records its key; a server that comes back on that address
/// with another key is refused with the file and line to fix, until the line is removed. A
/// pinned fingerprint takes the place of the file: the right one works, a wrong one is
/// refused.
#[test]
fn a_server_key_is_recorded_then_a_changed_key_is_refused() {
    let (src, root, keys) = (tempdir(), tempdir(), tempdir());
    let file = src.path().join("f");
    random_file(&file, 100_000, 5);
    let known = keys.path().join("known_servers");
    let known_arg = ["--known-servers", known.to_str().unwrap()];
    let (key_a, key_b) = (keys.path().join("a"), keys.path().join("b"));
    let port = free_port();
    let server = serve(root.path(), port, &key_a, &[]);
    let s = summary(&copy(&file, port, "one", &known_arg));
    let notes = s["tuning"]["notes"].to_string();
    assert!(notes.contains("client: first contact with"), "{notes}");
    let line = format!("127.0.0.1:{port} {}\n", fingerprint(&key_a));
    assert_eq!(fs::read_to_string(&known).unwrap(), line);
    let s = summary(&copy(&file, port, "two", &known_arg));
    assert!(!s["tuning"]["notes"].to_string().contains("first contact"));
    drop(server);

    let _server = serve(root.path(), port, &key_b, &[]);
    let out = copy(&file, port, "three", &known_arg);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains(&fingerprint(&key_b))
            && e.contains(&format!("line 1 of {}", known.display()))
            && e.contains("delete that line"),
        "{e}"
    );
    assert!(!root.path().join("three").exists());

    let pin = |fp: String| copy(&file, port, "four", &["--server-fingerprint", &fp]);
    let wrong = pin(fingerprint(&key_a));
    assert!(!wrong.status.success());
    assert!(
        stderr(&wrong).contains("--server-fingerprint pins"),
        "{}",
        stderr(&wrong)
    );
    summary(&pin(fingerprint(&key_b)));
    assert_eq!(sha256(&file), sha256(&root.path().join("four")));

    fs::write(&known, "").unwrap();
    summary(&copy(&file, port, "five", &known_arg));
}

/// A server is recorded only once it has proved it holds the token: anyone who got to the
/// port first, without the token, was recorded, and the real server then refused as a
/// changed key.
#[test]
fn a_server_that_fails_the_token_handshake_is_not_recorded() {
    let (src, root, keys) = (tempdir(), tempdir(), tempdir());
    let file = src.path().join("f");
    random_file(&file, 1000, 6);
    let (token, other) = (keys.path().join("token"), keys.path().join("other"));
    hsxfer::session::token::new(&token).unwrap();
    hsxfer::session::token::new(&other).unwrap();
    let known = keys.path().join("known_servers");
    let port = free_port();
    isolate_profiles();
    let _server = ServerProc::logged(
        Command::new(BIN)
            .args(["serve", "--port", &port.to_string(), "--token-file"])
            .arg(&token)
            .arg("--key-file")
            .arg(keys.path().join("key"))
            .arg("--root")
            .arg(root.path()),
    );
    wait_listening(port);
    let push = |token: &Path| {
        Command::new(BIN)
            .args([
                "copy",
                "--json",
                "--port",
                &port.to_string(),
                "--token-file",
            ])
            .arg(token)
            .arg("--known-servers")
            .arg(&known)
            .arg(&file)
            .arg("127.0.0.1:f")
            .output()
            .unwrap()
    };
    let refused = push(&other);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("authentication refused"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(fs::read_to_string(&known).unwrap_or_default(), "");
    let s = summary(&push(&token));
    assert!(s["tuning"]["notes"].to_string().contains("first contact"));
    let line = format!(
        "127.0.0.1:{port} {}\n",
        fingerprint(&keys.path().join("key"))
    );
    assert_eq!(fs::read_to_string(&known).unwrap(), line);
}

/// Clear text needs both ends: a server that allows only TLS refuses a `--no-encrypt` client
/// in one line that says what to do, and writes nothing.
#[test]
fn clear_text_needs_both_ends_to_allow_it() {
    let (src, root, keys) = (tempdir(), tempdir(), tempdir());
    let file = src.path().join("f");
    random_file(&file, 10_000, 6);
    let port = free_port();
    let _server = serve(root.path(), port, &keys.path().join("k"), &[]);
    let out = copy(&file, port, "f", &["--no-encrypt"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("accepts only encrypted connections") && e.contains("--no-encrypt"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(!root.path().join("f").exists());
}

#[test]
fn a_server_refused_for_its_root_makes_no_key() {
    let keys = tempdir();
    let key = keys.path().join("key");
    let missing = keys.path().join("no-such-root");
    let out = Command::new(BIN)
        .args(["serve", "--no-auth", "--port", &free_port().to_string()])
        .arg("--key-file")
        .arg(&key)
        .arg("--root")
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("server root") && stderr(&out).contains("no-such-root"),
        "{}",
        stderr(&out)
    );
    assert!(!key.exists(), "a key was made for a server that never ran");
}
