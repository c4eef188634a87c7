//! What the sender announces before any data: files and directories with the metadata to
//! recreate them, under paths relative to the destination.

use serde::{Deserialize, Serialize};

/// One file or directory of a transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Session-local identifier; data frames name files by it.
    pub id: u32,
    /// Relative `/`-separated path; its first component is the name of the top-level source
    /// (the receiver may rename it, as `cp SRC NEWNAME` does). Checked by [`check_relative`].
    pub path: String,
    /// Unix permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time in nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// File or directory.
    pub kind: EntryKind,
}

/// Whether an [`Entry`] is a regular file (with its size) or a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file of `size` bytes.
    File {
        /// Length in bytes.
        size: u64,
    },
    /// A directory; created even when empty.
    Dir,
}

/// Why a path from the peer or the command line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty path.
    #[error("empty path")]
    Empty,
    /// Starts with `/`.
    #[error("absolute path '{0}' refused: remote paths are relative to the server root (drop the leading '/')")]
    Absolute(String),
    /// Contains a `..` component.
    #[error("path '{0}' refused: '..' may not leave the server root")]
    ParentComponent(String),
    /// Contains a NUL byte, or a component that is empty or `.` in a manifest path.
    #[error("malformed path '{0}'")]
    Malformed(String),
}

/// Validates a relative path and returns its components. `.` components and repeated or
/// trailing slashes are tolerated (`a/./b//` is `a/b`); `..`, absolute paths and NUL are not.
pub fn check_relative(path: &str) -> Result<Vec<&str>, PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute(path.to_string()));
    }
    if path.contains('\0') {
        return Err(PathError::Malformed(path.to_string()));
    }
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(PathError::ParentComponent(path.to_string())),
            c => parts.push(c),
        }
    }
    Ok(parts)
}

#[cfg(test)]
impl Entry {
    /// An entry with id `id`, of `kind`, and a made-up path and metadata: for tests.
    pub(crate) fn sample(id: u32, kind: EntryKind) -> Entry {
        Entry {
            id,
            path: format!("t/{id}"),
            mode: 0o644,
            mtime_ns: 0,
            kind,
        }
    }
}

/// Splits a manifest chunk after its first `files` files: the front part keeps them, the
/// directories among them and those that follow the last of them; the rest starts at the next
/// file (empty when the chunk has no more). A receiver whose budget of open files is smaller
/// than a chunk plans it in such parts, so a process with a low `ulimit -n` still receives.
pub fn split_after_files(mut entries: Vec<Entry>, files: usize) -> (Vec<Entry>, Vec<Entry>) {
    let mut seen = 0;
    let cut = entries
        .iter()
        .position(|e| {
            let file = matches!(e.kind, EntryKind::File { .. });
            seen += usize::from(file);
            file && seen > files
        })
        .unwrap_or(entries.len());
    let rest = entries.split_off(cut);
    (entries, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_splits_after_its_nth_file_with_the_directories_that_follow() {
        let f = EntryKind::File { size: 1 };
        let chunk = vec![
            Entry::sample(0, EntryKind::Dir),
            Entry::sample(1, f),
            Entry::sample(2, f),
            Entry::sample(3, EntryKind::Dir),
            Entry::sample(4, f),
            Entry::sample(5, EntryKind::Dir),
        ];
        let ids = |v: &[Entry]| v.iter().map(|e| e.id).collect::<Vec<_>>();
        let (front, rest) = split_after_files(chunk.clone(), 2);
        assert_eq!((ids(&front), ids(&rest)), (vec![0, 1, 2, 3], vec![4, 5]));
        let (front, rest) = split_after_files(chunk.clone(), 3);
        assert_eq!((ids(&front), ids(&rest)), (vec![0, 1, 2, 3, 4, 5], vec![]));
        let (front, rest) = split_after_files(chunk.clone(), 0);
        assert_eq!((ids(&front), ids(&rest)), (vec![0], vec![1, 2, 3, 4, 5]));
    }

    #[test]
    fn relative_paths() {
        assert_eq!(check_relative("a/./b//c/").unwrap(), vec!["a", "b", "c"]);
        assert_eq!(check_relative(".").unwrap(), Vec::<&str>::new());
        assert!(matches!(
            check_relative("/etc"),
            Err(PathError::Absolute(_))
        ));
        assert!(matches!(
            check_relative("a/../../x"),
            Err(PathError::ParentComponent(_))
        ));
        assert!(matches!(
            check_relative("a\0b"),
            Err(PathError::Malformed(_))
        ));
        assert_eq!(check_relative(""), Err(PathError::Empty));
    }
}
