//! iproute2's `ip mptcp`, through which the in-kernel path manager is set (as root).

use std::io;
use std::process::Command;

/// Runs `ip mptcp ARGS` and returns its output; a failure carries its stderr.
pub(super) fn ip(args: &[&str]) -> io::Result<String> {
    run("ip", args)
}

/// [`ip`] with the program `ip` names: one that is missing is named, with where to get it
/// (a bare "No such file or directory" said nothing).
fn run(program: &str, args: &[&str]) -> io::Result<String> {
    let line = || format!("{program} mptcp {}", args.join(" "));
    let out = Command::new(program)
        .arg("mptcp")
        .args(args)
        .output()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => io::Error::new(
                e.kind(),
                format!(
                    "{}: '{program}' is not installed (apt-get install iproute2)",
                    line()
                ),
            ),
            _ => io::Error::new(e.kind(), format!("{}: {e}", line())),
        })?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{}: {}",
            line(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ip_program_is_named_with_where_to_get_it() {
        let e = run("hsxfer-test-no-such-ip", &["limits", "show"]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("hsxfer-test-no-such-ip mptcp limits show: "),
            "{text}"
        );
        assert!(text.contains("apt-get install iproute2"), "{text}");
    }
}
