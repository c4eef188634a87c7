//! Confinement of a server to its root directory.
//!
//! Peer-supplied paths are checked lexically first ([`check_relative`]: no `..`, not
//! absolute), then the deepest existing ancestor is canonicalized and must stay inside the
//! canonical root, so a symlink inside the root cannot lead outside it. The check alone could
//! be raced by a local user who swaps a directory for a symlink before the path is used, so
//! every use opens through the root directory opened at start, with `openat2(RESOLVE_BENEATH
//! | RESOLVE_NO_MAGICLINKS)` ([`Scope::open`], [`Scope::open_dir`]), and works on single
//! names inside directories opened that way ([`crate::fsio::at`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};

use crate::channels::manifest::{check_relative, PathError};

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// Lexically invalid (absolute, `..`, NUL).
    #[error(transparent)]
    Path(#[from] PathError),
    /// Resolves (through a symlink) outside the root.
    #[error("path '{0}' leads outside the server root")]
    Escapes(String),
    /// The filesystem refused a lookup.
    #[error("{path}: {source}")]
    Io {
        /// The path looked up.
        path: String,
        /// The error.
        source: io::Error,
    },
}

/// Where a side may read and write: anywhere (the local user's own client) or only below a
/// root (a server).
#[derive(Debug, Clone)]
pub enum Scope {
    /// No confinement: paths are taken as the local user wrote them.
    Local,
    /// Everything must stay under this directory.
    Confined(Root),
}

/// A server's root: its canonical path, and the directory opened once at start that every
/// confined open resolves beneath.
#[derive(Debug, Clone)]
pub struct Root {
    path: PathBuf,
    dir: Arc<File>,
}

impl Scope {
    /// A confined scope at `root`, which must be an existing directory.
    pub fn confined(root: &Path) -> io::Result<Self> {
        let canon = root.canonicalize()?;
        if !canon.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        let dir = Arc::new(File::open(&canon)?);
        Ok(Scope::Confined(Root { path: canon, dir }))
    }

    /// Maps a user path to a filesystem path: as is for [`Scope::Local`]; for a confined
    /// scope it must be relative, and it is joined to the root and checked.
    pub fn resolve(&self, user_path: &str) -> Result<PathBuf, RootError> {
        match self {
            Scope::Local => Ok(PathBuf::from(user_path)),
            Scope::Confined(root) => {
                let mut p = root.path.clone();
                for c in check_relative(user_path)? {
                    p.push(c);
                }
                self.check_inside(&p)?;
                Ok(p)
            }
        }
    }

    /// Opens `p`, a path this scope resolved, for reading (or listing, if a directory) without
    /// blocking on a FIFO. A confined scope opens it with `openat2(RESOLVE_BENEATH |
    /// RESOLVE_NO_MAGICLINKS)` from the root: symlinks are followed only while they stay
    /// below it, whatever was swapped since the path was checked.
    pub fn open(&self, p: &Path) -> io::Result<File> {
        self.open_with(p, OFlag::O_NONBLOCK)
    }

    /// Opens directory `p` (a path this scope resolved) to work on the names inside it with
    /// [`crate::fsio::at`]; `follow` lets `p` itself be a symlink (below the root, when
    /// confined).
    pub fn open_dir(&self, p: &Path, follow: bool) -> io::Result<File> {
        let nofollow = if follow {
            OFlag::empty()
        } else {
            OFlag::O_NOFOLLOW
        };
        self.open_with(p, OFlag::O_DIRECTORY | nofollow)
    }

    fn open_with(&self, p: &Path, extra: OFlag) -> io::Result<File> {
        let Scope::Confined(root) = self else {
            return OpenOptions::new()
                .read(true)
                .custom_flags(extra.bits())
                .open(p);
        };
        let rel = p.strip_prefix(&root.path).map_err(|_| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is outside the server root", p.display()),
            )
        })?;
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | extra)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = openat2(root.dir.as_raw_fd(), rel, how)?;
        // SAFETY: openat2 returned a new descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Rewrites a message for a peer so that it names paths relative to the root instead of
    /// revealing where the root is. A root of `/` (`copy --ssh` with absolute paths) hides
    /// nothing, and its paths stay as the user wrote them.
    pub fn hide_root(&self, message: &str) -> String {
        match self {
            Scope::Local => message.to_string(),
            Scope::Confined(root) if root.path == Path::new("/") => message.to_string(),
            Scope::Confined(root) => {
                let r = root.path.display().to_string();
                message.replace(&format!("{r}/"), "").replace(&r, ".")
            }
        }
    }

    /// Checks that `p` (or, if it does not exist yet, its deepest existing ancestor) resolves
    /// inside the root. A no-op for [`Scope::Local`].
    pub fn check_inside(&self, p: &Path) -> Result<(), RootError> {
        let Scope::Confined(root) = self else {
            return Ok(());
        };
        let mut probe = p;
        loop {
            match probe.canonicalize() {
                Ok(c) if c.starts_with(&root.path) => return Ok(()),
                Ok(_) => return Err(RootError::Escapes(p.display().to_string())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => match probe.parent() {
                    Some(parent) => probe = parent,
                    None => return Err(RootError::Escapes(p.display().to_string())),
                },
                Err(source) => {
                    return Err(RootError::Io {
                        path: p.display().to_string(),
                        source,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_may_not_leave_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
        std::os::unix::fs::symlink("d", root.path().join("in")).unwrap();
        let s = Scope::confined(root.path()).unwrap();
        assert!(s.resolve("d/new-file").is_ok());
        assert!(
            s.resolve("in/new-file").is_ok(),
            "a link staying inside is fine"
        );
        assert!(matches!(s.resolve("out/x"), Err(RootError::Escapes(_))));
        assert!(matches!(s.resolve("out"), Err(RootError::Escapes(_))));
        assert!(matches!(s.resolve("../x"), Err(RootError::Path(_))));
        assert!(matches!(s.resolve("/etc/passwd"), Err(RootError::Path(_))));
        let canon = root.path().canonicalize().unwrap();
        let msg = format!(
            "{}/d/x: no such file; root {}",
            canon.display(),
            canon.display()
        );
        assert_eq!(s.hide_root(&msg), "d/x: no such file; root .");
        // Every path is below `/`: its messages keep their slashes.
        let all = Scope::confined(Path::new("/")).unwrap();
        let msg = "reading /data/f: block 3/4";
        assert_eq!(all.hide_root(msg), msg);
    }

    #[test]
    fn opening_follows_symlinks_only_while_they_stay_below_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/f"), b"y").unwrap();
        let s = Scope::confined(root.path()).unwrap();
        let canon = root.path().canonicalize().unwrap();
        assert!(s.open(&canon.join("d/f")).is_ok());
        assert!(s.open(&canon).unwrap().metadata().unwrap().is_dir());
        // `d` passed the check, then became a link out of the root.
        std::fs::rename(canon.join("d"), canon.join("d.old")).unwrap();
        std::os::unix::fs::symlink(outside.path(), canon.join("d")).unwrap();
        std::fs::write(outside.path().join("f"), b"z").unwrap();
        let e = s.open(&canon.join("d/f")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
        assert!(s.open(Path::new("/etc/passwd")).is_err());
    }
}
