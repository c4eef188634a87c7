//! Saved path profiles: one JSON file per server, port and direction in the user's cache
//! directory (`$XDG_CACHE_HOME/hsxfer/profiles`, else `~/.cache/hsxfer/profiles`), written
//! atomically (a temporary file renamed over the old one), readable by the user only.

use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::tuning::probe::{Direction, PathProfile};

/// Why a saved profile could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file exists but is not a profile (truncated, edited, another version).
    #[error("the saved path profile {path} is unreadable ({reason}); it is ignored and will be rewritten")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// It could not be read or written.
    #[error("path profile {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Where profiles are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileStore {
    dir: PathBuf,
}

impl ProfileStore {
    /// A store in `dir` (created when the first profile is saved).
    pub fn new(dir: impl Into<PathBuf>) -> ProfileStore {
        ProfileStore { dir: dir.into() }
    }

    /// The user's store: `$XDG_CACHE_HOME/hsxfer/profiles`, else `$HOME/.cache/...`; `None`
    /// when neither variable is set.
    pub fn for_user() -> Option<ProfileStore> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let cache = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?;
        Some(ProfileStore::new(cache.join("hsxfer").join("profiles")))
    }

    /// The file of a server, port and direction. An IPv6 address is one server with or
    /// without its brackets (`[::1]` as a probe was given it, `::1` as a copy's `[::1]:PATH`
    /// names it).
    pub fn path(&self, server: &str, port: u16, direction: Direction) -> PathBuf {
        let safe: String = unbracketed(server)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir
            .join(format!("{safe}_{port}_{}.json", direction.as_str()))
    }

    /// The saved profile, if any.
    pub fn load(
        &self,
        server: &str,
        port: u16,
        direction: Direction,
    ) -> Result<Option<PathProfile>, ProfileError> {
        let path = self.path(server, port, direction);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ProfileError::Io { path, source }),
        };
        let p: PathProfile = serde_json::from_str(&text).map_err(|e| ProfileError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if unbracketed(&p.server) != unbracketed(server)
            || p.port != port
            || p.direction != direction
        {
            return Err(ProfileError::Corrupt {
                path,
                reason: format!(
                    "it describes {}:{} {}",
                    p.server,
                    p.port,
                    p.direction.as_str()
                ),
            });
        }
        if let Some(reason) = p.problem(unix_now()) {
            return Err(ProfileError::Corrupt { path, reason });
        }
        Ok(Some(p))
    }

    /// Saves a profile, replacing the previous one of its server, port and direction.
    pub fn save(&self, profile: &PathProfile) -> Result<PathBuf, ProfileError> {
        let path = self.path(&profile.server, profile.port, profile.direction);
        let io = |source| ProfileError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        let tmp = temporary(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        let text = serde_json::to_string_pretty(profile).expect("profiles serialize");
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_data())
            .map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        Ok(path)
    }
}

/// A server's name or address without the brackets of an IPv6 address.
fn unbracketed(server: &str) -> &str {
    server
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(server)
}

/// A temporary name beside `path`, unique to this save: saves from two threads of one
/// process (an embedder's parallel copies to one server) once shared one and tore it.
fn temporary(path: &Path) -> PathBuf {
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    let n = SAVES.fetch_add(1, Ordering::Relaxed);
    name.push(format!(".tmp{}.{n}", std::process::id()));
    path.with_file_name(name)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> PathProfile {
        PathProfile::example("[fd00::1]", Direction::Pull, 5)
    }

    #[test]
    fn saves_loads_and_reports_a_corrupt_file() {
        let d = tempfile::tempdir().unwrap();
        let store = ProfileStore::new(d.path().join("p"));
        assert!(store
            .load("[fd00::1]", 7420, Direction::Pull)
            .unwrap()
            .is_none());
        let path = store.save(&profile()).unwrap();
        assert_eq!(path.file_name().unwrap(), "fd00__1_7420_pull.json");
        // One server with or without the brackets of its address.
        assert_eq!(
            store.load("fd00::1", 7420, Direction::Pull).unwrap(),
            Some(profile())
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            store.load("[fd00::1]", 7420, Direction::Pull).unwrap(),
            Some(profile())
        );
        assert!(store
            .load("[fd00::1]", 7420, Direction::Push)
            .unwrap()
            .is_none());
        std::fs::write(&path, "{\"server\": ").unwrap();
        let e = store.load("[fd00::1]", 7420, Direction::Pull).unwrap_err();
        assert!(matches!(e, ProfileError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("will be rewritten"), "{e}");
        // Saving again replaces the corrupt file.
        store.save(&profile()).unwrap();
        assert!(store
            .load("[fd00::1]", 7420, Direction::Pull)
            .unwrap()
            .is_some());
    }

    /// A profile that parses but holds settings no transfer accepts is reported like a
    /// corrupt one (ignored, and rewritten by the next save), not applied: a channel count of
    /// 0 made every copy to the server fail, and a time ahead never expired.
    #[test]
    fn a_profile_with_settings_out_of_range_is_not_used() {
        let d = tempfile::tempdir().unwrap();
        let store = ProfileStore::new(d.path());
        let edits: [fn(&mut PathProfile); 5] = [
            |p| p.recommendation.channels = 0,
            |p| p.recommendation.channels = 500,
            |p| p.recommendation.cc = "cubic; rm".into(),
            |p| p.rate_bps = Some(0),
            |p| p.measured_at = u64::MAX,
        ];
        for edit in edits {
            let mut p = profile();
            edit(&mut p);
            store.save(&p).unwrap();
            let e = store.load("[fd00::1]", 7420, Direction::Pull).unwrap_err();
            assert!(matches!(e, ProfileError::Corrupt { .. }), "{p:?}: {e}");
        }
    }

    /// Saves of one profile from many threads at once all succeed, and what is left is one
    /// of them whole.
    #[test]
    fn saves_from_many_threads_at_once_succeed() {
        let d = tempfile::tempdir().unwrap();
        let store = ProfileStore::new(d.path());
        let short = profile();
        let mut long = profile();
        long.recommendation.cc = "highspeed".into();
        long.source = "a longer source than the other".into();
        std::thread::scope(|s| {
            for t in 0..8 {
                let (store, p) = (&store, if t % 2 == 0 { &short } else { &long });
                s.spawn(move || {
                    for _ in 0..200 {
                        store.save(p).unwrap();
                    }
                });
            }
        });
        let got = store.load("[fd00::1]", 7420, Direction::Pull).unwrap();
        assert!(
            got == Some(short.clone()) || got == Some(long.clone()),
            "{got:?}"
        );
    }
}
