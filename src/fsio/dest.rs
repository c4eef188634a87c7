//! Where received entries go, with `cp`/`scp` semantics:
//!
//! - `DST` is an existing directory (or several sources were given): each source lands
//!   inside it, under its own name.
//! - otherwise the single source is written *as* `DST` (a new name, or a file replaced).
//! - `DST` is an existing device or FIFO (e.g. `/dev/null`, a disk), or names one of this
//!   process's open descriptors (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`): the single
//!   file's bytes are written straight into it, with no temporary name. A server writes only
//!   files and directories: a device or FIFO under its root is refused, never replaced.
//! - `DST` ends in `/`: it must be a directory (`cp` says the same). A missing one is made
//!   when its parent exists (as `rsync` does), so `copy -r data HOST:incoming/` lands in
//!   `incoming/data` on a fresh server too; it is made with the first entry received, so a
//!   transfer refused or failed before that leaves nothing behind.

use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::at;
use super::partial::{is_reserved_name, sibling_name, JOURNAL_SUFFIX, PART_SUFFIX};
use super::root::{RootError, Scope};
use crate::channels::manifest::check_relative;

/// Why entries cannot be placed at the destination.
#[derive(Debug, thiserror::Error)]
pub enum DestError {
    /// Path refused by confinement.
    #[error(transparent)]
    Root(#[from] RootError),
    /// Several sources but the target is not a directory.
    #[error("target '{0}' is not a directory")]
    NotADirectory(String),
    /// The parent of a new target does not exist.
    #[error("cannot create '{0}': no such directory")]
    NoParent(String),
    /// A directory would replace a file, or a file a directory.
    #[error("cannot overwrite '{0}' with an entry of another kind")]
    KindClash(String),
    /// A pulled entry outside what the pull asked for.
    #[error("the server sent '{0}', which is not under what was asked for: refusing it (the server may be compromised)")]
    Unrequested(String),
    /// A name hsxfer uses for its own temporary files.
    #[error("'{0}' is refused: names ending in .hsxfer-part or .hsxfer-journal are hsxfer's temporary files")]
    Reserved(String),
    /// A pulled file's target, or its part file, appeared after the pull had found the
    /// destination empty and let the server send before planning.
    #[error("'{0}' appeared at the destination while the pull was starting (is another copy writing there?): run the copy again")]
    AppearedMeanwhile(String),
    /// A device or FIFO under a server's root.
    #[error("'{0}' is a device or FIFO: a server writes only files and directories under its root, and does not replace this one either: copy to another name")]
    DeviceOnServer(String),
    /// A device, FIFO or descriptor target takes exactly one file.
    #[error("'{0}' is a device, FIFO or open descriptor: it takes exactly one file")]
    StreamNeedsOneFile(String),
    /// A directory of the tree could not be made (a read-only parent, copied as such by an
    /// earlier copy, refuses it to anyone but root).
    #[error("cannot create directory '{path}': {source}")]
    MakeDir {
        /// The directory.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// I/O error.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DestError + '_ {
    move |source| DestError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// How manifest paths map onto the destination.
#[derive(Debug, Clone)]
pub enum Layout {
    /// Entries keep their paths inside this directory.
    Into(PathBuf),
    /// The top-level source is renamed to `name` inside `parent`.
    Rename {
        /// Existing parent directory.
        parent: PathBuf,
        /// New name of the top-level source.
        name: String,
    },
    /// Bytes go straight into this device, FIFO or descriptor.
    Stream(PathBuf),
}

/// A resolved destination.
#[derive(Debug, Clone)]
pub struct Destination {
    scope: Scope,
    /// How paths map.
    pub layout: Layout,
    /// The top-level names a pulling client asked for, when it did.
    requested: Option<Requested>,
    /// `DST` ended in `/` and its directory (the layout's) is to be made with the first
    /// entry.
    missing: bool,
}

/// Maps manifest entries to paths as [`Destination::target`] does, checking a parent
/// directory against confinement only when it differs from the previous entry's. The check
/// resolves every component of the path (a `readlink` each): 9.5 % of a server's cycles while
/// it received 10,000 small files. Files are still opened beneath the root
/// (`RESOLVE_BENEATH`), so a skipped check never lets a write out.
pub struct Targets<'a> {
    dest: &'a Destination,
    checked: Option<PathBuf>,
    /// The missing directory of the destination has been made.
    made: bool,
}

impl<'a> Targets<'a> {
    /// No parent checked yet.
    pub fn new(dest: &'a Destination) -> Self {
        Targets {
            dest,
            checked: None,
            made: false,
        }
    }

    /// The filesystem path for a manifest entry, checked against confinement; the first
    /// makes the destination's missing directory.
    pub fn target(&mut self, entry_path: &str) -> Result<PathBuf, DestError> {
        let p = self.dest.unchecked_target(entry_path)?;
        // After the entry's own checks: one refused leaves nothing made.
        if let (true, Layout::Into(dir), false) = (self.dest.missing, &self.dest.layout, self.made)
        {
            self.dest.make_dir(dir)?;
            self.made = true;
        }
        if matches!(self.dest.layout, Layout::Stream(_)) {
            return Ok(p);
        }
        let parent = p.parent().unwrap_or(&p);
        if self.checked.as_deref() != Some(parent) {
            self.dest.scope.check_inside(parent)?;
            self.checked = Some(parent.to_path_buf());
        }
        Ok(p)
    }
}

/// What a pull asked for: a server may send entries under these top-level names only, so a
/// hostile one cannot write `.ssh/authorized_keys` into a pull of `data` into the home
/// directory (the scp CVE-2019-6111 class).
#[derive(Debug, Clone)]
struct Requested {
    /// Last component of each requested source.
    names: Vec<String>,
    /// A source names the server's root, whose name only the server knows: any top-level
    /// name that is not hidden is allowed for it.
    root: bool,
}

impl Requested {
    fn allows(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name) || (self.root && !name.starts_with('.'))
    }
}

impl Destination {
    /// Resolves `dst` for `sources` top-level sources within `scope`.
    pub fn resolve(scope: Scope, dst: &str, sources: u32) -> Result<Self, DestError> {
        let p = scope.resolve(dst)?;
        let local = matches!(scope, Scope::Local);
        // A confined path has lost its trailing slash (`check_relative`), a local one has not.
        let wants_dir = dst.ends_with('/');
        let mut missing = false;
        let layout = match fs::metadata(&p) {
            Ok(m) if m.is_dir() => Layout::Into(p),
            Ok(_) if wants_dir => return Err(DestError::NotADirectory(dst.into())),
            Ok(m) if is_device(&m) && !local => return Err(DestError::DeviceOnServer(dst.into())),
            Ok(m) if is_device(&m) || (local && names_a_descriptor(&p)) => {
                if sources != 1 {
                    return Err(DestError::StreamNeedsOneFile(dst.into()));
                }
                Layout::Stream(p)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && wants_dir => {
                check_parent(&scope, &p, dst)?;
                missing = true;
                Layout::Into(p)
            }
            Ok(_) | Err(_) if sources > 1 => return Err(DestError::NotADirectory(dst.into())),
            Ok(_) => rename_layout(&p, dst)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => rename_layout(&p, dst)?,
            Err(e) if wants_dir && e.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(DestError::NotADirectory(dst.into()))
            }
            Err(e) => return Err(io_err(&p)(e)),
        };
        Ok(Destination {
            scope,
            layout,
            requested: None,
            missing,
        })
    }

