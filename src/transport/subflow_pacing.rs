//! Pacing caps on the subflows of MPTCP connections. The kernel refuses `SO_MAX_PACING_RATE`
//! on an MPTCP socket and a subflow has no file descriptor, so hsxfer attaches a BPF
//! `sock_ops` program (`bpf/mptcp_pacing.bpf.c`) to the root of the cgroup v2 hierarchy. It
//! caps every subflow of a connection at the connection's total cap divided by its current
//! number of subflows, and follows changes of either within an RTT. The program is loaded
//! on first use and stays attached for the life of the process; it needs root.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::Mutex;

use libbpf_rs::{Link, MapCore, MapFlags, Object, ObjectBuilder};

/// The compiled program (CO-RE, relocated at load).
const OBJECT: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/bpf/obj/mptcp_pacing.bpf.o"
));

/// The program attached by this process, and its maps.
struct Pacer {
    object: Object,
    _link: Link,
}

/// Loaded on first use; kept until the process ends.
static PACER: Mutex<Option<Pacer>> = Mutex::new(None);

/// Whether subflows can be paced here: loading and attaching BPF needs root.
pub fn available() -> bool {
    super::cc::privileged()
}

/// Caps the subflows of the MPTCP connection `sock` at `total` bytes/s together, each at its
/// share; [`super::tcp::PACING_UNCAPPED`] turns pacing on without a cap.
pub fn set_total(sock: &impl AsFd, total: u64) -> io::Result<()> {
    let mut pacer = PACER.lock().unwrap_or_else(|e| e.into_inner());
    if pacer.is_none() {
        *pacer = Some(Pacer::attach()?);
    }
    let pacer = pacer.as_ref().expect("attached above");
    let map = pacer
        .object
        .maps()
        .find(|m| m.name() == "conn_pace")
        .ok_or_else(|| io::Error::other("the MPTCP pacer has no map conn_pace"))?;
    let fd = sock.as_fd().as_raw_fd();
    map.update(&fd.to_ne_bytes(), &total.to_ne_bytes(), MapFlags::ANY)
        .map_err(|e| io::Error::other(format!("storing the MPTCP connection's pacing cap: {e}")))
}

impl Pacer {
    fn attach() -> io::Result<Pacer> {
        if !super::cc::privileged() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "pacing MPTCP subflows needs root: hsxfer caps each subflow with a BPF program",
            ));
        }
        let root = match mounted_cgroup2() {
            Some(root) => root,
            None => mount_cgroup2()?,
        };
        let bpf = |what: &str| {
            let what = what.to_string();
            move |e: libbpf_rs::Error| io::Error::other(format!("{what} the MPTCP pacer: {e}"))
        };
        let object = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(bpf("opening"))?
            .load()
            .map_err(bpf("loading (verifying)"))?;
        let cgroup = std::fs::File::open(&root)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", root.display())))?;
        let link = object
            .progs_mut()
            .find(|p| p.name() == "pace_subflows")
            .ok_or_else(|| io::Error::other("the MPTCP pacer has no program pace_subflows"))?
            .attach_cgroup(cgroup.as_raw_fd())
            .map_err(bpf(&format!("attaching to {}", root.display())))?;
        Ok(Pacer {
            object,
            _link: link,
        })
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on hybrid hosts), from /proc/self/mountinfo.
fn mounted_cgroup2() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER"
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount))
    })
}

/// Where hsxfer mounts the cgroup v2 hierarchy when none is visible: under `ip netns exec`,
/// which mounts a fresh /sys in a mount namespace of its own, so the mount stays there.
const CGROUP2_MOUNT: &str = "/run/hsxfer/cgroup2";

fn mount_cgroup2() -> io::Result<PathBuf> {
    let at = PathBuf::from(CGROUP2_MOUNT);
    std::fs::create_dir_all(&at)?;
    nix::mount::mount(
        Some("cgroup2"),
        &at,
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from_raw_os_error(e as i32).kind(),
            format!(
                "mounting the cgroup v2 hierarchy on {CGROUP2_MOUNT} to pace MPTCP subflows: {e}"
            ),
        )
    })?;
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::mptcp::subflow_info;
    use socket2::{Domain, Protocol, Socket, Type};
    use std::io::{Read, Write};

    /// The cap a subflow has once `bytes` more went each way over `a` and `b`.
    fn cap_after_traffic(a: &mut Socket, b: &mut Socket, bytes: usize) -> Option<u64> {
        let data = vec![1u8; bytes];
        let mut back = vec![0u8; bytes];
        a.write_all(&data).unwrap();
        b.read_exact(&mut back).unwrap();
        b.write_all(&data).unwrap();
        a.read_exact(&mut back).unwrap();
        subflow_info(a).unwrap()[0].max_pacing_rate
    }

    /// A cap stored before the connection exists reaches its subflow when it is established;
    /// a cap changed later reaches it on the next ACKs (what a server, which accepts the
    /// connection after its first subflow came up, relies on).
    #[test]
    fn an_mptcp_connections_cap_reaches_its_subflow_before_and_after_connect() {
        assert!(
            available(),
            "pacing MPTCP subflows needs root: run the tests as root"
        );
        let mptcp = || Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::MPTCP)).unwrap();
        let l = mptcp();
        l.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        l.listen(1).unwrap();
        let mut c = mptcp();
        crate::transport::set_max_pacing_rate(&c, 5_000_000).unwrap();
        c.connect(&l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(cap_after_traffic(&mut c, &mut s, 1000), Some(5_000_000));
        crate::transport::set_max_pacing_rate(&c, 7_000_000).unwrap();
        assert_eq!(cap_after_traffic(&mut c, &mut s, 1000), Some(7_000_000));
        crate::transport::set_max_pacing_rate(&s, 3_000_000).unwrap();
        assert_eq!(cap_after_traffic(&mut s, &mut c, 1000), Some(3_000_000));
    }

    #[test]
    fn the_cgroup2_hierarchy_is_found() {
        // Every host hsxfer supports mounts one (systemd does, in either layout).
        let root = mounted_cgroup2().expect("no cgroup2 mount in /proc/self/mountinfo");
        assert!(root.join("cgroup.procs").exists(), "{}", root.display());
    }
}
