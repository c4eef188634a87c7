//! The sending side's files: walking sources into a manifest and reading blocks.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::IntoRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::OFlag;
use nix::sys::stat::FileStat;

use super::at;
use super::direct::{read_uncached, DIRECT_MIN_BYTES};
use super::partial::is_reserved_name;
use super::root::Scope;
use crate::channels::limits::{least_block_size, MAX_FILE_BLOCKS};
use crate::channels::manifest::{Entry, EntryKind};

/// Why a source could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The path does not exist.
    #[error("{0}: no such file or directory")]
    Missing(String),
    /// A directory was named without `-r`.
    #[error("{0} is a directory (give `recursive` to copy directories)")]
    IsDirectory(String),
    /// Neither a regular file nor a directory.
    #[error("{0} is not a regular file or directory")]
    Special(String),
    /// A name hsxfer uses for its own temporary files.
    #[error("{0}: names ending in .hsxfer-part or .hsxfer-journal are hsxfer's temporary files (left by an interrupted transfer?): remove or rename it")]
    Reserved(String),
    /// Two different sources with one name: they would land on the same target.
    #[error("'{first}' and '{second}' would both land as '{name}': copy them one at a time, or to different destinations")]
    SameName {
        /// The name they share.
        name: String,
        /// The first source of that name.
        first: String,
        /// The second.
        second: String,
    },
    /// A name that is not UTF-8 (not supported by this protocol version).
    #[error("{0}: the name is not UTF-8, which hsxfer's protocol needs: rename it (the `convmv` tool renames a whole tree named in Latin-1) and copy again")]
    NotUtf8(String),
    /// A file with more blocks than a session may send of one file
    /// ([`MAX_FILE_BLOCKS`]).
    #[error("{path} is {size} bytes, more than 4,194,304 blocks of {block_size} bytes: {}", match least_block_size(*.size) {
        Some(b) => format!("copy it with a `block_size` of {b} bytes or more"),
        None => "no block size hsxfer takes cuts it into so few (256 TiB at most)".into(),
    })]
    TooManyBlocks {
        /// The file, as the manifest names it.
        path: String,
        /// Its size.
        size: u64,
        /// The session's block size.
        block_size: u32,
    },
    /// Permission denied or another I/O error.
    #[error("{path}: {source}{}", crate::os_hint::for_io(.source))]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: io::Error,
    },
}

fn nix_err(path: &Path) -> impl FnOnce(nix::Error) -> SourceError + '_ {
    move |e| io_err(path)(io::Error::from(e))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SourceError + '_ {
    move |source| {
        if source.kind() == io::ErrorKind::NotFound {
            SourceError::Missing(path.display().to_string())
        } else {
            SourceError::Io {
                path: path.display().to_string(),
                source,
            }
        }
    }
}

/// Where a listed file lives, and which file it was when listed: blocks are read only from
/// that very file (same device and inode), never from one swapped in under its name, and
/// only while it is unmodified since (same modification time).
#[derive(Debug)]
pub struct SourceFile {
    /// The path it was listed under.
    pub path: PathBuf,
    /// A source named on the command line may be a symlink (followed, as `cp` does); files
    /// inside trees are opened with `O_NOFOLLOW`.
    follow: bool,
    dev: u64,
    ino: u64,
    mtime_ns: i64,
}

/// A walked set of sources: the manifest and where each file lives.
#[derive(Debug, Default)]
pub struct SourceTree {
    /// Directories before their contents, files with sizes; ids are indices.
    pub entries: Vec<Entry>,
    files: HashMap<u32, SourceFile>,
    /// Entries inside trees that were passed over (symlinks, sockets, devices), by their
    /// names in the manifest.
    pub passed_over: Vec<String>,
    /// Temporary files of other transfers inside trees (an interrupted one's, or one still
    /// writing there), passed over too: a tree is copied without them, not refused.
    pub unfinished: Vec<String>,
}

