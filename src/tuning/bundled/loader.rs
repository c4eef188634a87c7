//! Registering a bundled congestion control with the kernel, keeping it (pinned) after this
//! process exits, and removing it again.

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libbpf_rs::{Link, MapCore, Object, ObjectBuilder};

use super::{find, inspect, ops_name, pin_path, BundledCc, BundledError, PIN_DIR};
use crate::transport::cc::{privileged, CcCatalog};

/// `statfs` magic of the BPF file system.
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// A bundled congestion control registered by this process. Dropping it unregisters the
/// congestion control unless it was pinned; sockets already using it keep it until they close.
pub struct Registration {
    cc: &'static BundledCc,
    link: Link,
    object: Object,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.cc.name)
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
                .find(|m| m.name() == cc.prefix)
                .ok_or_else(|| BundledError::Unknown(cc.name.to_string()))?;
            ops.attach_struct_ops()
                .map_err(bpf("registering (struct_ops attach)"))?
        };
        Ok(Registration { cc, link, object })
    }

    /// The congestion control's name.
    pub fn name(&self) -> &'static str {
        self.cc.name
    }

    /// Pins the registration under [`PIN_DIR`] so it stays after this process exits (until
    /// `hsxfer cc unload`), mounting the BPF file system there if needed, and beside it the
    /// maps users without root need ([`BundledCc::shared_maps`]), with their file modes.
    pub fn pin(&mut self) -> Result<Pinned, BundledError> {
        let opened = mount_bpffs()?;
        let bpf = |what: &'static str, name: &str| {
            let name = name.to_string();
            move |source| BundledError::Bpf { what, name, source }
        };
        let path = pin_path(self.cc.name);
        self.link.pin(&path).map_err(bpf("pinning", self.cc.name))?;
        for shared in self.cc.shared_maps() {
            let map_path = pin_path(&shared.name);
            // A pin left by an earlier registration that `cc unload` did not remove.
            remove_pin(&map_path)?;
            let mut map = self
                .object
                .maps_mut()
                .find(|m| m.name() == shared.name.as_str())
                .ok_or_else(|| BundledError::Unknown(shared.name.to_string()))?;
            map.pin(&map_path)
                .map_err(bpf("pinning a map of", self.cc.name))?;
            std::fs::set_permissions(&map_path, Permissions::from_mode(shared.mode())).map_err(
                |source| BundledError::Io {
                    context: format!("setting the mode of {}", map_path.display()),
                    source,
                },
            )?;
        }
        Ok(Pinned {
            path,
            opened_bpffs: opened,
        })
    }
}

/// Where [`Registration::pin`] pinned a registration.
#[derive(Debug)]
pub struct Pinned {
    /// The registration's pin.
    pub path: PathBuf,
    /// Whether /sys/fs/bpf had to be opened for others to pass through (`o+x`), so that users
    /// without root reach the shared maps. Pins keep their own modes (libbpf's 0600).
    pub opened_bpffs: bool,
}

/// Removes the pin at `path`; false if there was none.
fn remove_pin(path: &Path) -> Result<bool, BundledError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(BundledError::Io {
            context: format!("removing {}", path.display()),
            source,
        }),
    }
}

/// Removes the pin of `name` and of its shared maps; true if the registration was pinned.
/// The congestion control stays registered while another holder (a running `hsxfer cc
/// load`, a server) keeps it.
pub fn unpin(name: &str) -> Result<bool, BundledError> {
    for shared in find(name).map(BundledCc::shared_maps).unwrap_or_default() {
        remove_pin(&pin_path(&shared.name))?;
    }
    remove_pin(&pin_path(name))
}

/// Unregisters `name` whoever holds it, by detaching every struct_ops link of that name;
/// returns how many were detached. Sockets using it keep it until they close.
pub fn detach(name: &str) -> Result<usize, BundledError> {
    let mut n = 0;
    for id in inspect::struct_ops_links(ops_name(name)) {
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

/// Mounts the BPF file system on /sys/fs/bpf unless it is there, lets others pass through it
/// (systemd mounts it 0700), and creates [`PIN_DIR`] (0755). True if the mode was changed.
fn mount_bpffs() -> Result<bool, BundledError> {
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
    let mode = std::fs::metadata(root)
        .map_err(io("reading the mode of /sys/fs/bpf"))?
        .permissions()
        .mode();
    let opened = mode & 0o001 == 0;
    if opened {
        std::fs::set_permissions(root, Permissions::from_mode(mode | 0o001))
            .map_err(io("letting others pass through /sys/fs/bpf"))?;
    }
    std::fs::create_dir_all(PIN_DIR).map_err(io(&format!("creating {PIN_DIR}")))?;
    std::fs::set_permissions(PIN_DIR, Permissions::from_mode(0o755))
        .map_err(io(&format!("setting the mode of {PIN_DIR}")))?;
    Ok(opened)
}
