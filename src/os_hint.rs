//! What a user can do about an operating-system error they can act on: a limit on open
//! files, a port already taken, a full or read-only filesystem. Appended to the messages of
//! the errors that carry one, which a server also sends to its client.

use std::io;

/// The hint for `e`, with a leading space, or an empty string.
pub(crate) fn for_io(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) => {
            " (the open-files limit of the process that hit it: raise `ulimit -n`)"
        }
        Some(libc::ENFILE) => " (the system's open-files limit: raise `fs.file-max`)",
        Some(libc::EADDRINUSE) => {
            " (another program listens there: stop it or choose another port)"
        }
        Some(libc::ENOSPC) => {
            " (the filesystem is full: free space there, then run the same copy again: it \
             resumes where it stopped)"
        }
        Some(libc::EDQUOT) => {
            " (the disk quota there is used up: free space or ask for more, then run the same \
             copy again: it resumes where it stopped)"
        }
        Some(libc::EROFS) => " (the filesystem is mounted read-only: choose another destination)",
        _ => "",
    }
}