impl SourceTree {
    /// Walks `sources` (paths `scope` resolved). Each top-level source becomes an entry named
    /// after its last path component; directories are only entered with `recursive`.
    /// Command-line symlinks are followed (as `cp` does; in a confined scope only while they
    /// stay below the root); symlinks inside trees are passed over, never followed. The walk
    /// goes by descriptors: each directory is opened with `O_NOFOLLOW` relative to its
    /// parent's, so a directory swapped for a symlink while it runs cannot lead it elsewhere.
    pub fn walk(scope: &Scope, sources: &[PathBuf], recursive: bool) -> Result<Self, SourceError> {
        let mut tree = SourceTree::default();
        // Each top-level name, with the source that has it and that source's file identity.
        let mut names: HashMap<String, (&PathBuf, (u64, u64))> = HashMap::new();
        for src in sources {
            let f = scope.open(src).map_err(io_err(src))?;
            let st = at::fstat(&f).map_err(io_err(src))?;
            let name = top_level_name(src)?;
            if is_reserved_name(&name) {
                return Err(SourceError::Reserved(src.display().to_string()));
            }
            let identity = (st.st_dev as u64, st.st_ino as u64);
            match names.get(&name) {
                // The same file or directory named twice goes once.
                Some((_, seen)) if *seen == identity => continue,
                Some((first, _)) => {
                    return Err(SourceError::SameName {
                        name,
                        first: first.display().to_string(),
                        second: src.display().to_string(),
                    })
                }
                None => {
                    names.insert(name.clone(), (src, identity));
                }
            }
            if at::is_dir(&st) && !recursive {
                return Err(SourceError::IsDirectory(src.display().to_string()));
            }
            let dir = at::is_dir(&st).then_some(f);
            tree.add(src, name, &st, dir, true)?;
        }
        Ok(tree)
    }

    /// Adds one entry; `dir` is the open directory to list when it is one.
    fn add(
        &mut self,
        path: &Path,
        rel: String,
        st: &FileStat,
        dir: Option<File>,
        follow: bool,
    ) -> Result<(), SourceError> {
        let id = self.entries.len() as u32;
        let kind = if at::is_dir(st) {
            EntryKind::Dir
        } else if at::is_file(st) {
            EntryKind::File {
                size: st.st_size as u64,
            }
        } else {
            return Err(SourceError::Special(path.display().to_string()));
        };
        self.entries.push(Entry {
            id,
            path: rel.clone(),
            mode: st.st_mode & 0o7777,
            mtime_ns: at::mtime_ns(st),
            kind,
        });
        let Some(dir) = dir else {
            self.files.insert(
                id,
                SourceFile {
                    path: path.to_path_buf(),
                    follow,
                    dev: st.st_dev,
                    ino: st.st_ino,
                    mtime_ns: at::mtime_ns(st),
                },
            );
            return Ok(());
        };
        let mut listing = Dir::from_fd(dir.into_raw_fd()).map_err(nix_err(path))?;
        let mut names: Vec<std::ffi::CString> = Vec::new();
        for e in listing.iter() {
            let e = e.map_err(nix_err(path))?;
            let n = e.file_name();
            if n.to_bytes() != b"." && n.to_bytes() != b".." {
                names.push(n.to_owned());
            }
        }
        names.sort();
        for n in names {
            let cpath = path.join(OsStr::from_bytes(n.to_bytes()));
            let Ok(cname) = n.to_str() else {
                return Err(SourceError::NotUtf8(cpath.display().to_string()));
            };
            let crel = format!("{rel}/{cname}");
            if is_reserved_name(cname) {
                self.unfinished.push(crel);
                continue;
            }
            let Some(cst) = at::stat(&listing, cname).map_err(io_err(&cpath))? else {
                return Err(SourceError::Missing(cpath.display().to_string()));
            };
            if at::is_dir(&cst) {
                let d = at::open(&listing, cname, OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0)
                    .map_err(io_err(&cpath))?;
                let dst = at::fstat(&d).map_err(io_err(&cpath))?;
                self.add(&cpath, crel, &dst, Some(d), false)?;
            } else if at::is_file(&cst) {
                self.add(&cpath, crel, &cst, None, false)?;
            } else {
                self.passed_over.push(crel);
            }
        }
        Ok(())
    }

    /// Where file `id` lives.
    pub fn file(&self, id: u32) -> Option<&SourceFile> {
        self.files.get(&id)
    }

