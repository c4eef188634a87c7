//! `copy --ssh` against a real `sshd` (Debian's openssh-server, with keys made for the test)
//! on the receiver host of a namespace path: the client starts `hsxfer serve --once --stdio`
//! through it, takes the one-time token from the SSH channel and opens its data channels
//! straight to the port the one-shot server chose. Nothing may stay running afterwards, also
//! when the client is killed. Needs root; prints SKIPPED otherwise (CI runs as root).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::netns::{root_or_skip, Dumbbell, RECEIVER};
use common::random_file;

/// One path at a time: the tests share the machine's two cores.
static SERIAL: Mutex<()> = Mutex::new(());

const BIN: &str = env!("CARGO_BIN_EXE_hsxfer");

struct Sshd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen (scripts/setup.sh installs openssh-client)");
    assert!(st.success());
}

/// Starts sshd on the receiver host, port 22, accepting root with a key made here.
fn sshd(net: &Dumbbell) -> Sshd {
    assert!(
        Path::new("/usr/sbin/sshd").exists(),
        "no /usr/sbin/sshd: run scripts/setup.sh (it installs openssh-server)"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    keygen(&p("host_key"));
    keygen(&p("id"));
    fs::copy(p("id.pub"), p("authorized_keys")).unwrap();
    fs::create_dir_all("/run/sshd").unwrap();
    let config = format!(
        "ListenAddress {RECEIVER}\nPort 22\nHostKey {}\nAuthorizedKeysFile {}\nPidFile {}\n\
         PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n\
         StrictModes no\n",
        p("host_key").display(),
        p("authorized_keys").display(),
        p("sshd.pid").display(),
    );
    fs::write(p("sshd_config"), config).unwrap();
    let log_path = p("sshd.log");
    let log = fs::File::create(&log_path).unwrap();
    let child = net
        .command("d", "/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(p("sshd_config"))
        .stderr(log)
        .spawn()
        .expect("start sshd");
    let d = Sshd { child, dir };
    assert!(
        net.wait_listening(22, Duration::from_secs(20)),
        "sshd did not start: {}",
        fs::read_to_string(&log_path).unwrap_or_default()
    );
    d
}

impl Sshd {
    fn ssh_command(&self) -> String {
        format!(
            "ssh -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
             -o BatchMode=yes -o LogLevel=ERROR",
            self.dir.path().join("id").display()
        )
    }

    /// `hsxfer copy --ssh ...ARGS` on the sender host.
    fn copy(&self, net: &Dumbbell, remote_bin: &str, args: &[&str]) -> Command {
        // The client's secret for its ssh tokens goes to a directory of the test's own.
        common::isolate_profiles();
        let mut c = net.command("s", BIN);
        c.args(["copy", "--ssh", "--ssh-command", &self.ssh_command()])
            .args(["--remote-hsxfer", remote_bin])
            .args(args);
        c
    }
}

/// The one-shot servers still running on the receiver host.
fn one_shot_servers(net: &Dumbbell) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "pids", &net.ns("d")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|pid| fs::read(format!("/proc/{pid}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("--stdio"))
        .collect()
}

fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "copy --ssh failed: {err}");
    err
}

#[test]
fn a_tree_goes_both_ways_over_ssh_and_nothing_stays_running() {
    if !root_or_skip("ssh") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let net = Dumbbell::up(500, 200);
    let sshd = sshd(&net);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    random_file(&src.join("big"), 6 << 20, 3);
    random_file(&src.join("sub/small"), 1000, 4);
    let remote = work.path().join("remote");
    fs::create_dir(&remote).unwrap();

    // Push to an absolute remote path, as root@RECEIVER.
    let dest = format!("root@{RECEIVER}:{}", remote.display());
    ok(&sshd
        .copy(&net, BIN, &["-r", src.to_str().unwrap(), &dest])
        .output()
        .unwrap());
    for f in ["big", "sub/small"] {
        assert_eq!(
            fs::read(src.join(f)).unwrap(),
            fs::read(remote.join("src").join(f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(one_shot_servers(&net), Vec::<String>::new());

    // Pull it back, from a port of our choosing.
    let back = work.path().join("back");
    let from = format!("{RECEIVER}:{}", remote.join("src").display());
    ok(&sshd
        .copy(
            &net,
            BIN,
            &["--remote-port", "7455", "-r", &from, back.to_str().unwrap()],
        )
        .output()
        .unwrap());
    assert_eq!(
        fs::read(src.join("big")).unwrap(),
        fs::read(back.join("big")).unwrap()
    );
    assert_eq!(one_shot_servers(&net), Vec::<String>::new());

    // A probe over SSH saves the path's profile, and the next copy over SSH starts from it
    // although its one-shot server has another port.
    let probed = sshd
        .copy(
            &net,
            BIN,
            &["--tune", "probe", src.join("big").to_str().unwrap(), &dest],
        )
        .output()
        .unwrap();
    assert!(
        probed.status.success(),
        "{}",
        String::from_utf8_lossy(&probed.stderr)
    );
    let next = sshd
        .copy(
            &net,
            BIN,
            &["--json", src.join("big").to_str().unwrap(), &dest],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&next.stdout);
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let origin = last["tuning"]["origin"].to_string();
    assert!(origin.contains("profile (probe"), "{origin}");

    // The port asked for is the one the remote server takes: sshd's is refused there.
    let out = sshd
        .copy(
            &net,
            BIN,
            &[
                "--remote-port",
                "22",
                src.join("big").to_str().unwrap(),
                &dest,
            ],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("{RECEIVER}:22")),
        "{:?} {err}",
        out.status
    );

    // No hsxfer on the remote host: one line that says what to do.
    let out = sshd
        .copy(
            &net,
            "/nonexistent/hsxfer",
            &[src.join("big").to_str().unwrap(), &dest],
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("hsxfer: error: no hsxfer server started on")
            && last.contains("status 127")
            && last.contains("--remote-hsxfer PATH"),
        "{err}"
    );
}

/// A client killed in the middle of a push: its one-shot server ends too, and the same copy
/// run again resumes what arrived (the client hands both servers the same token, under
/// whose key the journaled blocks are checked).
#[test]
fn a_killed_client_leaves_no_server_behind_and_its_copy_resumes() {
    if !root_or_skip("ssh") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 50 Mbit/s: a 64 MiB push takes about 10 s, long enough to kill it in the middle.
    let net = Dumbbell::up(50, 100);
    let sshd = sshd(&net);
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("f");
    random_file(&file, 64 << 20, 5);
    let remote: PathBuf = work.path().join("remote");
    fs::create_dir(&remote).unwrap();
    let dest = format!("{RECEIVER}:{}", remote.display());
    let mut client = sshd
        .copy(&net, BIN, &["--json", file.to_str().unwrap(), &dest])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the one-shot server runs and has journaled a block (a 28-byte header and
    // 44-byte records), then kill the client (SIGKILL: no clean-up of its own).
    let journal = remote.join(".f.hsxfer-journal");
    let deadline = Instant::now() + Duration::from_secs(30);
    while fs::metadata(&journal).map_or(0, |m| m.len()) < 28 + 44 {
        assert!(Instant::now() < deadline, "no block arrived");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(one_shot_servers(&net).len(), 1, "the server runs");
    client.kill().unwrap();
    client.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !one_shot_servers(&net).is_empty() {
        assert!(
            Instant::now() < deadline,
            "still running 15 s after the client died: {:?}",
            one_shot_servers(&net)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = sshd
        .copy(&net, BIN, &["--json", file.to_str().unwrap(), &dest])
        .output()
        .unwrap();
    ok(&out);
    let summary: serde_json::Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["type"] == "summary")
        .expect("a summary event");
    assert!(
        summary["bytes_resumed"].as_u64().unwrap_or(0) > 0,
        "nothing resumed: {summary}"
    );
    assert!(fs::read(remote.join("f")).unwrap() == fs::read(&file).unwrap());
}
