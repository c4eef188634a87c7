//! Which way traffic leaves this host: the local address the kernel picks toward a peer
//! (found without sending anything), the interface holding an address, and the interface of
//! the default route. Used by `hsxfer doctor` to check the interface a transfer would use.
//! Also the route toward a peer as `ip route get` shows it, for errors that a route causes,
//! and the other paths toward a peer that a host with several uplinks has (for MPTCP).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};

use nix::net::if_::InterfaceFlags;

/// The discard port: any port works, since nothing is sent.
const DISCARD_PORT: u16 = 9;

/// The local address the kernel would use toward `host`. Connecting a UDP socket only
/// selects a route and a source address; no packet leaves the host.
pub fn source_addr(host: IpAddr) -> io::Result<IpAddr> {
    let any: IpAddr = match host {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind((any, 0))?;
    sock.connect((host, DISCARD_PORT))?;
    Ok(sock.local_addr()?.ip())
}

/// The name of the interface that holds `addr`, if any does.
pub fn interface_of(addr: IpAddr) -> io::Result<Option<String>> {
    let found = nix::ifaddrs::getifaddrs()?.find(|i| ip_of(i) == Some(addr));
    Ok(found.map(|i| i.interface_name))
}

/// The IPv4 or IPv6 address of an interface address entry, if it has one.
fn ip_of(i: &nix::ifaddrs::InterfaceAddress) -> Option<IpAddr> {
    let a = i.address.as_ref()?;
    a.as_sockaddr_in()
        .map(|v4| IpAddr::V4(v4.ip()))
        .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
}

/// The link speed of interface `name` in bits/s, if it reports one (virtual devices and
/// links that are down report none, or -1).
pub fn link_speed_bps(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    let mbps: i64 = text.trim().parse().ok()?;
    u64::try_from(mbps)
        .ok()
        .filter(|m| *m > 0)
        .map(|m| m * 1_000_000)
}

/// The names of the interfaces that are up and not loopback, each once, in the kernel's
/// order.
pub fn up_interfaces() -> io::Result<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for i in nix::ifaddrs::getifaddrs()? {
        let up = i.flags.contains(InterfaceFlags::IFF_UP)
            && !i.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        if up && !names.contains(&i.interface_name) {
            names.push(i.interface_name);
        }
    }
    Ok(names)
}

/// The interface of the IPv4 default route (the one with the lowest metric) in the text of
/// `/proc/net/route`.
pub fn default_route_interface(table: &str) -> Option<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            let flags = u16::from_str_radix(f.get(3)?, 16).ok()?;
            let route_up = flags & libc::RTF_UP != 0;
            let default = *f.get(1)? == "00000000" && *f.get(7)? == "00000000";
            let metric: u32 = f.get(6)?.parse().ok()?;
            (route_up && default).then(|| (metric, f[0].to_string()))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, name)| name)
}

/// The interface of this namespace's IPv4 default route, from `/proc/net/route`.
pub fn default_interface() -> io::Result<Option<String>> {
    Ok(default_route_interface(&std::fs::read_to_string(
        "/proc/net/route",
    )?))
}

/// The route toward `addr` as `ip route get ADDR` prints it, on one line (it prints the
/// cached metrics, such as `congctl lock cubic`, on a second one).
pub fn show(addr: IpAddr) -> io::Result<String> {
    let out = std::process::Command::new("ip")
        .args(["route", "get", &addr.to_string()])
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The `congctl [lock] NAME` part of a route's text, if it has one.
pub fn congctl(route: &str) -> Option<String> {
    let words: Vec<&str> = route.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "congctl")?;
    let len = if words.get(at + 1) == Some(&"lock") {
        3
    } else {
        2
    };
    words.get(at..at + len).map(|w| w.join(" "))
}

/// Where traffic toward a peer leaves this host: a source address and its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    /// The source address.
    pub addr: IpAddr,
    /// The interface packets leave through.
    pub dev: String,
}

