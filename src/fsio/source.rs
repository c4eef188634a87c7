//! The sending side's files: walking sources into a manifest and reading blocks.

use std::collections::HashMap;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::partial::is_reserved_name;
use crate::channels::manifest::{Entry, EntryKind};

/// Why a source could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The path does not exist.
    #[error("{0}: no such file or directory")]
    Missing(String),
    /// A directory was named without `-r`.
    #[error("{0} is a directory (use -r to copy directories)")]
    IsDirectory(String),
    /// Neither a regular file nor a directory.
    #[error("{0} is not a regular file or directory")]
    Special(String),
    /// A name hsxfer uses for its own temporary files.
    #[error("{0}: names ending in .hsxfer-part or .hsxfer-journal are hsxfer's temporary files (left by an interrupted transfer?): remove or rename it")]
    Reserved(String),
    /// A name that is not UTF-8 (not supported by this protocol version).
    #[error("{0}: file names must be UTF-8")]
    NotUtf8(String),
    /// Permission denied or another I/O error.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: io::Error,
    },
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

/// A walked set of sources: the manifest and where each file lives.
#[derive(Debug, Default)]
pub struct SourceTree {
    /// Directories before their contents, files with sizes; ids are indices.
    pub entries: Vec<Entry>,
    paths: HashMap<u32, PathBuf>,
    /// Entries inside trees that were passed over (symlinks, sockets, devices).
    pub passed_over: Vec<String>,
}

impl SourceTree {
    /// Walks `sources`. Each top-level source becomes an entry named after its last path
    /// component; directories are only entered with `recursive`. Command-line symlinks are
    /// followed (as `cp` does); symlinks inside trees are passed over, never followed.
    pub fn walk(sources: &[PathBuf], recursive: bool) -> Result<Self, SourceError> {
        let mut tree = SourceTree::default();
        for src in sources {
            let meta = fs::metadata(src).map_err(io_err(src))?;
            let name = top_level_name(src)?;
            if is_reserved_name(&name) {
                return Err(SourceError::Reserved(src.display().to_string()));
            }
            if meta.is_dir() && !recursive {
                return Err(SourceError::IsDirectory(src.display().to_string()));
            }
            tree.add(src, name, &meta)?;
        }
        Ok(tree)
    }

    fn add(&mut self, path: &Path, rel: String, meta: &Metadata) -> Result<(), SourceError> {
        let id = self.entries.len() as u32;
        let kind = if meta.is_dir() {
            EntryKind::Dir
        } else if meta.is_file() {
            EntryKind::File { size: meta.len() }
        } else {
            return Err(SourceError::Special(path.display().to_string()));
        };
        self.entries.push(Entry {
            id,
            path: rel.clone(),
            mode: meta.mode() & 0o7777,
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            kind,
        });
        if kind == EntryKind::Dir {
            let mut children: Vec<_> = fs::read_dir(path)
                .map_err(io_err(path))?
                .collect::<Result<_, _>>()
                .map_err(io_err(path))?;
            children.sort_by_key(|c| c.file_name());
            for c in children {
                let cpath = c.path();
                let cmeta = fs::symlink_metadata(&cpath).map_err(io_err(&cpath))?;
                let Some(cname) = c.file_name().to_str().map(str::to_owned) else {
                    return Err(SourceError::NotUtf8(cpath.display().to_string()));
                };
                if is_reserved_name(&cname) {
                    return Err(SourceError::Reserved(cpath.display().to_string()));
                }
                if cmeta.is_dir() || cmeta.is_file() {
                    self.add(&cpath, format!("{rel}/{cname}"), &cmeta)?;
                } else {
                    self.passed_over.push(cpath.display().to_string());
                }
            }
        } else {
            self.paths.insert(id, path.to_path_buf());
        }
        Ok(())
    }

    /// Where file `id` lives.
    pub fn path_of(&self, id: u32) -> Option<&Path> {
        self.paths.get(&id).map(PathBuf::as_path)
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

/// Reads `len` bytes at `offset` of the file at `path` into `buf` (resized to `len`; reusing
/// one buffer per channel avoids faulting in fresh memory for every block). A short read means
/// the file shrank after it was listed.
pub fn read_block(path: &Path, offset: u64, len: u32, buf: &mut Vec<u8>) -> io::Result<()> {
    let f = File::open(path)?;
    buf.resize(len as usize, 0);
    f.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                e.kind(),
                format!("{} shrank while it was being sent", path.display()),
            )
        } else {
            e
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_dirs_before_contents_and_passes_over_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        fs::create_dir_all(top.join("sub/empty")).unwrap();
        fs::write(top.join("sub/a"), b"abc").unwrap();
        fs::write(top.join("b"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", top.join("link")).unwrap();
        let tree = SourceTree::walk(std::slice::from_ref(&top), true).unwrap();
        let paths: Vec<_> = tree.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["top", "top/b", "top/sub", "top/sub/a", "top/sub/empty"]
        );
        assert_eq!(tree.total_bytes(), 3);
        assert_eq!(tree.passed_over.len(), 1);
        assert!(matches!(
            SourceTree::walk(std::slice::from_ref(&top), false),
            Err(SourceError::IsDirectory(_))
        ));
        assert!(matches!(
            SourceTree::walk(&[top.join("nope")], false),
            Err(SourceError::Missing(_))
        ));
        let mut buf = vec![9; 10];
        read_block(&top.join("sub/a"), 1, 2, &mut buf).unwrap();
        assert_eq!(buf, b"bc");
        assert!(read_block(&top.join("sub/a"), 2, 2, &mut buf).is_err());
    }
}