    /// Refuses a tree with a file of more than [`MAX_FILE_BLOCKS`] blocks of `block_size`,
    /// naming the block size that would take it, before anything is sent.
    pub fn check_blocks(&self, block_size: u32) -> Result<(), SourceError> {
        let too_large = self.entries.iter().find_map(|e| match e.kind {
            EntryKind::File { size }
                if crate::channels::blocks::count(size, block_size) > MAX_FILE_BLOCKS =>
            {
                Some((e.path.clone(), size))
            }
            _ => None,
        });
        match too_large {
            Some((path, size)) => Err(SourceError::TooManyBlocks {
                path,
                size,
                block_size,
            }),
            None => Ok(()),
        }
    }

    /// One line saying what the walk passed over (the first names of each kind, and how many
    /// more), for the copy's warnings; `None` when it passed over nothing. A tree copied
    /// without some of its entries must say so, whichever end walked it.
    pub fn passed_over_note(&self) -> Option<String> {
        let special = (!self.passed_over.is_empty()).then(|| {
            format!(
                "{} (symlinks inside a tree are not followed; sockets, FIFOs and devices are \
                 not copied): {}",
                counted(
                    self.passed_over.len(),
                    "entry that is neither a file nor a directory",
                    "entries that are neither files nor directories"
                ),
                first_names(&self.passed_over)
            )
        });
        let unfinished = (!self.unfinished.is_empty()).then(|| {
            format!(
                "{} (names ending in .hsxfer-part or .hsxfer-journal): {}",
                counted(
                    self.unfinished.len(),
                    "temporary file of an unfinished transfer",
                    "temporary files of unfinished transfers"
                ),
                first_names(&self.unfinished)
            )
        });
        let parts: Vec<String> = special.into_iter().chain(unfinished).collect();
        (!parts.is_empty()).then(|| format!("not copied: {}", parts.join("; ")))
    }

    /// Total bytes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e.kind {
                EntryKind::File { size } => size,
                EntryKind::Dir => 0,
            })
            .sum()
    }
}

/// `n` and what it counts, in the singular or the plural.
fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The first names of `names`, and how many more there are.
fn first_names(names: &[String]) -> String {
    const NAMED: usize = 5;
    let mut listed = names
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMED {
        listed.push_str(&format!(" and {} more", names.len() - NAMED));
    }
    listed
}

fn top_level_name(src: &Path) -> Result<String, SourceError> {
    let name = match src.file_name() {
        Some(n) => n.to_owned(),
        None => src
            .canonicalize()
            .map_err(io_err(src))?
            .file_name()
            .map(|n| n.to_owned())
            .unwrap_or_else(|| "root".into()),
    };
    name.into_string()
        .map_err(|_| SourceError::NotUtf8(src.display().to_string()))
}

