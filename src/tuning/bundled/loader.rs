//! Registering a bundled congestion control with the kernel, keeping it (pinned) after this
//! process exits, and removing it again.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libbpf_rs::{Link, MapCore, Object, ObjectBuilder};

use super::{find, inspect, pin_path, BundledCc, BundledError, PIN_DIR};
use crate::transport::cc::{privileged, CcCatalog};

/// `statfs` magic of the BPF file system.
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// A bundled congestion control registered by this process. Dropping it unregisters the
/// congestion control unless it was pinned; sockets already using it keep it until they close.
pub struct Registration {
    name: &'static str,
    link: Link,
    _object: Object,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.name)
            .finish()
    }
}

impl Registration {
    /// Loads `cc`'s program (the kernel verifies it and relocates it against its BTF) and
    /// registers it under its name. Refuses if a congestion control of that name exists.
    pub fn load(cc: &'static BundledCc) -> Result<Registration, BundledError> {
        let bpf = |what: &'static str| {
            move |source| BundledError::Bpf {
                what,
                name: cc.name.to_string(),
                source,
            }
        };
        if let Ok(cat) = CcCatalog::read() {
            if cat.available.iter().any(|a| a == cc.name) {
                return Err(BundledError::AlreadyRegistered(
                    cc.name.to_string(),
                    inspect::origin(cc.name).describe(),
                ));
            }
        }
        if !privileged() {
            return Err(BundledError::NotPermitted(cc.name.to_string()));
        }
        let open = ObjectBuilder::default()
            .open_memory(cc.object())
            .map_err(bpf("opening the BPF object of"))?;
        let mut object = open
            .load()
            .map_err(bpf("loading (verifying) the BPF program of"))?;
        let link = {
            let mut ops = object
                .maps_mut()
                .find(|m| m.name() == cc.name)
                .ok_or_else(|| BundledError::Unknown(cc.name.to_string()))?;
            ops.attach_struct_ops()
                .map_err(bpf("registering (struct_ops attach)"))?
        };
        Ok(Registration {
            name: cc.name,
            link,
            _object: object,
        })
    }

    /// The congestion control's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Pins the registration under [`PIN_DIR`] so it stays after this process exits (until
    /// `hsxfer cc unload`), mounting the BPF file system there if needed.
    pub fn pin(&mut self) -> Result<PathBuf, BundledError> {
        mount_bpffs()?;
        let path = pin_path(self.name);
        self.link.pin(&path).map_err(|source| BundledError::Bpf {
            what: "pinning",
            name: self.name.to_string(),
            source,
        })?;
        Ok(path)
    }
}

/// Removes the pin of `name`; true if there was one. The congestion control stays registered
/// while another holder (a running `hsxfer cc load`, a server) keeps it.
pub fn unpin(name: &str) -> Result<bool, BundledError> {
    match std::fs::remove_file(pin_path(name)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(BundledError::Io {
            context: format!("removing {}", pin_path(name).display()),
            source,
        }),
    }
}

/// Unregisters `name` whoever holds it, by detaching every struct_ops link of that name;
/// returns how many were detached. Sockets using it keep it until they close.
pub fn detach(name: &str) -> Result<usize, BundledError> {
    let mut n = 0;
    for id in inspect::struct_ops_links(name) {
        // SAFETY: plain syscall wrappers on an id and the fd they return, closed below.
        let fd = unsafe { libbpf_rs::libbpf_sys::bpf_link_get_fd_by_id(id) };
        if fd < 0 {
            continue;
        }
        let rc = unsafe { libbpf_rs::libbpf_sys::bpf_link_detach(fd) };
        let err = std::io::Error::last_os_error();
        unsafe { libc::close(fd) };
        if rc < 0 {
            return Err(BundledError::Io {
                context: format!("detaching struct_ops link {id} of '{name}'"),
                source: err,
            });
        }
        n += 1;
    }
    Ok(n)
}

/// Registrations this process made on demand; they live as long as the process.
static HELD: Mutex<Vec<Registration>> = Mutex::new(Vec::new());

/// Makes sure every bundled congestion control among `names` is registered, registering
/// the missing ones for the life of this process if it may. Names that are not bundled, or
/// already registered (by the kernel or anyone), are left alone. Returns what it registered.
pub fn ensure_registered(names: &[String]) -> Result<Vec<&'static str>, BundledError> {
    let cat = CcCatalog::read().map_err(|source| BundledError::Io {
        context: "reading the available congestion controls".into(),
        source,
    })?;
    let mut done = Vec::new();
    for name in names {
        let Some(cc) = find(name) else { continue };
        if cat.available.iter().any(|a| a == name) || done.contains(&cc.name) {
            continue;
        }
        match Registration::load(cc) {
            Ok(reg) => {
                tracing::info!(cc = cc.name, "registered bundled congestion control");
                HELD.lock().unwrap_or_else(|e| e.into_inner()).push(reg);
                done.push(cc.name);
            }
            // Another process registered it meanwhile: that is what we wanted.
            Err(BundledError::AlreadyRegistered(..)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Mounts the BPF file system on /sys/fs/bpf unless it is there, and creates [`PIN_DIR`].
fn mount_bpffs() -> Result<(), BundledError> {
    let io = |context: &str| {
        let context = context.to_string();
        move |source| BundledError::Io { context, source }
    };
    let root = Path::new("/sys/fs/bpf");
    let is_bpffs = nix::sys::statfs::statfs(root)
        .map(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
        .unwrap_or(false);
    if !is_bpffs {
        nix::mount::mount(
            Some("bpf"),
            root,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
        .map_err(io("mounting the BPF file system on /sys/fs/bpf"))?;
    }
    std::fs::create_dir_all(PIN_DIR).map_err(io(&format!("creating {PIN_DIR}")))
}
