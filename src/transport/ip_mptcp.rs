//! iproute2's `ip mptcp`, through which the in-kernel path manager is set (as root).

use std::io;
use std::process::Command;

/// Runs `ip mptcp ARGS` and returns its output; a failure carries its stderr.
pub(super) fn ip(args: &[&str]) -> io::Result<String> {
    let out = Command::new("ip").arg("mptcp").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip mptcp {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
