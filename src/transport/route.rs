//! Which way traffic leaves this host: the local address the kernel picks toward a peer
//! (found without sending anything), the interface holding an address, and the interface of
//! the default route. Used by `hsxfer doctor` to check the interface a transfer would use.
//! Also the route toward a peer as `ip route get` shows it, for errors that a route causes.

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
    let found = nix::ifaddrs::getifaddrs()?.find(|i| {
        let a = i.address.as_ref();
        let ip = a
            .and_then(|s| s.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())))
            .or_else(|| a.and_then(|s| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))));
        ip == Some(addr)
    });
    Ok(found.map(|i| i.interface_name))
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
}
