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
mod tests {
    use super::*;

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
