//! Token files: the shared secret a server and its clients hold. A token must be hard to
//! guess (at least 128 bits) and readable by its owner only; `hsxfer token new` writes one.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};

/// Shortest token accepted, characters: 128 bits written in hex.
pub const MIN_TOKEN_CHARS: usize = 32;

/// Random bytes in a new token (256 bits; 64 hex digits in the file).
const NEW_TOKEN_BYTES: usize = 32;

/// Reads a token file, refusing one that others may read or write, one that belongs to
/// another user than this process's (root aside: the owner of a file can read and change it
/// whatever its mode), or a token too short to resist guessing.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    let shown = path.display();
    let failed = || Error::io(format!("reading token file {shown}"));
    // One open for all checks: the mode and owner are those of the file actually read.
    let mut file = fs::File::open(path).map_err(failed())?;
    let meta = file.metadata().map_err(failed())?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::Usage(format!(
            "token file {shown} is open to other users (mode {mode:03o}): run chmod 600 {shown}"
        )));
    }
    let owner = meta.uid();
    let sudo_uid = std::env::var("SUDO_UID").ok().and_then(|u| u.parse().ok());
    if !trusted_owner(owner, nix::unistd::geteuid().as_raw(), sudo_uid) {
        return Err(Error::Usage(format!(
            "token file {shown} belongs to another user (uid {owner}), who can read and change \
             it: use a copy of your own, mode 600 (install -m 600 {shown} NEW, run as the user \
             who runs hsxfer)"
        )));
    }
    let mut token = Vec::new();
    file.read_to_end(&mut token).map_err(failed())?;
    let len = token.trim_ascii().len();
    if len < MIN_TOKEN_CHARS {
        return Err(Error::Usage(format!(
            "the token in {shown} is {len} characters, too short to resist guessing (at least \
             {MIN_TOKEN_CHARS}, 128 bits in hex): write a new one with hsxfer token new FILE"
        )));
    }
    Ok(token)
}

/// Whether a process of effective uid `me` may use a token file owned by `owner`: its own,
/// root's, or, for root run through sudo, the file of the user who ran sudo (`SUDO_UID`),
/// who can run hsxfer as root anyway.
fn trusted_owner(owner: u32, me: u32, sudo_uid: Option<u32>) -> bool {
    owner == me || owner == 0 || (me == 0 && sudo_uid == Some(owner))
}

/// A new random token for one session, in hex (what a one-shot server announces).
pub fn one_time() -> String {
    hex::encode(rand::random::<[u8; NEW_TOKEN_BYTES]>())
}

/// The secret in hsxfer's configuration directory that `copy --ssh` derives its tokens from.
const SSH_SECRET: &str = "ssh-secret";

/// The token `copy --ssh` hands the one-shot server it starts on `target` (`[USER@]HOST`)
/// serving `root` (`serve --stdio --token-stdin`): derived from a secret in hsxfer's
/// configuration directory (`ssh-secret`, made on first use, readable by its owner only),
/// so it is the same from copy to copy. Blocks are checked under a key derived from the
/// token, and a part file's journaled blocks are trusted only under the key they were
/// written with: with a new token each time, an interrupted copy could never resume.
pub fn for_ssh(target: &str, root: &str) -> Result<String> {
    let dir = crate::transport::tls::config_dir().ok_or_else(|| {
        Error::Usage(
            "no place for the secret of copies over SSH: set HOME or XDG_CONFIG_HOME".into(),
        )
    })?;
    let path = dir.join(SSH_SECRET);
    if !path.exists() {
        fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        // Another copy may have made it meanwhile: then it is read as made.
        if let Err(e) = new(&path) {
            if !path.exists() {
                return Err(e);
            }
        }
    }
    let secret = read(&path)?;
    let key = blake3::derive_key("hsxfer one-shot server token v1", &secret);
    let token = blake3::keyed_hash(&key, format!("{target}\0{root}").as_bytes());
    Ok(token.to_hex().to_string())
}

/// Writes a new random token to `path` (which must not exist), readable by its owner only.
///
/// # Examples
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("token");
/// hsxfer::session::token::new(&path).unwrap();
/// assert_eq!(hsxfer::session::token::read(&path).unwrap().len(), 65);
/// assert!(hsxfer::session::token::new(&path).is_err(), "never overwritten");
/// ```
pub fn new(path: &Path) -> Result<()> {
    let token: [u8; NEW_TOKEN_BYTES] = rand::random();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io(format!("creating token file {}", path.display())))?;
    writeln!(f, "{}", hex::encode(token))
        .map_err(Error::io(format!("writing token file {}", path.display())))
}

/// Refuses a token file inside the directory a server serves: a client could pull it.
pub fn check_outside(token: &Path, root: &Path) -> Result<()> {
    let (Ok(t), Ok(r)) = (token.canonicalize(), root.canonicalize()) else {
        return Ok(());
    };
    if t.starts_with(&r) {
        return Err(Error::Usage(format!(
            "token file {} lies inside the served root {}: any client could pull it; keep it \
             outside",
            token.display(),
            root.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn weak_or_exposed_tokens_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        new(&p).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert!(read(&p).is_ok());
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        let short = d.path().join("s");
        fs::write(&short, "s3cret\n").unwrap();
        fs::set_permissions(&short, fs::Permissions::from_mode(0o600)).unwrap();
        let e = read(&short).unwrap_err().to_string();
        assert!(
            e.contains("is 6 characters") && e.contains("token new"),
            "{e}"
        );
        assert!(check_outside(&p, d.path()).is_err());
        assert!(check_outside(&p, &d.path().join("..").join("elsewhere")).is_ok());
    }

    #[test]
    fn a_token_file_is_its_users_roots_or_under_sudo_the_invoking_users() {
        assert!(trusted_owner(1000, 1000, None));
        assert!(trusted_owner(0, 1000, None));
        assert!(!trusted_owner(1001, 1000, None));
        assert!(
            !trusted_owner(1001, 1000, Some(1001)),
            "sudo to a user other than root"
        );
        assert!(trusted_owner(1000, 0, Some(1000)));
        assert!(!trusted_owner(1001, 0, Some(1000)));
        assert!(!trusted_owner(65534, 0, None));
    }
}
