//! What a user can do about an operating-system error they can act on: a limit on open
//! files, a port already taken. Appended to the messages of the errors that carry one.

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
        _ => "",
    }
}