    /// Accepts only entries under the top-level names that pulling `sources` can produce.
    pub fn only_requested(mut self, sources: &[String]) -> Self {
        let mut r = Requested {
            names: Vec::new(),
            root: false,
        };
        for s in sources {
            match check_relative(s).ok().and_then(|c| c.last().copied()) {
                Some(name) => r.names.push(name.to_string()),
                None => r.root = true,
            }
        }
        self.requested = Some(r);
        self
    }

    /// True when nothing here could make a pulled file skipped or resumed: no top-level
    /// target exists, nor a part file or journal beside one. A pull then lets the server
    /// send its first files before their plans. A stream holds nothing; a directory that
    /// exists never counts as empty for a pull of the server's root, whose top-level names
    /// only the server knows.
    pub fn holds_nothing(&self) -> bool {
        let vacant = |dir: &Path, name: &str| {
            let names = [
                name.to_string(),
                sibling_name(name, PART_SUFFIX),
                sibling_name(name, JOURNAL_SUFFIX),
            ];
            names.iter().all(|n| {
                matches!(fs::symlink_metadata(dir.join(n)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound)
            })
        };
        match (&self.layout, &self.requested) {
            (Layout::Stream(_), _) => true,
            (Layout::Rename { parent, name }, _) => vacant(parent, name),
            (Layout::Into(dir), Some(r)) if !r.root => r.names.iter().all(|n| vacant(dir, n)),
            (Layout::Into(_), _) => false,
        }
    }

    /// The filesystem path for a manifest entry, checked against confinement.
    pub fn target(&self, entry_path: &str) -> Result<PathBuf, DestError> {
        Targets::new(self).target(entry_path)
    }

    /// The filesystem path for a manifest entry, its parent not yet checked.
    fn unchecked_target(&self, entry_path: &str) -> Result<PathBuf, DestError> {
        let comps = check_relative(entry_path).map_err(RootError::from)?;
        let Some((_, rest)) = comps.split_first() else {
            return Err(RootError::from(crate::channels::manifest::PathError::Empty).into());
        };
        if comps.iter().any(|c| is_reserved_name(c)) {
            return Err(DestError::Reserved(entry_path.into()));
        }
        if let (Some(r), Layout::Into(_)) = (&self.requested, &self.layout) {
            if !r.allows(comps[0]) {
                return Err(DestError::Unrequested(entry_path.into()));
            }
        }
        let mut p = match &self.layout {
            Layout::Into(d) => d.join(comps[0]),
            Layout::Rename { parent, name } => parent.join(name),
            Layout::Stream(p) => return Ok(p.clone()),
        };
        p.extend(rest);
        Ok(p)
    }

    /// Creates directory `path` if missing (mode is applied later, after its contents), in
    /// its parent opened through the scope.
    pub fn make_dir(&self, path: &Path) -> Result<(), DestError> {
        if matches!(self.layout, Layout::Stream(_)) {
            return Err(DestError::StreamNeedsOneFile(path.display().to_string()));
        }
        let Some((parent, name)) = at::split(path) else {
            return Err(DestError::KindClash(path.display().to_string()));
        };
        let dir = self.scope.open_dir(parent, true).map_err(io_err(path))?;
        match at::stat(&dir, name).map_err(io_err(path))? {
            Some(m) if at::is_dir(&m) => Ok(()),
            Some(m) if at::is_symlink(&m) && path.is_dir() => {
                self.scope.check_inside(path)?;
                Ok(())
            }
            Some(_) => Err(DestError::KindClash(path.display().to_string())),
            None => at::mkdir(&dir, name).map_err(|source| DestError::MakeDir {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// The scope paths are confined to.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
}

/// True for a device or FIFO: what is written there goes into it, and it is never replaced.
/// A block device (a disk, a partition) is written at the blocks' offsets, as `dd` would.
fn is_device(m: &fs::Metadata) -> bool {
    let t = m.file_type();
    t.is_char_device() || t.is_block_device() || t.is_fifo()
}

/// True for a path that leads, through symbolic links, to one of this process's open
/// descriptors (`/dev/stdout` is a link to `/proc/self/fd/1`). Writing there writes to what
/// the descriptor is open on (`> out.bin`); putting a file in its place instead would
/// replace the link itself.
fn names_a_descriptor(p: &Path) -> bool {
    super::descriptor::named(p).is_some()
}

/// Checks that the parent of `p`, the missing last directory of a destination `dst` ending
/// in `/`, opens through `scope` (beneath a server's root), so that
/// [`Destination::make_dir`] can make `p` there; a parent that is missing too is refused,
/// not made.
fn check_parent(scope: &Scope, p: &Path, dst: &str) -> Result<(), DestError> {
    let Some((parent, _)) = at::split(p) else {
        return Err(DestError::NoParent(dst.into()));
    };
    match scope.open_dir(parent, true) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
            Err(DestError::NoParent(dst.into()))
        }
        Err(e) => Err(io_err(p)(e)),
    }
}

fn rename_layout(p: &Path, dst: &str) -> Result<Layout, DestError> {
    let parent = match p.parent() {
        Some(x) if x.as_os_str().is_empty() => PathBuf::from("."),
        Some(x) => x.to_path_buf(),
        None => return Err(DestError::NoParent(dst.into())),
    };
    if !parent.is_dir() {
        return Err(DestError::NoParent(dst.into()));
    }
    let name = p
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| DestError::NoParent(dst.into()))?;
    Ok(Layout::Rename {
        parent,
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `dir` refuse new entries even to root (`chattr +i`) for as long as it lives.
    struct Immutable<'a>(&'a Path);

    impl Drop for Immutable<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(self.0)
                .status();
        }
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_named_as_one() {
        let t = tempfile::tempdir().unwrap();
        let ro = t.path().join("ro");
        fs::create_dir(&ro).unwrap();
        // Read-only, as a 0555 directory an earlier copy made is to anyone but root.
        let _immutable = if nix::unistd::geteuid().is_root() {
            let set = std::process::Command::new("chattr")
                .arg("+i")
                .arg(&ro)
                .status();
            assert!(set.unwrap().success(), "chattr +i {}", ro.display());
            Some(Immutable(&ro))
        } else {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
            None
        };
        let s = Scope::confined(t.path()).unwrap();
        let d = Destination::resolve(s, "ro", 1).unwrap();
        let e = d.make_dir(&ro.join("sub")).unwrap_err().to_string();
        assert!(e.starts_with("cannot create directory '"), "{e}");
        assert!(
            e.contains("ro/sub") && (e.contains("not permitted") || e.contains("denied")),
            "{e}"
        );
    }

    #[test]
    fn cp_semantics() {
        let t = tempfile::tempdir().unwrap();
        let s = Scope::confined(t.path()).unwrap();
        fs::create_dir(t.path().join("dir")).unwrap();
        fs::write(t.path().join("file"), b"x").unwrap();
        let into = Destination::resolve(s.clone(), "dir", 1).unwrap();
        assert!(into.target("src/a").unwrap().ends_with("dir/src/a"));
        let renamed = Destination::resolve(s.clone(), "new", 1).unwrap();
        assert!(renamed.target("src/a").unwrap().ends_with("new/a"));
        let replace = Destination::resolve(s.clone(), "file", 1).unwrap();
        assert!(replace.target("src").unwrap().ends_with("file"));
        assert!(matches!(
            Destination::resolve(s.clone(), "file", 2),
            Err(DestError::NotADirectory(_))
        ));
        assert!(matches!(
            Destination::resolve(s.clone(), "no/such/x", 1),
            Err(DestError::NoParent(_))
        ));
        assert!(into.target("../x").is_err());
        assert!(matches!(
            into.target("src/.a.hsxfer-part"),
            Err(DestError::Reserved(_))
        ));
        let pulled = into.clone().only_requested(&["x/src/".into(), "y".into()]);
        assert!(pulled.target("src/a").is_ok() && pulled.target("y").is_ok());
        assert!(matches!(
            pulled.target(".ssh/authorized_keys"),
            Err(DestError::Unrequested(_))
        ));
        let root = into.clone().only_requested(&[".".into()]);
        assert!(root.target("srv/a").is_ok() && root.target(".ssh/x").is_err());
        let null = Destination::resolve(Scope::Local, "/dev/null", 1).unwrap();
        assert!(matches!(null.layout, Layout::Stream(_)));
        assert!(Destination::resolve(Scope::Local, "/dev/null", 2).is_err());
    }

    /// `/dev/stdout` redirected to a file (`> out.bin`) is written through, not replaced:
    /// a path that leads to an open descriptor of this process is a stream, whatever the
    /// descriptor is open on.
    #[test]
    fn a_path_to_an_open_descriptor_is_written_through() {
        use std::os::fd::AsRawFd;
        let t = tempfile::tempdir().unwrap();
        let out = fs::File::create(t.path().join("out.bin")).unwrap();
        let fd = out.as_raw_fd();
        std::os::unix::fs::symlink(format!("/proc/self/fd/{fd}"), t.path().join("stdout")).unwrap();
        std::os::unix::fs::symlink("stdout", t.path().join("again")).unwrap();
        for dst in [
            format!("/proc/self/fd/{fd}"),
            format!("/dev/fd/{fd}"),
            format!("{}/stdout", t.path().display()),
            format!("{}/again", t.path().display()),
        ] {
            let d = Destination::resolve(Scope::Local, &dst, 1).unwrap();
            assert!(matches!(d.layout, Layout::Stream(_)), "{dst}");
            assert!(matches!(
                Destination::resolve(Scope::Local, &dst, 2),
                Err(DestError::StreamNeedsOneFile(_))
            ));
        }
        // A link to a file is still replaced by the atomic rename, as rsync replaces one.
        std::os::unix::fs::symlink("out.bin", t.path().join("link")).unwrap();
        let link = format!("{}/link", t.path().display());
        let d = Destination::resolve(Scope::Local, &link, 1).unwrap();
        assert!(matches!(d.layout, Layout::Rename { .. }));
    }

    /// A destination ending in `/` must be a directory: a file of that name is refused, not
    /// replaced (confined paths lose the slash on the way, local ones do not).
    #[test]
    fn a_destination_ending_in_a_slash_is_a_directory_or_refused() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("file"), b"x").unwrap();
        fs::create_dir(t.path().join("dir")).unwrap();
        let confined = Scope::confined(t.path()).unwrap();
        let local_file = format!("{}/file/", t.path().display());
        for (scope, dst) in [(confined.clone(), "file/"), (Scope::Local, &local_file)] {
            let e = Destination::resolve(scope, dst, 1).unwrap_err();
            assert!(matches!(e, DestError::NotADirectory(_)), "{dst}: {e}");
        }
        let into = Destination::resolve(confined.clone(), "dir/", 1).unwrap();
        assert!(matches!(into.layout, Layout::Into(_)));
        // A missing last directory is made (as rsync does), for one source or several, with
        // the first entry, not before (a transfer refused before any leaves nothing); a
        // missing parent is not.
        let local_new = format!("{}/local/", t.path().display());
        for (scope, dst, sources) in [
            (confined.clone(), "new/", 1),
            (confined.clone(), "other/", 2),
            (Scope::Local, local_new.as_str(), 1),
        ] {
            let made = Destination::resolve(scope, dst, sources).unwrap();
            assert!(matches!(made.layout, Layout::Into(_)), "{dst}");
            let dir = t.path().join(dst.rsplit('/').nth(1).unwrap());
            assert!(!dir.exists(), "{dst}");
            assert!(made.target("a").unwrap().ends_with("a"));
            assert!(dir.is_dir(), "{dst}");
        }
        assert!(matches!(
            Destination::resolve(confined, "missing/new/", 1),
            Err(DestError::NoParent(_))
        ));
    }

