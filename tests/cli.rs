//! The `hsxfer` binary as a user runs it: resume after a killed server or client, one-line
//! errors with a non-zero exit, NDJSON output, device targets, a full disk.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    free_port, limited_server_at, limited_to, random_file, sha256, wait_listening, ServerProc,
};

const BIN: &str = env!("CARGO_BIN_EXE_hsxfer");

fn serve(root: &Path, port: u16) -> ServerProc {
    common::isolate_profiles();
    let server = ServerProc::logged(
        Command::new(BIN)
            .args(["serve", "--no-auth", "--port", &port.to_string(), "--root"])
            .arg(root),
    );
    wait_listening(port);
    server
}

fn hsxfer(args: &[&str]) -> Output {
    common::isolate_profiles();
    Command::new(BIN).args(args).output().unwrap()
}

fn summary(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().expect("some output");
    serde_json::from_str(last).unwrap()
}

/// Waits until `path` is at least `len` bytes long.
fn wait_for_len(path: &Path, len: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while fs::metadata(path).map(|m| m.len()).unwrap_or(0) < len {
        assert!(Instant::now() < deadline, "{} never grew", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

const JOURNAL_WITH_ONE_RECORD: u64 = 28 + 44;

#[test]
fn killed_server_then_rerun_resumes_without_resending_finished_blocks() {
    resumes_after_the_server_was_killed(None, &[]);
}

/// The same over one MPTCP connection: resuming and verifying do not depend on the transport.
/// In a namespace of its own, since the killed server cannot remove the ports it announced.
#[test]
fn killed_mptcp_server_then_rerun_resumes_too() {
    if !common::netns::root_or_skip("killed_mptcp_server_then_rerun_resumes_too") {
        return;
    }
    let ns = common::netns::LoopbackNs::up();
    resumes_after_the_server_was_killed(Some(&ns), &["--mptcp"]);
}

/// A copy whose server is killed after the first block is committed fails, names resuming,
/// and leaves no file under the final name; rerun, it sends only what was missing. Server and
/// copies run in `ns` (or here), with `transport` (e.g. `--mptcp`).
fn resumes_after_the_server_was_killed(ns: Option<&common::netns::LoopbackNs>, transport: &[&str]) {
    let run = |program: &str| match ns {
        Some(ns) => ns.command(program),
        None => {
            common::isolate_profiles();
            Command::new(program)
        }
    };
    let serve = |root: &Path, port: u16| {
        let server = ServerProc::logged(
            run(BIN)
                .args(["serve", "--no-auth", "--port", &port.to_string(), "--root"])
                .arg(root)
                .args(transport),
        );
        match ns {
            Some(ns) => ns.wait_listening(port),
            None => wait_listening(port),
        }
        server
    };
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let size: u64 = 300 << 20;
    random_file(&src.path().join("big"), size, 11);
    let want = sha256(&src.path().join("big"));
    let port = free_port();
    let server = serve(root.path(), port);
    let p = port.to_string();
    let file = src.path().join("big");
    let mut copy = run(BIN);
    copy.args([
        "copy",
        "-n",
        "4",
        "--no-auth",
        "--pace",
        "200M",
        "--port",
        &p,
    ])
    .args(transport);
    let copy = push_past_its_first_block(copy, &file, root.path());
    drop(server); // SIGKILL
    let out = copy.wait_with_output().unwrap();
    assert!(!out.status.success(), "the interrupted copy must fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hsxfer: error:") && err.contains("resume"),
        "{err}"
    );
    assert!(
        !root.path().join("big").exists(),
        "no partial file under the final name"
    );

    let _server = serve(root.path(), port);
    let out = run(BIN)
        .args(["copy", "-n", "4", "--no-auth", "--json", "--port", &p])
        .args(transport)
        .arg(&file)
        .arg("127.0.0.1:big")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&out);
    assert_eq!(s["verified"], true);
    let expected = match transport.contains(&"--mptcp") {
        true => "mptcp",
        false => "tcp",
    };
    assert_eq!(s["transport"], expected, "{s}");
    let resumed = s["bytes_resumed"].as_u64().unwrap();
    let sent = s["bytes"].as_u64().unwrap();
    assert!(resumed > 0, "{s}");
    assert_eq!(
        sent + resumed,
        size,
        "finished blocks were not sent again: {s}"
    );
    assert_eq!(sha256(&root.path().join("big")), want);
    assert!(!root.path().join(".big.hsxfer-journal").exists());
    assert!(!root.path().join(".big.hsxfer-part").exists());
}

/// Ctrl-C (or a closed terminal's SIGHUP) during an MPTCP copy run as root ends it with
/// exit code 128 + the signal and how to resume, after putting back the path manager's
/// limits the copy raised for its subflows: killed by the signal, it left them raised for
/// good. In a namespace of its own, since the limits are the namespace's. The server's
/// `ip` is slowed down, as on a busy host: it must still have announced its subflow ports
/// (and raised the limits for them) before it accepts a client.
#[test]
fn an_interrupted_mptcp_copy_puts_the_path_managers_limits_back() {
    use nix::sys::signal::{kill, Signal};
    use std::os::unix::fs::PermissionsExt;
    if !common::netns::root_or_skip("an_interrupted_mptcp_copy_puts_the_path_managers_limits_back")
    {
        return;
    }
    let slow = tempfile::tempdir().unwrap();
    let real_ip = Command::new("sh")
        .args(["-c", "command -v ip"])
        .output()
        .unwrap();
    let real_ip = String::from_utf8(real_ip.stdout).unwrap();
    let wrapper = slow.path().join("ip");
    fs::write(
        &wrapper,
        format!("#!/bin/sh\nsleep 0.1\nexec {} \"$@\"\n", real_ip.trim()),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        slow.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let ns = common::netns::LoopbackNs::up();
    let limits = || ns.ip_mptcp("limits");
    let endpoints = || ns.ip_mptcp("endpoint");
    let src = tempfile::tempdir().unwrap();
    random_file(&src.path().join("big"), 300 << 20, 13);
    // One port for both rounds: the second round's server takes over the subflow ports the
    // killed first one left announced.
    let port = free_port();
    let p = port.to_string();
    for (signal, code) in [(Signal::SIGINT, 130), (Signal::SIGHUP, 129)] {
        let root = tempfile::tempdir().unwrap();
        let _server = ns.serve(root.path(), port, &["--mptcp"], &[("PATH", &path)]);
        // The server announces 8 subflow ports, raising the subflow limit for them, before
        // it listens: a client that raised the limits meanwhile had its raise written over.
        assert_eq!(endpoints().lines().count(), 8, "{}", endpoints());
        let before = limits();
        let mut copy = ns.command(BIN);
        copy.args(["copy", "--mptcp", "-n", "4", "--no-auth", "--pace", "200M"])
            .args(["--port", &p]);
        let copy = push_past_its_first_block(copy, &src.path().join("big"), root.path());
        let raised = limits();
        assert_ne!(raised, before, "the copy did not raise the limits");
        kill(nix::unistd::Pid::from_raw(copy.id() as i32), signal).unwrap();
        let out = copy.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{signal}: {err}");
        let said =
            format!("hsxfer: error: interrupted by {signal}: run the same command again to resume");
        assert!(err.contains(&said), "{err}");
        assert_eq!(limits(), before, "{signal}: raised to {raised} and left so");
    }
}

/// The MPTCP server and copies of one namespace share its path manager's limits: a copy
/// that ends leaves the raise of one still running, the last copy leaves the server's, and a
/// server that replaces a killed one puts back, at its end, the limits from before the
/// killed one. (Each used to put back the limits it had found: the first copy to end took
/// the second's raise away, the second left the first's for good, and so did the server.)
#[test]
fn an_mptcp_server_and_its_copies_share_the_path_managers_limits() {
    use nix::sys::signal::{kill, Signal};
    if !common::netns::root_or_skip("an_mptcp_server_and_its_copies_share_the_path_managers_limits")
    {
        return;
    }
    let ns = common::netns::LoopbackNs::up();
    let limits = || ns.ip_mptcp("limits");
    let (src, root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    random_file(&src.path().join("big"), 300 << 20, 14);
    let serve = || ns.serve(root.path(), 7000, &["--mptcp"], &[]);
    // A copy of `channels` subflows (it raises the limits to `channels - 1` of each), past
    // its first block.
    let copy = |channels: &str, to: &str| {
        let child = ns
            .command(BIN)
            .args([
                "copy",
                "--mptcp",
                "-n",
                channels,
                "--no-auth",
                "--pace",
                "100M",
            ])
            .args(["--port", "7000"])
            .arg(src.path().join("big"))
            .arg(format!("127.0.0.1:{to}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_len(
            &root.path().join(format!(".{to}.hsxfer-journal")),
            JOURNAL_WITH_ONE_RECORD,
        );
        ServerProc::new(child)
    };
    let interrupt = |mut copy: ServerProc| {
        kill(
            nix::unistd::Pid::from_raw(copy.0.id() as i32),
            Signal::SIGINT,
        )
        .unwrap();
        assert_eq!(copy.0.wait().unwrap().code(), Some(130));
    };
    let original = limits();
    let server = serve();
    let announcing = limits();
    assert!(announcing.contains("subflows 8 "), "{announcing}");
    let four = copy("4", "a");
    let three = copy("3", "b");
    assert!(limits().contains("add_addr_accepted 3 "), "{}", limits());
    interrupt(four);
    assert_eq!(
        limits(),
        announcing.replace("add_addr_accepted 0 ", "add_addr_accepted 2 "),
        "the running copy's raise was taken away"
    );
    interrupt(three);
    assert_eq!(limits(), announcing, "the copies' raises were left");
    // Killed (on drop): its raise and ports stay, and the next server takes over both.
    drop(server);
    serve().terminate();
    assert_eq!(limits(), original, "the killed server's raise was left");
}

/// Two servers with the userspace MPTCP path manager in one namespace: the namespace keeps
/// it selected while either runs, and the last to stop selects the in-kernel one again.
/// (Each used to select again what it had found: the first to stop took the manager away
/// from the second, and the second left it selected for good.)
#[test]
fn userspace_mptcp_servers_of_one_namespace_share_its_path_manager() {
    if !common::netns::root_or_skip(
        "userspace_mptcp_servers_of_one_namespace_share_its_path_manager",
    ) {
        return;
    }
    let ns = common::netns::LoopbackNs::up();
    let pm_type = || {
        let out = ns
            .command("cat")
            .arg("/proc/sys/net/mptcp/pm_type")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let root = tempfile::tempdir().unwrap();
    let serve = |port| {
        ns.serve(
            root.path(),
            port,
            &["--mptcp", "--mptcp-pm", "userspace"],
            &[],
        )
    };
    assert_eq!(pm_type(), "0", "the in-kernel path manager to begin with");
    let first = serve(7000);
    assert_eq!(pm_type(), "1");
    let second = serve(7100);
    first.terminate();
    assert_eq!(
        pm_type(),
        "1",
        "the second server's path manager was taken away"
    );
    second.terminate();
    assert_eq!(
        pm_type(),
        "0",
        "the userspace path manager was left selected"
    );
    // A killed one leaves it selected; the next server of the in-kernel path manager selects
    // that one again (it stayed until another userspace server came and went).
    drop(serve(7200));
    assert_eq!(pm_type(), "1");
    let kernel = ns.serve(root.path(), 7300, &["--mptcp"], &[]);
    assert_eq!(
        pm_type(),
        "0",
        "the killed server's path manager stayed selected"
    );
    kernel.terminate();
}

/// Output into a pipe whose reader has gone (`hsxfer cc list | head -1`) is dropped, not a
/// panic: `println!` panicked on the broken pipe, with a backtrace.
#[test]
fn a_closed_stdout_is_not_a_crash() {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(BIN)
        .args(["cc", "list"])
        .stdout(Stdio::from(write))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Starts `copy` pushing `file` to `big` on a server serving `root` (stderr piped), and
/// returns once the server has journaled its first block.
fn push_past_its_first_block(mut copy: Command, file: &Path, root: &Path) -> Child {
    let child = copy
        .arg(file)
        .arg("127.0.0.1:big")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_len(&root.join(".big.hsxfer-journal"), JOURNAL_WITH_ONE_RECORD);
    child
}

#[test]
fn killed_client_then_rerun_resumes_a_pull() {
    let root = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let size: u64 = 200 << 20;
    random_file(&root.path().join("data"), size, 12);
    let want = sha256(&root.path().join("data"));
    let port = free_port();
    let _server = serve(root.path(), port);
    let p = port.to_string();
    let target = dst.path().join("data");
    let mut copy = Command::new(BIN)
        .args([
            "copy",
            "-n",
            "2",
            "--no-auth",
            "--pace",
            "300M",
            "--port",
            &p,
            "127.0.0.1:data",
        ])
        .arg(&target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_len(
        &dst.path().join(".data.hsxfer-journal"),
        JOURNAL_WITH_ONE_RECORD,
    );
    copy.kill().unwrap();
    copy.wait().unwrap();
    assert!(!target.exists());
    let out = hsxfer(&[
        "copy",
        "--no-auth",
        "--json",
        "--port",
        &p,
        "127.0.0.1:data",
        target.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&out);
    assert!(s["bytes_resumed"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(sha256(&target), want);
}

/// Ctrl-C on a terminal: the error is the last thing on the screen. The live display was
/// cleared by the runtime's shutdown after the error was printed, and its cursor moves
/// erased the error line.
#[test]
fn ctrl_c_on_a_terminal_leaves_the_error_on_the_screen() {
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("big");
    random_file(&file, 200 << 20, 13);
    let port = free_port();
    let _server = serve(root.path(), port);
    let typescript = src.path().join("typescript");
    let command = format!(
        "{BIN} copy -n 2 --no-auth --pace 100M --port {port} {} 127.0.0.1:big",
        file.display()
    );
    // `script` gives the copy a terminal, as a user's shell does, and records what it drew.
    let mut terminal = Command::new("script")
        .args(["-qfec", &command])
        .arg(&typescript)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("script (util-linux) runs");
    wait_for_len(
        &root.path().join(".big.hsxfer-journal"),
        JOURNAL_WITH_ONE_RECORD,
    );
    // This copy alone (other tests' copies run meanwhile): the hsxfer under `script`.
    let copy = descendant_named(terminal.id(), "hsxfer").expect("the copy under script");
    nix::sys::signal::kill(copy, nix::sys::signal::Signal::SIGINT).unwrap();
    assert_eq!(terminal.wait().unwrap().code(), Some(130));
    let drawn = fs::read(&typescript).unwrap();
    let error = b"hsxfer: error: interrupted by SIGINT";
    let at = drawn
        .windows(error.len())
        .position(|w| w == error)
        .unwrap_or_else(|| panic!("no error in {}", String::from_utf8_lossy(&drawn)));
    let after = &drawn[at..];
    assert!(
        !after.contains(&0x1b),
        "the display drew over the error: {:?}",
        String::from_utf8_lossy(after)
    );
}

/// The first process below `ancestor` whose command is `name`, found through each
/// process's parent in `/proc`.
fn descendant_named(ancestor: u32, name: &str) -> Option<nix::unistd::Pid> {
    let parent_of = |pid: u32| -> Option<u32> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // pid (comm) state ppid ...: the command may hold spaces and parentheses.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .find(|&pid| {
            let mut p = pid;
            while let Some(up) = parent_of(p).filter(|&up| up > 1) {
                if up == ancestor {
                    return true;
                }
                p = up;
            }
            false
        })
        .map(|pid| nix::unistd::Pid::from_raw(pid as i32))
}

/// A server's log, written to a file, carries no terminal colour codes.
#[test]
fn a_servers_log_in_a_file_is_plain_text() {
    let root = tempfile::tempdir().unwrap();
    let log = root.path().join("log");
    let port = free_port();
    common::isolate_profiles();
    let child = Command::new(BIN)
        .args(["serve", "--no-auth", "--port", &port.to_string(), "--root"])
        .arg(root.path())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let server = ServerProc::new(child);
    wait_listening(port);
    // Its "serving" line is written after it listens.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fs::read_to_string(&log).unwrap().contains("serving") {
        assert!(
            Instant::now() < deadline,
            "{}",
            fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(server);
    let text = fs::read_to_string(&log).unwrap();
    assert!(!text.contains('\x1b'), "{text:?}");
}

/// `dir/tree`, made holding a FIFO (`p`), which a tree push passes over with a note.
fn tree_with_a_fifo(dir: &Path) -> std::path::PathBuf {
    let tree = dir.join("tree");
    fs::create_dir(&tree).unwrap();
    nix::unistd::mkfifo(
        &tree.join("p"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    tree
}

/// A transfer that fails still shows its set-up's notes, before the error: here the FIFO a
/// tree push passed over, in both outputs (the summary that carries them never came).
#[test]
fn a_failed_transfer_shows_its_notes_before_the_error() {
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let tree = tree_with_a_fifo(src.path());
    fs::write(tree.join("f"), b"a file where the server has a directory").unwrap();
    fs::create_dir_all(root.path().join("bad/tree/f")).unwrap();
    let port = free_port();
    let _server = serve(root.path(), port);
    let p = port.to_string();
    let push = |dest: &str, extra: &[&str]| {
        let copy = [
            "copy",
            "-r",
            "--no-auth",
            "--port",
            &p,
            tree.to_str().unwrap(),
        ];
        hsxfer(&[&copy[..], &[dest], extra].concat())
    };
    // The note comes before the error line, whatever the error.
    let noted_before = |err: &str, error: &str| {
        let (warning, error) = (
            err.find("hsxfer: warning: client: not copied"),
            err.find(error),
        );
        assert!(warning.is_some() && warning < error, "{err}");
    };
    let human = push("127.0.0.1:bad/", &[]);
    let err = String::from_utf8_lossy(&human.stderr);
    assert!(!human.status.success(), "{err}");
    noted_before(&err, "hsxfer: error:");
    // The same when the server refuses the push outright (no such directory).
    let refused = push("127.0.0.1:no/such/", &[]);
    noted_before(
        &String::from_utf8_lossy(&refused.stderr),
        "hsxfer: error: server refused",
    );

    let json = push("127.0.0.1:bad/", &["--json"]);
    let events = common::validated_events(&json.stdout);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.last(), Some(&"error"), "{events:?}");
    assert!(
        events.iter().any(
            |e| e["type"] == "warning" && e["message"].as_str().unwrap().contains("not copied")
        ),
        "{events:?}"
    );
}

/// A copy that a signal stops shows its set-up's notes (a first contact's recorded key, a
/// tree's entries passed over) before its error, as a copy that fails does: dropped by the
/// signal, it had left them unsaid.
#[test]
fn an_interrupted_copy_shows_its_notes_before_the_error() {
    let root = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let tree = tree_with_a_fifo(src.path());
    random_file(&tree.join("big"), 40 << 20, 21);
    let known = src.path().join("known_servers");
    let port = free_port();
    let _server = serve(root.path(), port);
    let p = port.to_string();
    let mut copy = Command::new(BIN)
        .args(["copy", "-r", "--json", "--no-auth", "--port", &p])
        .args(["--pace", "4M", "--interval", "200ms", "--known-servers"])
        .args([
            known.to_str().unwrap(),
            tree.to_str().unwrap(),
            "127.0.0.1:t/",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupted once data moves: after its first progress event.
    let mut stdout = std::io::BufReader::new(copy.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("\"type\":\"progress\"") {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(n > 0, "the copy ended before any progress: {seen}");
        seen.push_str(&line);
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(copy.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    std::io::Read::read_to_string(&mut stdout, &mut seen).unwrap();
    let out = copy.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let events = common::validated_events(seen.as_bytes());
    let last = events.len() - 1;
    assert_eq!(events[last]["type"], "error", "{events:?}");
    for note in ["client: first contact with", "client: not copied"] {
        let at = events.iter().position(|e| {
            e["type"] == "warning" && e["message"].as_str().unwrap().starts_with(note)
        });
        assert!(at.is_some_and(|i| i < last), "{note}: {events:?}");
        let line = format!("hsxfer: warning: {note}");
        assert!(
            err.find(&line) < err.find("hsxfer: error: interrupted by SIGINT"),
            "{err}"
        );
    }
}

#[test]
fn json_events_follow_the_documented_schema() {
    let root = tempfile::tempdir().unwrap();
    random_file(&root.path().join("f"), 9 << 20, 5);
    let port = free_port();
    let _server = serve(root.path(), port);
    let port_arg = port.to_string();
    let pull = |extra: &[&str]| {
        let mut args = vec!["copy", "--no-auth", "--json", "--port", &port_arg];
        args.extend(extra);
        args.extend(["127.0.0.1:f", "/dev/null"]);
        hsxfer(&args)
    };
    // A pull's report holds the sending server's tuner, even one that neither paced nor
    // decided anything (the pacing given): it was null.
    let out = pull(&["-n", "2", "--pace", "200M"]);
    assert!(out.status.success());
    let events = common::validated_events(&out.stdout);
    let online = &events.last().unwrap()["tuning"]["online"];
    assert_eq!(online["channels"], 2, "{online}");
    let out = pull(&["-n", "3"]);
    assert!(out.status.success());
    let events = common::validated_events(&out.stdout);
    assert_eq!(events[0]["type"], "start");
    assert_eq!(events[0]["schema"], 2);
    let s = events.last().unwrap();
    assert_eq!(s["type"], "summary");
    assert_eq!(s["bytes"], 9 << 20);
    assert_eq!(s["verified"], true);
    let channels = s["channels"].as_array().unwrap();
    assert_eq!(channels.len(), 3);
    let total: u64 = channels.iter().map(|c| c["bytes"].as_u64().unwrap()).sum();
    assert_eq!(total, 9 << 20);
    // The server sent: its settings reached the client's report.
    assert!(
        channels
            .iter()
            .all(|c| c["cc"].is_string() && c["send_buffer"].is_u64()),
        "{s}"
    );

    // The summary's notes are the warnings' texts, flags and all (they named the library's
    // fields, `` `mptcp` ``, where the warnings said --mptcp).
    let out = pull(&["--mptcp"]);
    assert!(out.status.success());
    let events = common::validated_events(&out.stdout);
    let warnings: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "warning")
        .map(|e| &e["message"])
        .collect();
    let notes: Vec<&serde_json::Value> = events.last().unwrap()["tuning"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert!(
        warnings.iter().any(|w| w.to_string().contains("--mptcp")),
        "{warnings:?}"
    );
    assert_eq!(warnings, notes);

    // A timed bench reports every channel at each interval, with its TCP state.
    let out = hsxfer(&[
        "bench",
        "-n",
        "2",
        "--no-auth",
        "--json",
        "--time",
        "1",
        "--interval",
        "200ms",
        "--port",
        &port.to_string(),
        "127.0.0.1",
    ]);
    assert!(out.status.success());
    let events = common::validated_events(&out.stdout);
    let per_channel = |i: u64| {
        events
            .iter()
            .filter(|e| e["type"] == "channel" && e["index"] == i && e["cwnd"].is_u64())
            .count()
    };
    assert!(per_channel(0) >= 3 && per_channel(1) >= 3, "{events:#?}");
}

/// A download traced on many channels with a long interval: the sending server's samples
/// reach the trace file whole, in batches that each fit a control message. (Once one batch
/// held the interval's samples: 5 s of 128 channels, about 24 MB, past the 16 MiB a
/// control message may take, and the first batch ended the transfer.)
#[test]
fn a_trace_of_many_channels_reaches_the_client_in_batches_that_fit() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = serve(dir.path(), port);
    let trace = dir.path().join("trace.csv");
    let out = hsxfer(&[
        "bench",
        "-R",
        "-n",
        "128",
        "--no-auth",
        "--json",
        "--time",
        "6",
        "--interval",
        "5s",
        "--trace",
        trace.to_str().unwrap(),
        "--port",
        &port.to_string(),
        "127.0.0.1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = fs::read_to_string(&trace).unwrap();
    let mut rows = vec![0usize; 128];
    for line in text.lines().skip(1) {
        let channel: usize = line.split(',').nth(1).unwrap().parse().unwrap();
        rows[channel] += 1;
    }
    // 100 samples a second per channel; a busy host takes fewer, but every channel has some,
    // and all of them take more than one batch.
    let total: usize = rows.iter().sum();
    assert!(rows.iter().all(|&n| n > 0), "{rows:?}");
    assert!(
        total > hsxfer::channels::limits::TRACE_SAMPLES_PER_BATCH,
        "{total} rows"
    );
}

/// A pull into the process's own stdout: piped (`| next`), the data alone goes down the
/// pipe and the report (human or JSON) to stderr; redirected to a file (`> out.bin`), the
/// file gets the data, through the descriptor, as `cp` would write it.
#[test]
fn a_pull_into_stdout_keeps_the_data_apart_from_the_report() {
    let root = tempfile::tempdir().unwrap();
    random_file(&root.path().join("f"), 5 << 20, 8);
    let want = fs::read(root.path().join("f")).unwrap();
    let port = free_port();
    let _server = serve(root.path(), port);
    let port = port.to_string();
    for json in [false, true] {
        let mut args = vec!["copy", "-n", "2", "--no-auth", "--port", &port];
        if json {
            args.push("--json");
        }
        args.extend(["127.0.0.1:f", "/dev/stdout"]);
        let out = hsxfer(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            out.stdout == want,
            "stdout holds {} bytes",
            out.stdout.len()
        );
        let report = if json {
            "\"type\":\"summary\""
        } else {
            "verified"
        };
        assert!(err.contains(report), "{err}");
    }
    // With --json, stderr then carries the JSON stream alone: a failure's notes and error
    // are events there, not lines for people among them.
    let known = tempfile::tempdir().unwrap();
    let ks = known.path().join("known_servers");
    let out = hsxfer(&[
        "copy",
        "--json",
        "--no-auth",
        "--port",
        &port,
        "--known-servers",
        ks.to_str().unwrap(),
        "127.0.0.1:no-such-file",
        "/dev/stdout",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let events = common::validated_events(&out.stderr);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["start", "warning", "error"], "{events:?}");
    // The child's /proc/self/fd/1 is /dev/stdout's target: the file it was redirected to.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.bin");
    let status = Command::new(BIN)
        .args(["copy", "--no-auth", "--port", &port])
        .args(["127.0.0.1:f", "/proc/self/fd/1"])
        .stdout(fs::File::create(&file).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(fs::read(&file).unwrap() == want);
}

/// Flags the argument parser refuses: exit 2 (usage), with `needle` in its message (which
/// may span lines, as clap's list of missing arguments does).
fn usage_error(args: &[&str], needle: &str) {
    let out = hsxfer(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
}

/// A value the argument parser refuses: exit 2 (usage), the first line says what to use.
fn refused_as_usage(args: &[&str], needle: &str) {
    let out = hsxfer(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
}

fn fails_with(args: &[&str], needle: &str) {
    let out = hsxfer(args);
    assert_eq!(out.status.code(), Some(1), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A file of more blocks than a session may track (a sparse 16 TiB file in 4 KiB blocks,
/// almost 2^32 of them) is refused, pushed or pulled, naming the block size that takes it. Pulled,
/// it aborted the server on allocating its bookkeeping.
#[test]
fn a_file_of_too_many_blocks_is_refused_with_the_block_size_that_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir(&root).unwrap();
    let huge = root.join("huge.img");
    // Just under ext4's largest file (16 TiB).
    fs::File::create(&huge)
        .unwrap()
        .set_len((16 << 40) - (1 << 20))
        .unwrap();
    let port = free_port();
    let mut server = serve(&root, port);
    let port = port.to_string();
    let in_4k_blocks = |from: &str, to: &str, needle: &str| {
        let args = [
            "copy",
            "--no-auth",
            "--port",
            &port,
            "--block-size",
            "4K",
            from,
            to,
        ];
        fails_with(&args, needle);
    };
    in_4k_blocks(
        "127.0.0.1:huge.img",
        "/dev/null",
        "copy it with a --block-size of 4194304 bytes or more",
    );
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server is still serving"
    );
    in_4k_blocks(
        huge.to_str().unwrap(),
        "127.0.0.1:x",
        "more than 4,194,304 blocks of 4096 bytes",
    );
}

/// `token new` writes a strong private token; a token others may read, one too short to
/// resist guessing, and one inside the served root are refused with the fix.
#[test]
fn tokens_are_strong_private_and_kept_outside_the_served_root() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let t = token.to_str().unwrap();
    let out = hsxfer(&["token", "new", t]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        fs::metadata(&token).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(fs::read_to_string(&token).unwrap().trim().len(), 64);
    fails_with(&["token", "new", t], "creating token file");
    let root = dir.path().join("root");
    fs::create_dir(&root).unwrap();
    let inside = root.join("token");
    fs::copy(&token, &inside).unwrap();
    let r = root.to_str().unwrap();
    fails_with(
        &[
            "serve",
            "--root",
            r,
            "--token-file",
            inside.to_str().unwrap(),
        ],
        "lies inside the served root",
    );
    fs::set_permissions(&token, fs::Permissions::from_mode(0o644)).unwrap();
    fails_with(&["serve", "--root", r, "--token-file", t], "chmod 600");
    fs::write(&token, "s3cret\n").unwrap();
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
    fails_with(
        &["serve", "--root", r, "--token-file", t],
        "hsxfer token new",
    );
    // A good token of another user's: that user can read and change it.
    let theirs = dir.path().join("theirs");
    assert!(hsxfer(&["token", "new", theirs.to_str().unwrap()])
        .status
        .success());
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let theirs = theirs.to_str().unwrap();
        // A client before it connects (nothing listens on that port), and a server.
        let (closed, data) = (free_port().to_string(), inside.to_str().unwrap());
        let copy = [
            "copy",
            "--port",
            &closed,
            "--token-file",
            theirs,
            data,
            "127.0.0.1:x",
        ];
        for args in [&copy[..], &["serve", "--root", r, "--token-file", theirs]] {
            fails_with(args, "belongs to another user (uid 65534)");
        }
    } else {
        eprintln!("SKIPPED a token file of another user: making one needs root (CI runs as root)");
    }
}

#[test]
fn bad_input_gets_a_clear_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    fs::write(&f, b"x").unwrap();
    let f = f.to_str().unwrap();
    let closed = free_port().to_string();
    fails_with(
        &["copy", "--no-auth", "--port", &closed, f, "127.0.0.1:x"],
        "cannot connect",
    );
    // Values no path has are refused before connecting (the port is closed: a refusal after
    // connecting would say "cannot connect"), naming the flag; a rate in bytes is a usage
    // error.
    for (flags, needle) in [
        (&["--rate", "1"][..], "a --rate of 1 bit/s"),
        (
            &["--rate", "1G", "--rtt", "0s"],
            "an --rtt of 0ns is out of range",
        ),
        (&["--buffer", "0"], "a --buffer of 0 bytes is out of range"),
        (
            &["--block-size", "5G"],
            "block size 5368709120 is out of range",
        ),
    ] {
        let args: Vec<&str> = ["copy", "--no-auth", "--port", &closed]
            .into_iter()
            .chain(flags.iter().copied())
            .chain([f, "127.0.0.1:x"])
            .collect();
        fails_with(&args, needle);
    }
    fails_with(
        &[
            "bench",
            "--no-auth",
            "--port",
            &closed,
            "--time",
            "0",
            "127.0.0.1",
        ],
        "a bench duration of 0 s is out of range",
    );
    refused_as_usage(&["copy", "--rate", "1GB", f, "127.0.0.1:x"], "in bytes");
    fails_with(
        &["copy", "--no-auth", f, "no-such-host.invalid:x"],
        "cannot resolve host",
    );
    fails_with(
        &["copy", "--no-auth", "/no/such/file", "127.0.0.1:x"],
        "no such file",
    );
    fails_with(&["copy", f, "127.0.0.1:x"], "--token-file");
    // Refused before connecting: "server refused: a pacing cap of 0 bytes/s" it said.
    fails_with(
        &["copy", "--no-auth", "--rate", "0", f, "127.0.0.1:x"],
        "a --rate of 0 is no path's",
    );
    fails_with(&["copy", "--no-auth", f, "other"], "both local");
    // Flags that do not parse are the argument parser's usage errors (exit status 2).
    usage_error(
        &[
            "copy",
            "--no-auth",
            "--mptcp",
            "--mptcp-paths",
            "eth1",
            f,
            "127.0.0.1:x",
        ],
        "'eth1' is not an IP address",
    );
    usage_error(
        &[
            "copy",
            "--no-auth",
            "--mptcp-paths",
            "off",
            f,
            "127.0.0.1:x",
        ],
        "required arguments were not provided:\n  --mptcp",
    );
    // With --ssh the server's key comes over SSH and is pinned: the flags that choose
    // another trust, or none, are refused rather than ignored.
    for flag in [
        &["--no-encrypt"][..],
        &[
            "--server-fingerprint",
            "SHA256:BXJqrL1g677gaRqzLu/aZ3ZtLECr6UAabp9e1ehIsH0",
        ],
        &["--known-servers", "/tmp/known"],
    ] {
        let mut args = vec!["copy", "--ssh"];
        args.extend_from_slice(flag);
        args.extend_from_slice(&[f, "127.0.0.1:x"]);
        usage_error(&args, &format!("'--ssh' cannot be used with '{}", flag[0]));
    }
    // A token on standard input is for the one-shot server only.
    usage_error(
        &["serve", "--token-stdin", "--root", "."],
        "required arguments were not provided:\n  --stdio",
    );
    // A server's block memory holds at least one default block.
    refused_as_usage(
        &["serve", "--no-auth", "--root", ".", "--block-memory", "1M"],
        "1M holds less than one 4 MiB block: use at least 4M",
    );
    // `lab run` refuses a queue it cannot use before it builds anything.
    usage_error(
        &["lab", "run", "fairness", "--buffer", "1bdp"],
        "required arguments were not provided:\n  --against <CC>",
    );
    usage_error(
        &["lab", "run", "fairness", "--tuned"],
        "required arguments were not provided:\n  --against <CC>",
    );
    usage_error(
        &["lab", "run", "fairness", "--paced-reference"],
        "required arguments were not provided:\n  --against <CC>",
    );
    usage_error(
        &[
            "lab",
            "run",
            "fairness",
            "--against",
            "cubic",
            "--buffer",
            "3x",
        ],
        "bad queue size '3x'",
    );
    let port = free_port();
    let _s = serve(dir.path(), port);
    let p = port.to_string();
    fails_with(
        &[
            "copy",
            "--no-auth",
            "--port",
            &p,
            "127.0.0.1:missing",
            "out",
        ],
        "no such file",
    );
    let out = hsxfer(&[
        "copy",
        "--no-auth",
        "--port",
        &p,
        "127.0.0.1:missing",
        "out",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    let root = dir.path().canonicalize().unwrap();
    assert!(err.contains("missing: no such file"), "{err}");
    assert!(
        !err.contains(root.to_str().unwrap()),
        "the server root is not revealed: {err}"
    );
    fails_with(
        &["copy", "--no-auth", "--port", &p, f, f, "127.0.0.1:f"],
        "not a directory",
    );
    let out = hsxfer(&[
        "copy",
        "--no-auth",
        "--json",
        "--port",
        &p,
        "127.0.0.1:missing",
        "out",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains("\"type\":\"error\"")),
        "{text}"
    );
    // A serve refusal: --no-auth on a public address.
    fails_with(
        &[
            "serve",
            "--no-auth",
            "--listen",
            "0.0.0.0",
            "--root",
            dir.path().to_str().unwrap(),
        ],
        "loopback",
    );
}

/// A file larger than the destination's free space is refused before its first byte, with
/// the numbers and nothing left behind; files that fill the disk while they are written end
/// the copy with what to do, and no file is left incomplete under its final name.
#[test]
fn a_full_disk_fails_cleanly_with_no_file_under_the_final_name() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: mounting a tiny tmpfs needs root (CI runs as root)");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let small = root.path().join("small");
    fs::create_dir(&small).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Unmount(&small);
    let src = tempfile::tempdir().unwrap();
    random_file(&src.path().join("f"), 8 << 20, 6);
    random_file(&src.path().join("a"), 1536 << 10, 7);
    random_file(&src.path().join("b"), 1536 << 10, 8);
    let port = free_port();
    let _s = serve(root.path(), port);
    let port = port.to_string();
    let from = |name: &str| src.path().join(name).to_str().unwrap().to_owned();
    fails_with(
        &[
            "copy",
            "--no-auth",
            "--port",
            &port,
            &from("f"),
            "127.0.0.1:small/f",
        ],
        "creating small/f: it needs 8.00 MiB and its filesystem has 2.00 MiB free: free space \
         there or choose another destination",
    );
    let left: Vec<_> = fs::read_dir(&small).unwrap().collect();
    assert!(left.is_empty(), "a refused file left {left:?}");

    let (a, b) = (from("a"), from("b"));
    fails_with(
        &[
            "copy",
            "--no-auth",
            "--port",
            &port,
            &a,
            &b,
            "127.0.0.1:small/",
        ],
        "No space left on device (os error 28) (the filesystem is full: free space there, then \
         run the same copy again: it resumes where it stopped)",
    );
    let committed: Vec<_> = ["a", "b"]
        .into_iter()
        .filter(|n| small.join(n).exists())
        .collect();
    assert!(committed.len() < 2, "3 MiB fitted in a 2 MiB tmpfs");
    for n in committed {
        assert_eq!(
            fs::read(small.join(n)).unwrap(),
            fs::read(src.path().join(n)).unwrap(),
            "{n} is under its final name but not whole"
        );
    }
}

#[test]
fn probe_and_profiles_give_one_line_errors_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let closed = free_port().to_string();
    fails_with(
        &["probe", "--no-auth", "--port", &closed, "127.0.0.1"],
        "cannot connect",
    );
    fails_with(
        &["probe", "--no-auth", "no-such-host.invalid"],
        "cannot resolve host",
    );
    refused_as_usage(
        &["probe", "--no-auth", "--direction", "sideways", "127.0.0.1"],
        "push or pull",
    );
    refused_as_usage(
        &["copy", "--tune", "maybe", "a", "127.0.0.1:b"],
        "auto, probe or off",
    );
    let port = free_port();
    let _s = serve(dir.path(), port);
    let p = port.to_string();
    // On loopback the first trial alone takes 2 s: one second cannot hold a probe.
    fails_with(
        &[
            "probe",
            "--no-auth",
            "--port",
            &p,
            "--budget",
            "1s",
            "127.0.0.1",
        ],
        "--budget",
    );
    // A corrupt saved profile is reported, ignored, and does not stop the transfer.
    let cache = std::path::PathBuf::from(std::env::var_os("XDG_CACHE_HOME").unwrap());
    let profiles = cache.join("hsxfer").join("profiles");
    fs::create_dir_all(&profiles).unwrap();
    let file = profiles.join(format!("127.0.0.1_{port}_push.json"));
    // A 4 MiB bench after the profile was spoilt, with `extra` flags.
    let bench_on_corrupt = |extra: &[&str]| {
        fs::write(&file, "{\"server\": 12").unwrap();
        let common = ["bench", "--no-auth", "--port", &p, "--size", "4M"];
        let out = hsxfer(&[&common[..], extra, &["127.0.0.1"]].concat());
        assert!(out.status.success(), "{out:?}");
        out
    };
    let out = bench_on_corrupt(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    // Beside the note of this first contact: the probe refused above for its budget was
    // refused before connecting, and recorded no key.
    assert!(
        err.contains("hsxfer: warning: client: first contact with"),
        "{err}"
    );
    let other: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("hsxfer: warning: client: first contact with"))
        .collect();
    assert!(
        err.contains("unreadable") && err.contains("will be rewritten") && other.len() == 1,
        "{err}"
    );
    // With --json it is a `warning` event and one of the summary's notes.
    let out = bench_on_corrupt(&["--json"]);
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let unreadable = |v: &serde_json::Value| v.as_str().is_some_and(|m| m.contains("unreadable"));
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "warning" && unreadable(&e["message"])),
        "{events:#?}"
    );
    let last = events.last().unwrap();
    assert!(
        last["type"] == "summary"
            && last["tuning"]["notes"]
                .as_array()
                .is_some_and(|n| n.iter().any(unreadable)),
        "{last:#}"
    );
}

#[test]
fn a_2000_file_tree_pushes_and_pulls_at_ulimit_n_1024() {
    push_and_pull_a_tree_at_ulimit_n(2000, 1024);
}

/// At `ulimit -n 256` a whole manifest chunk (256 files, a partial file and a journal each)
/// is more than a process may open: the receiver plans each chunk in parts its budget holds.
#[test]
fn a_tree_pushes_and_pulls_at_ulimit_n_256() {
    push_and_pull_a_tree_at_ulimit_n(600, 256);
}

/// Pushes a tree of `files` files into a server and pulls it back, both ends at `ulimit -n
/// NOFILE`, and compares both copies with the source.
fn push_and_pull_a_tree_at_ulimit_n(files: usize, nofile: u32) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    // Three 4 KiB blocks per file: each has a partial file and a journal while it is
    // received, two descriptors, so the tree held open at once would need twice its count.
    for i in 0..files {
        let d = src.join(format!("d{:02}", i % 20));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(format!("f{i:04}")), vec![(i % 251) as u8; 9000 + i]).unwrap();
    }
    let root = dir.path().join("root");
    fs::create_dir(&root).unwrap();
    let (_server, port) = limited_server_at(&root, nofile);
    let p = port.to_string();
    let push = limited_to(nofile)
        .args([
            "copy",
            "--no-auth",
            "--port",
            &p,
            "-r",
            "--block-size",
            "4K",
        ])
        .arg(&src)
        .arg("127.0.0.1:")
        .output()
        .unwrap();
    assert!(
        push.status.success(),
        "{}",
        String::from_utf8_lossy(&push.stderr)
    );
    assert_eq!(common::snapshot(&src), common::snapshot(&root.join("src")));
    let back = dir.path().join("back");
    let pull = limited_to(nofile)
        .args([
            "copy",
            "--no-auth",
            "--port",
            &p,
            "-r",
            "--block-size",
            "4K",
            "127.0.0.1:src",
        ])
        .arg(&back)
        .output()
        .unwrap();
    assert!(
        pull.status.success(),
        "{}",
        String::from_utf8_lossy(&pull.stderr)
    );
    assert_eq!(common::snapshot(&src), common::snapshot(&back));
}

/// The receiving server killed (SIGKILL, as a power cut would stop it) just before each step
/// of a commit: under the final name there is nothing or the whole verified file, and a rerun
/// ends with the file byte-identical and no temporary file left beside it. Both kinds of
/// file: three blocks (a named part file and its journal) and one (written unnamed).
#[test]
fn a_receiver_killed_at_each_commit_step_ends_byte_identical_after_a_rerun() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    for (size, step) in [3 << 20, 100 << 10].into_iter().flat_map(|size| {
        [
            "set-attributes",
            "sync-file",
            "rename",
            "sync-dir",
            "remove-journal",
        ]
        .map(|step| (size, step))
    }) {
        let src = dir.path().join(format!("f{size}"));
        if !src.exists() {
            random_file(&src, size, 21);
        }
        let want = sha256(&src);
        let s = src.to_str().unwrap();
        let step_dir = format!("{step}-{size}");
        let root = dir.path().join(&step_dir);
        fs::create_dir(&root).unwrap();
        let port = free_port();
        let p = port.to_string();
        let mut server = Command::new(BIN)
            .args(["serve", "--no-auth", "--port", &p, "--debug-crash-at", step])
            .arg("--root")
            .arg(&root)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_listening(port);
        let copy = [
            "copy",
            "--no-auth",
            "--port",
            &p,
            "--block-size",
            "1M",
            s,
            "127.0.0.1:f",
        ];
        assert!(
            !hsxfer(&copy).status.success(),
            "{step_dir}: the server died"
        );
        let status = server.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "{step_dir}: killed at the step");
        let target = root.join("f");
        if target.exists() {
            assert_eq!(
                sha256(&target),
                want,
                "{step_dir}: only a whole file takes the name"
            );
        }
        let port = free_port();
        let p = port.to_string();
        let _server = serve(&root, port);
        let copy = [
            "copy",
            "--no-auth",
            "--port",
            &p,
            "--block-size",
            "1M",
            s,
            "127.0.0.1:f",
        ];
        let out = hsxfer(&copy);
        assert!(
            out.status.success(),
            "{step_dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(sha256(&target), want, "{step_dir}");
        let left: Vec<_> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["f"], "{step_dir}: nothing left beside the file");
    }
}

#[test]
fn a_one_shot_server_announces_itself_serves_one_copy_and_exits_when_its_input_closes() {
    use std::io::{BufRead, BufReader};
    let root = tempfile::tempdir().unwrap();
    let start = || {
        let mut child = Command::new(BIN)
            .args(["serve", "--stdio", "--listen", "127.0.0.1", "--root"])
            .arg(root.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let a = hsxfer::channels::oneshot::Announcement::parse(&line)
            .unwrap()
            .unwrap_or_else(|| panic!("not an announcement: {line}"));
        (child, a)
    };
    let exits_soon = |child: &mut std::process::Child, why: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "still running after {why}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // Nobody comes: closing its input ends it.
    let (mut child, _) = start();
    drop(child.stdin.take());
    exits_soon(&mut child, "its input closed");

    // One copy with the announced token, then it ends on its own.
    let (mut child, a) = start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    fs::write(&token, &a.token).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
    let src = dir.path().join("f");
    random_file(&src, 100_000, 9);
    let out = hsxfer(&[
        "copy",
        "--port",
        &a.port.to_string(),
        "--token-file",
        token.to_str().unwrap(),
        src.to_str().unwrap(),
        "127.0.0.1:f",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::read(&src).unwrap(),
        fs::read(root.path().join("f")).unwrap()
    );
    exits_soon(&mut child, "its copy");
}

#[test]
fn the_help_names_every_bundled_congestion_control() {
    let names: Vec<&str> = hsxfer::tuning::bundled::BUNDLED
        .iter()
        .map(|b| b.name)
        .collect();
    let load = String::from_utf8(hsxfer(&["cc", "load", "--help"]).stdout).unwrap();
    assert!(
        load.contains(&format!("Names ({})", names.join(" "))),
        "{load}"
    );
    let top = String::from_utf8(hsxfer(&["--help"]).stdout).unwrap();
    assert!(top.contains(&format!("({})", names.join(", "))), "{top}");
}

/// A copy that cannot connect leaves the last run's `--trace` file as it was and makes no
/// new one; a copy that runs replaces it with its own trace, and writes one to a device.
#[test]
fn a_copy_that_never_connects_keeps_the_last_trace() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    random_file(&src, 8 << 20, 3);
    let copy = |port: u16, trace: &Path, dest: &str| {
        let port = port.to_string();
        let rest = [trace.to_str().unwrap(), src.to_str().unwrap(), dest];
        hsxfer(
            &[
                &["copy", "--no-auth", "--port", &port, "--trace"],
                &rest[..],
            ]
            .concat(),
        )
    };
    let (kept, fresh) = (dir.path().join("kept.csv"), dir.path().join("fresh.csv"));
    fs::write(&kept, "last run's trace\n").unwrap();
    let closed = free_port();
    assert!(!copy(closed, &kept, "127.0.0.1:x").status.success());
    assert!(!copy(closed, &fresh, "127.0.0.1:x").status.success());
    assert_eq!(fs::read_to_string(&kept).unwrap(), "last run's trace\n");
    assert!(
        !fresh.exists(),
        "a trace file was left by a copy that never ran"
    );
    let root = dir.path().join("root");
    fs::create_dir(&root).unwrap();
    let port = free_port();
    let _server = serve(&root, port);
    let out = copy(port, &kept, "127.0.0.1:x");
    assert!(out.status.success(), "{out:?}");
    // A trace to a device is written, not truncated first (which a device refuses).
    let out = copy(port, Path::new("/dev/null"), "127.0.0.1:y");
    assert!(out.status.success(), "{out:?}");
    let text = fs::read_to_string(&kept).unwrap();
    assert!(text.starts_with("t_s,channel,cwnd,"), "{text}");
    assert!(text.lines().count() > 1, "{text}");
}
