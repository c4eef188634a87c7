//! `hsxfer doctor` as a user runs it: one JSON document whose findings carry the documented
//! fields, and, in a throwaway network namespace with window scaling off, a FAIL line and
//! exit code 1.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_hsxfer");

#[test]
fn json_is_one_document_with_the_documented_fields() {
    let out = Command::new(BIN)
        .args(["doctor", "--json", "--rate", "1G", "--rtt", "100ms"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).expect("one JSON document");
    assert_eq!(doc["type"], "doctor");
    assert_eq!(doc["schema"], 1);
    let findings = doc["findings"].as_array().expect("findings array");
    for f in findings {
        assert!(f["check"].is_string(), "{f}");
        assert!(
            ["ok", "warn", "fail", "info"].contains(&f["status"].as_str().unwrap()),
            "{f}"
        );
        assert!(f["summary"].is_string(), "{f}");
        assert!(f["detail"].is_string() || f["detail"].is_null(), "{f}");
        assert!(
            f["fix"].as_array().unwrap().iter().all(|c| c.is_string()),
            "{f}"
        );
    }
    let buffers = findings
        .iter()
        .find(|f| f["check"] == "buffers.receive")
        .expect("a buffers.receive finding");
    let summary = buffers["summary"].as_str().unwrap();
    assert!(summary.contains("1000 Mbit/s × 100 ms"), "{summary}");
    let failed = findings.iter().any(|f| f["status"] == "fail");
    assert_eq!(out.status.code(), Some(if failed { 1 } else { 0 }));

    // Without a rate, the advice names the flags, as the text output does.
    let out = Command::new(BIN)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("--rate"), "{text}");
    assert!(!text.contains("`rate`"), "{text}");
}

/// A network namespace, deleted when dropped (also when the test fails).
struct Netns(String);

impl Netns {
    fn add() -> Netns {
        let name = format!("hxdoc{}", std::process::id());
        let ok = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(ok.unwrap().success(), "ip netns add {name} failed");
        Netns(name)
    }

    fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

#[test]
fn window_scaling_off_fails_in_a_namespace() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: creating a network namespace needs root");
        return;
    }
    let ns = Netns::add();
    let set = ns.exec(&["sysctl", "-w", "net.ipv4.tcp_window_scaling=0"]);
    assert!(set.status.success(), "{set:?}");
    let out = ns.exec(&[BIN, "doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL tcp.window_scaling:")),
        "{text}"
    );
    // Traffic to an address of this host leaves by lo, not by the interface that holds the
    // address, whose MTU and queue were judged.
    for cmd in [
        "ip link set lo up",
        "ip link add hxd0 type veth peer name hxd1",
        "ip addr add 192.0.2.2/24 dev hxd0",
        "ip link set hxd0 up",
    ] {
        let out = ns.exec(&cmd.split(' ').collect::<Vec<_>>());
        assert!(out.status.success(), "{cmd}: {out:?}");
    }
    let out = ns.exec(&[BIN, "doctor", "192.0.2.2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let route = text
        .lines()
        .find(|l| l.starts_with("INFO route.interface:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(route.ends_with("leaves from 192.0.2.2 on lo"), "{route}");
}