    /// A device or FIFO is written into by a local copy and refused under a server's root;
    /// neither is ever replaced. A block device needs root (as CI runs) to make.
    #[test]
    fn devices_are_streams_here_and_refused_on_a_server() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let t = tempfile::tempdir().unwrap();
        let mut nodes = vec![("fifo", SFlag::S_IFIFO)];
        if nix::unistd::geteuid().is_root() {
            nodes.push(("blk", SFlag::S_IFBLK));
        } else {
            eprintln!("SKIPPED a block device target: making one needs root (CI runs as root)");
        }
        let confined = Scope::confined(t.path()).unwrap();
        for (name, kind) in nodes {
            let node = t.path().join(name);
            mknod(
                &node,
                kind,
                Mode::from_bits_truncate(0o600),
                makedev(7, 200),
            )
            .unwrap();
            let here = Destination::resolve(Scope::Local, node.to_str().unwrap(), 1).unwrap();
            assert!(matches!(here.layout, Layout::Stream(_)), "{name}");
            let e = Destination::resolve(confined.clone(), name, 1).unwrap_err();
            assert!(matches!(e, DestError::DeviceOnServer(_)), "{name}: {e}");
        }
    }

    /// A pull may skip its plans only where nothing could be skipped or resumed.
    #[test]
    fn a_destination_holds_nothing_without_its_targets_part_files_and_journals() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_str().unwrap();
        fs::create_dir(t.path().join("dir")).unwrap();
        let resolve = |dst: &str, sources: &[&str]| {
            let sources: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
            Destination::resolve(Scope::Local, dst, sources.len() as u32)
                .unwrap()
                .only_requested(&sources)
        };
        let new_file = format!("{d}/new");
        assert!(resolve(&new_file, &["x/f"]).holds_nothing());
        fs::write(t.path().join(".new.hsxfer-part"), b"").unwrap();
        assert!(!resolve(&new_file, &["x/f"]).holds_nothing());
        let into = format!("{d}/dir");
        assert!(resolve(&into, &["x/f", "g"]).holds_nothing());
        fs::write(t.path().join("dir/.g.hsxfer-journal"), b"").unwrap();
        assert!(!resolve(&into, &["x/f", "g"]).holds_nothing());
        assert!(resolve(&into, &["x/f"]).holds_nothing());
        fs::write(t.path().join("dir/f"), b"old").unwrap();
        assert!(!resolve(&into, &["x/f"]).holds_nothing());
        // The server's root into a new directory, and into one that exists, where only the
        // server knows the names its files will take.
        assert!(resolve(&format!("{d}/new2"), &["."]).holds_nothing());
        assert!(!resolve(&into, &["."]).holds_nothing());
        assert!(resolve("/dev/null", &["f"]).holds_nothing());
    }

    #[test]
    fn each_new_parent_is_checked_against_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let t = tempfile::tempdir().unwrap();
        let s = Scope::confined(t.path()).unwrap();
        fs::create_dir_all(t.path().join("dir/src/sub")).unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("dir/src/out")).unwrap();
        let into = Destination::resolve(s, "dir", 1).unwrap();
        let mut targets = Targets::new(&into);
        assert!(targets.target("src/a").is_ok());
        assert!(targets.target("src/b").is_ok());
        // Entries in another directory, after ones in a checked one, are checked again.
        assert!(matches!(
            targets.target("src/out/x"),
            Err(DestError::Root(RootError::Escapes(_)))
        ));
        assert!(targets.target("src/sub/c").is_ok());
        assert!(targets.target("src/out/y").is_err());
    }
}