/// Where traffic toward `to` leaves from `from`, or from the address the kernel picks:
/// `ip -j route get TO [from FROM]`, which follows policy routing (`ip rule`) as packets do.
pub fn egress(to: IpAddr, from: Option<IpAddr>) -> io::Result<Egress> {
    let mut args = vec![
        "-j".to_string(),
        "route".into(),
        "get".into(),
        to.to_string(),
    ];
    if let Some(f) = from {
        args.extend(["from".into(), f.to_string()]);
    }
    let out = std::process::Command::new("ip").args(&args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "no route toward {to}{}: {}",
            from.map(|f| format!(" from {f}")).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    egress_of(&String::from_utf8_lossy(&out.stdout), from)
        .ok_or_else(|| io::Error::other(format!("`ip -j route get {to}` gave no interface")))
}

/// The interface and source address in `ip -j route get`'s answer; `from` when one was given
/// (the answer then names it `from`, otherwise `prefsrc`).
fn egress_of(json: &str, from: Option<IpAddr>) -> Option<Egress> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let route = v.get(0)?;
    let dev = route.get("dev")?.as_str()?.to_string();
    let addr = match from {
        Some(f) => f,
        None => route.get("prefsrc")?.as_str()?.parse().ok()?,
    };
    Some(Egress { addr, dev })
}

/// The addresses of this host that can reach `to`'s family beyond the link: on interfaces
/// that are up, not loopback, not link-local; each once.
pub fn global_addrs(to: IpAddr) -> io::Result<Vec<IpAddr>> {
    let mut found = Vec::new();
    for i in nix::ifaddrs::getifaddrs()? {
        let up = i.flags.contains(InterfaceFlags::IFF_UP)
            && !i.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        let Some(ip) = ip_of(&i).filter(|ip| up && ip.is_ipv4() == to.is_ipv4()) else {
            continue;
        };
        let link_local = match ip {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
        };
        if !link_local && !ip.is_loopback() && !found.contains(&ip) {
            found.push(ip);
        }
    }
    Ok(found)
}

/// The paths toward `to` besides `main` (where the kernel sends by itself): this host's other
/// addresses whose routes toward `to` leave through another interface, as a host with two
/// uplinks and a routing rule per source address has. An address routed out through `main`'s
/// interface adds no path and is left out.
pub fn other_paths(to: IpAddr, main: &Egress) -> io::Result<Vec<Egress>> {
    Ok(global_addrs(to)?
        .into_iter()
        .filter(|a| *a != main.addr)
        .filter_map(|a| egress(to, Some(a)).ok())
        .filter(|e| e.dev != main.dev)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_default_route_with_the_lowest_metric() {
        let table =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            wlan0\t00000000\t010200C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n\
            eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
            eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(default_route_interface(table), Some("eth0".into()));
        let no_default = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
            eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n";
        assert_eq!(default_route_interface(no_default), None);
    }

    #[test]
    fn finds_the_congctl_of_a_route() {
        let locked = "10.2.3.4 dev d0 src 10.1.1.1 uid 0 cache congctl lock cubic";
        assert_eq!(congctl(locked).as_deref(), Some("congctl lock cubic"));
        let plain = "10.3.3.4 via 10.1.1.2 dev d0 src 10.1.1.1 uid 0 cache congctl reno";
        assert_eq!(congctl(plain).as_deref(), Some("congctl reno"));
        assert_eq!(congctl("10.3.3.4 dev d0 src 10.1.1.1 uid 0 cache"), None);
        assert_eq!(congctl("cache congctl lock"), None);
    }

    #[test]
    fn loopback_traffic_leaves_from_lo() {
        let local = source_addr(IpAddr::from([127, 0, 0, 1])).unwrap();
        assert!(local.is_loopback());
        assert_eq!(interface_of(local).unwrap().as_deref(), Some("lo"));
    }

    #[test]
    fn reads_the_interface_and_source_of_a_route() {
        let kernel_pick = r#"[{"dst":"10.9.2.2","gateway":"10.9.1.2","dev":"sa","prefsrc":"10.9.1.1","flags":[],"uid":0,"cache":[]}]"#;
        assert_eq!(
            egress_of(kernel_pick, None),
            Some(Egress {
                addr: "10.9.1.1".parse().unwrap(),
                dev: "sa".into()
            })
        );
        let from = r#"[{"dst":"10.9.2.2","from":"10.9.3.1","gateway":"10.9.3.2","dev":"sb","table":"103","flags":[],"uid":0,"cache":[]}]"#;
        let src: IpAddr = "10.9.3.1".parse().unwrap();
        assert_eq!(egress_of(from, Some(src)).map(|e| e.dev), Some("sb".into()));
        assert_eq!(egress_of("[]", None), None);
        assert_eq!(egress_of("not json", None), None);
    }

    #[test]
    fn loopback_is_no_path_of_its_own() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let main = egress(lo, None).unwrap();
        assert_eq!(main.dev, "lo");
        assert!(!global_addrs(lo).unwrap().iter().any(|a| a.is_loopback()));
        assert!(other_paths(lo, &main)
            .unwrap()
            .iter()
            .all(|e| e.dev != "lo"));
    }
}