/// Reads `len` bytes at `offset` of `src` into `buf` (resized to `len`; reusing one buffer
/// per channel avoids faulting in fresh memory for every block), directly from the disk
/// where a large file's block is not cached ([`read_uncached`]). A short read means the file
/// shrank after it was listed; a file that is no longer the one listed (another device or
/// inode under its name) is refused, and so is one modified since it was listed (looked at
/// before and after each read): its blocks would not be one version of it, and every block
/// is checked, so a file sent without error was not written to before its last block was
/// read.
pub fn read_block(src: &SourceFile, offset: u64, len: u32, buf: &mut Vec<u8>) -> io::Result<()> {
    let nofollow = if src.follow { 0 } else { libc::O_NOFOLLOW };
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nofollow | libc::O_NONBLOCK)
        .open(&src.path)?;
    let st = at::fstat(&f)?;
    if (st.st_dev, st.st_ino) != (src.dev, src.ino) {
        return Err(io::Error::other(format!(
            "{} was replaced while it was being sent (it is no longer the file listed)",
            src.path.display()
        )));
    }
    let unmodified = |st: &FileStat| {
        if at::mtime_ns(st) == src.mtime_ns {
            return Ok(());
        }
        Err(io::Error::other(format!(
            "{} was modified while it was being sent: copy again once nothing writes to it",
            src.path.display()
        )))
    };
    unmodified(&st)?;
    buf.resize(len as usize, 0);
    let direct = if st.st_size as u64 >= DIRECT_MIN_BYTES {
        read_uncached(&f, offset, buf)?
    } else {
        0
    };
    f.read_exact_at(&mut buf[direct..], offset + direct as u64)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(
                    e.kind(),
                    format!("{} shrank while it was being sent", src.path.display()),
                )
            } else {
                e
            }
        })?;
    // Once more after the read: a write that landed between the first look and the read
    // (the time changes as a write begins) would otherwise go out as this version's bytes.
    unmodified(&at::fstat(&f)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Sources that would land on one target: the same one named twice goes once, two
    /// different ones with one name are refused before anything moves.
    #[test]
    fn sources_that_share_a_name_are_refused_unless_they_are_one() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("a")).unwrap();
        fs::create_dir_all(t.path().join("b")).unwrap();
        fs::write(t.path().join("a/x"), b"1").unwrap();
        fs::write(t.path().join("b/x"), b"2").unwrap();
        let (ax, bx) = (t.path().join("a/x"), t.path().join("b/x"));
        let twice = SourceTree::walk(
            &Scope::Local,
            &[ax.clone(), t.path().join("a/../a/x")],
            false,
        )
        .unwrap();
        assert_eq!(twice.entries.len(), 1);
        let e = SourceTree::walk(&Scope::Local, &[ax, bx], false).unwrap_err();
        assert!(
            matches!(&e, SourceError::SameName { name, .. } if name == "x"),
            "{e}"
        );
        assert!(e.to_string().contains("one at a time"), "{e}");
    }

    #[test]
    fn the_note_names_the_first_five_passed_over_and_counts_the_rest() {
        assert_eq!(SourceTree::default().passed_over_note(), None);
        let tree = SourceTree {
            passed_over: (1..=7).map(|i| format!("t/s{i}")).collect(),
            ..SourceTree::default()
        };
        let note = tree.passed_over_note().unwrap();
        assert!(
            note.starts_with("not copied: 7 entries that are neither files nor"),
            "{note}"
        );
        assert!(
            note.ends_with(": t/s1, t/s2, t/s3, t/s4, t/s5 and 2 more"),
            "{note}"
        );
    }

    #[test]
    fn walks_dirs_before_contents_and_passes_over_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        fs::create_dir_all(top.join("sub/empty")).unwrap();
        fs::write(top.join("sub/a"), b"abc").unwrap();
        fs::write(top.join("b"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", top.join("link")).unwrap();
        let tree = SourceTree::walk(&Scope::Local, std::slice::from_ref(&top), true).unwrap();
        let paths: Vec<_> = tree.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["top", "top/b", "top/sub", "top/sub/a", "top/sub/empty"]
        );
        assert_eq!(tree.total_bytes(), 3);
        assert_eq!(tree.passed_over, ["top/link"]);
        assert_eq!(
            tree.passed_over_note().unwrap(),
            "not copied: 1 entry that is neither a file nor a directory (symlinks inside a tree \
             are not followed; sockets, FIFOs and devices are not copied): top/link"
        );
        assert!(matches!(
            SourceTree::walk(&Scope::Local, std::slice::from_ref(&top), false),
            Err(SourceError::IsDirectory(_))
        ));
        assert!(matches!(
            SourceTree::walk(&Scope::Local, &[top.join("nope")], false),
            Err(SourceError::Missing(_))
        ));
        let mut buf = vec![9; 10];
        let a = tree.file(3).unwrap();
        assert_eq!(a.path, top.join("sub/a"));
        read_block(a, 1, 2, &mut buf).unwrap();
        assert_eq!(buf, b"bc");
        assert!(read_block(a, 2, 2, &mut buf).is_err());
    }

    /// Another transfer's temporary files inside a tree are left out, and said to be, beside
    /// what else was passed over; one named as the source itself is refused.
    #[test]
    fn temporary_files_inside_a_tree_are_passed_over_and_noted() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        fs::create_dir_all(top.join("sub")).unwrap();
        fs::write(top.join("sub/a"), b"abc").unwrap();
        fs::write(top.join("sub/.a.hsxfer-part"), b"ab").unwrap();
        fs::write(top.join(".b.hsxfer-journal"), b"").unwrap();
        std::os::unix::fs::symlink("sub", top.join("link")).unwrap();
        let tree = SourceTree::walk(&Scope::Local, std::slice::from_ref(&top), true).unwrap();
        let paths: Vec<_> = tree.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["top", "top/sub", "top/sub/a"]);
        assert_eq!(
            tree.passed_over_note().unwrap(),
            "not copied: 1 entry that is neither a file nor a directory (symlinks inside a tree \
             are not followed; sockets, FIFOs and devices are not copied): top/link; 2 \
             temporary files of unfinished transfers (names ending in .hsxfer-part or \
             .hsxfer-journal): top/.b.hsxfer-journal, top/sub/.a.hsxfer-part"
        );
        let part = top.join("sub/.a.hsxfer-part");
        assert!(matches!(
            SourceTree::walk(&Scope::Local, &[part], false),
            Err(SourceError::Reserved(_))
        ));
    }

    #[test]
    fn a_file_modified_after_it_was_listed_is_not_read() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("f");
        fs::write(&path, b"0123456789").unwrap();
        let listed = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(listed)
            .unwrap();
        let tree = SourceTree::walk(&Scope::Local, std::slice::from_ref(&path), false).unwrap();
        let mut buf = Vec::new();
        read_block(tree.file(0).unwrap(), 0, 4, &mut buf).unwrap();
        // A write moves the modification time (set here, as a write within the clock's tick
        // might not).
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(listed + std::time::Duration::from_nanos(1))
            .unwrap();
        let e = read_block(tree.file(0).unwrap(), 4, 4, &mut buf).unwrap_err();
        assert!(
            e.to_string()
                .contains("was modified while it was being sent"),
            "{e}"
        );
    }

    #[test]
    fn a_name_that_is_not_utf8_stops_the_walk_and_says_what_to_do() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        fs::create_dir(&top).unwrap();
        fs::write(top.join(OsStr::from_bytes(b"lat\xe9n")), b"x").unwrap();
        let e = SourceTree::walk(&Scope::Local, &[top], true).unwrap_err();
        assert!(matches!(e, SourceError::NotUtf8(_)), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains("top/lat\u{FFFD}n: the name is not UTF-8")
                && message.contains("convmv"),
            "{message}"
        );
    }

    #[test]
    fn a_file_or_directory_swapped_after_the_walk_is_not_read() {
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir(outside.path().join("sub")).unwrap();
        fs::write(outside.path().join("sub/a"), b"secret").unwrap();
        let root = tempfile::tempdir().unwrap();
        let scope = Scope::confined(root.path()).unwrap();
        let top = root.path().canonicalize().unwrap().join("top");
        fs::create_dir_all(top.join("sub")).unwrap();
        fs::write(top.join("sub/a"), b"public").unwrap();
        fs::write(top.join("b"), b"public").unwrap();
        let tree = SourceTree::walk(&scope, std::slice::from_ref(&top), true).unwrap();
        let (b, a) = (tree.file(1).unwrap(), tree.file(3).unwrap());
        let mut buf = Vec::new();
        // The directory becomes a link out of the root; the file becomes a link to a file
        // outside; then a regular file replaces it.
        fs::rename(top.join("sub"), top.join("sub.old")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("sub"), top.join("sub")).unwrap();
        let e = read_block(a, 0, 6, &mut buf).unwrap_err();
        assert!(e.to_string().contains("was replaced"), "{e}");
        // The listed file is kept under another name, so a new one cannot reuse its inode.
        fs::rename(top.join("b"), top.join("b.listed")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("sub/a"), top.join("b")).unwrap();
        assert_eq!(
            read_block(b, 0, 6, &mut buf).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        fs::remove_file(top.join("b")).unwrap();
        fs::write(top.join("b"), b"other!").unwrap();
        assert!(read_block(b, 0, 6, &mut buf).is_err());
        // A source named through a link that leaves the root is not even opened.
        let link = top.parent().unwrap().join("out");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        assert!(SourceTree::walk(&scope, &[link.join("sub")], true).is_err());
    }
}
