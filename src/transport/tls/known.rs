//! The client's known-servers file: one `SERVER FINGERPRINT` line per server it has talked
//! to, as OpenSSH's `known_hosts` with `StrictHostKeyChecking accept-new`. A server met for
//! the first time is recorded without asking, so scripts keep working; a server whose key
//! changed is refused until its line is removed.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::identity::{config_dir, Fingerprint};

/// A known-servers file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownServers {
    path: PathBuf,
}

/// What the file says about one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// Nothing: the first contact.
    Unknown,
    /// Its recorded key, and the line that holds it.
    Key {
        /// The recorded fingerprint.
        fingerprint: Fingerprint,
        /// Its line number (from 1).
        line: usize,
    },
}

impl KnownServers {
    /// The file at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        KnownServers { path: path.into() }
    }

    /// `known_servers` in hsxfer's configuration directory (`$XDG_CONFIG_HOME/hsxfer`, else
    /// `~/.config/hsxfer`); `None` with neither variable set.
    pub fn default_location() -> Option<Self> {
        config_dir().map(|d| Self::at(d.join("known_servers")))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key recorded for `server` (as `HOST:PORT`). A missing file knows nothing; lines
    /// that do not parse are skipped.
    pub fn lookup(&self, server: &str) -> std::io::Result<Known> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Known::Unknown),
            Err(e) => return Err(e),
        };
        let found = text.lines().enumerate().find_map(|(i, l)| {
            let mut words = l.split_whitespace();
            match (words.next(), words.next()) {
                (Some(name), Some(fp)) if name == server => {
                    fp.parse().ok().map(|fingerprint| Known::Key {
                        fingerprint,
                        line: i + 1,
                    })
                }
                _ => None,
            }
        });
        Ok(found.unwrap_or(Known::Unknown))
    }

    /// Records `server`'s key: one appended line (the directory made as needed), on a line
    /// of its own even where the file's last line has no newline (one edited by hand): the
    /// two lines ran together, and the server of the last one was no longer known.
    pub fn record(&self, server: &str, key: Fingerprint) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&self.path)?;
        let len = f.metadata()?.len();
        let mut last = [b'\n'];
        if len > 0 {
            f.read_exact_at(&mut last, len - 1)?;
        }
        let start = if last[0] == b'\n' { "" } else { "\n" };
        // One write, so lines of clients recording at once do not interleave.
        f.write_all(format!("{start}{server} {key}\n").as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a lookup finds for a key recorded on `line`.
    fn key(fingerprint: Fingerprint, line: usize) -> Known {
        Known::Key { fingerprint, line }
    }

    #[test]
    fn records_then_finds_each_server_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let k = KnownServers::at(dir.path().join("a/known"));
        assert_eq!(k.lookup("h:1").unwrap(), Known::Unknown);
        let (a, b) = (Fingerprint::test_value(1), Fingerprint::test_value(2));
        k.record("h:1", a).unwrap();
        k.record("h:2", b).unwrap();
        assert_eq!(k.lookup("h:2").unwrap(), key(b, 2));
        assert_eq!(k.lookup("h:1").unwrap(), key(a, 1));
        assert_eq!(k.lookup("h").unwrap(), Known::Unknown);
    }

    #[test]
    fn a_key_recorded_after_a_last_line_without_newline_keeps_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known");
        let (a, b) = (Fingerprint::test_value(1), Fingerprint::test_value(2));
        std::fs::write(&path, format!("a:1 {a}")).unwrap();
        let k = KnownServers::at(&path);
        k.record("b:2", b).unwrap();
        assert_eq!(k.lookup("a:1").unwrap(), key(a, 1));
        assert_eq!(k.lookup("b:2").unwrap(), key(b, 2));
    }
}
