//! Starting a server over SSH, with no daemon: `ssh [USER@]HOST hsxfer serve --once --stdio`
//! runs a one-shot server as the remote user, which announces its port and its token on the
//! SSH channel ([`crate::channels::oneshot`]): a one-time token, or the one the client hands
//! it there (`--token-stdin`, so that an interrupted copy resumes). The client then opens
//! the control connection and the data channels directly to that port, as bbcp and EScp do.
//! The server ends with its session, or as soon as the SSH channel closes.

use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use super::Auth;
use crate::channels::oneshot::Announcement;
use crate::error::{Error, Result};
use crate::transport::tls::{BadFingerprint, Fingerprint};

/// How long the client waits for the announcement (SSH may ask for a password first).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the client waits for the remote server (and so `ssh`) to exit after the copy.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most lines skipped before the announcement (a login shell's greetings).
const MAX_SKIPPED_LINES: usize = 1000;

/// How to reach the remote host and run hsxfer there.
#[derive(Debug, Clone)]
pub struct SshLaunch {
    /// The SSH command and its options, e.g. `["ssh", "-p", "2222"]`.
    pub command: Vec<String>,
    /// The hsxfer program on the remote host.
    pub remote_hsxfer: String,
    /// The address the one-shot server listens on (default: the one SSH came in on).
    pub listen: Option<IpAddr>,
    /// Its port (default: any free one), for a firewall that opens only some.
    pub port: Option<u16>,
    /// The token the server is to use, handed over on the SSH channel, instead of a
    /// one-time one it makes: the same token from copy to copy lets an interrupted copy
    /// resume (see [`super::token::for_ssh`]).
    pub token: Option<String>,
}

impl Default for SshLaunch {
    fn default() -> Self {
        SshLaunch {
            command: vec!["ssh".into()],
            remote_hsxfer: "hsxfer".into(),
            listen: None,
            port: None,
            token: None,
        }
    }
}

/// A one-shot server started over SSH; [`OneShot::finish`] ends it.
pub struct OneShot {
    /// The port it listens on.
    pub port: u16,
    /// The one-time token of its session.
    pub auth: Auth,
    /// The fingerprint of its TLS key, which the copy pins.
    pub key: Fingerprint,
    child: Child,
    /// Held open for the whole copy: the remote server exits when it closes.
    stdin: Option<ChildStdin>,
}

impl SshLaunch {
    /// Runs `hsxfer serve --once --stdio --root ROOT` on `target` (`[USER@]HOST`) and waits
    /// for its announcement. `root` is the directory remote paths are taken from (`/` for
    /// absolute paths, `.` for paths relative to the remote user's home).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> hsxfer::Result<()> {
    /// use hsxfer::session::ssh::SshLaunch;
    ///
    /// let server = SshLaunch::default().start("alice@dtn.example.org", ".").await?;
    /// println!("one-shot server on port {}", server.port);
    /// server.finish().await;
    /// # Ok(()) }
    /// ```
    pub async fn start(&self, target: &str, root: &str) -> Result<OneShot> {
        if target.starts_with('-') {
            // ssh would read it as an option: `-oProxyCommand=...` runs a command here.
            return Err(Error::Usage(format!(
                "host '{target}' starts with '-': name a host (write a local path as ./{target})"
            )));
        }
        let (program, options) = self
            .command
            .split_first()
            .ok_or_else(|| Error::Usage("`SshLaunch::command` is empty".into()))?;
        let mut words: Vec<String> = ["serve", "--once", "--stdio", "--root", root]
            .iter()
            .map(|w| w.to_string())
            .collect();
        if let Some(a) = self.listen {
            words.extend(["--listen".into(), a.to_string()]);
        }
        if let Some(p) = self.port {
            words.extend(["--port".into(), p.to_string()]);
        }
        if self.token.is_some() {
            words.push("--token-stdin".into());
        }
        // ssh joins the remote command's words with spaces for the remote shell: quote each.
        let remote = std::iter::once(&self.remote_hsxfer)
            .chain(&words)
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = Command::new(program)
            .args(options)
            .arg(target)
            .arg(remote)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(Error::io(format!("running {program}")))?;
        if let Some(t) = &self.token {
            // Through the SSH channel: never on a command line, where `ps` would show it. An
            // ssh that already failed is reported below, with its exit status.
            let stdin = child.stdin.as_mut().expect("piped stdin");
            let _ = stdin.write_all(format!("{t}\n").as_bytes()).await;
        }
        let stdout = child.stdout.take().expect("piped stdout");
        let read = async {
            let mut lines = BufReader::new(stdout).lines();
            for _ in 0..MAX_SKIPPED_LINES {
                match lines.next_line().await {
                    Ok(Some(line)) => match Announcement::parse(&line) {
                        Ok(Some(a)) => return Ok(Some(a)),
                        Ok(None) => continue,
                        Err(e) => return Err(Error::Ssh(e.to_string())),
                    },
                    _ => return Ok(None),
                }
            }
            Ok(None)
        };
        let announced = match tokio::time::timeout(START_TIMEOUT, read).await {
            Ok(r) => r?,
            Err(_) => return Err(Error::Timeout("waiting for the one-shot server over ssh")),
        };
        let Some(a) = announced else {
            let status = tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await;
            let how = match status {
                Ok(Ok(s)) => match s.code() {
                    Some(c) => format!("ssh exited with status {c}"),
                    None => "ssh was killed".to_string(),
                },
                _ => "ssh closed its output".to_string(),
            };
            return Err(Error::Ssh(format!(
                "no hsxfer server started on {target} over ssh ({how}): check that `{} {target}` \
                 logs in, and that hsxfer is installed there (or name it with `SshLaunch::remote_hsxfer`)",
                self.command.join(" ")
            )));
        };
        let stdin = child.stdin.take();
        let key = a
            .key
            .parse()
            .map_err(|e: BadFingerprint| Error::Ssh(e.to_string()))?;
        Ok(OneShot {
            port: a.port,
            key,
            auth: Auth::Token(a.token.into_bytes()),
            child,
            stdin,
        })
    }
}

impl OneShot {
    /// Ends the remote server: closes the SSH channel's input (the server exits at once if
    /// it has not already) and waits for `ssh` to exit, killing it after a few seconds.
    pub async fn finish(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(EXIT_TIMEOUT, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Quotes a word for a POSIX shell: as it is when no shell treats any of its characters
/// specially, else in single quotes.
///
/// # Examples
///
/// ```
/// use hsxfer::session::ssh::shell_quote;
///
/// assert_eq!(shell_quote("--port"), "--port");
/// assert_eq!(shell_quote("/etc/my token"), "'/etc/my token'");
/// ```
pub fn shell_quote(w: &str) -> String {
    if !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:@+,".contains(&b))
    {
        return w.to_string();
    }
    format!("'{}'", w.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_reach_the_remote_shell_unchanged() {
        assert_eq!(shell_quote("/usr/bin/hsxfer"), "/usr/bin/hsxfer");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's; rm -rf ~"), r"'it'\''s; rm -rf ~'");
    }

    /// A host that starts with '-' never reaches ssh, which would read it as an option
    /// (`-oProxyCommand=CMD` ran CMD here).
    #[tokio::test]
    async fn a_host_that_looks_like_an_option_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let launch = SshLaunch {
            command: vec![
                "sh".into(),
                "-c".into(),
                format!("touch {}; exit 1", ran.display()),
                "sh".into(),
            ],
            ..SshLaunch::default()
        };
        let e = launch
            .start("-oProxyCommand=touch pwned", ".")
            .await
            .err()
            .unwrap();
        assert!(matches!(e, Error::Usage(_)), "{e}");
        assert!(e.to_string().contains("starts with '-'"), "{e}");
        assert!(!ran.exists(), "ssh was run");
    }

    #[tokio::test]
    async fn a_command_that_announces_nothing_is_a_one_line_error() {
        let launch = SshLaunch {
            command: vec!["sh".into(), "-c".into(), "echo hello; exit 127".into()],
            ..SshLaunch::default()
        };
        let e = launch.start("host", ".").await.err().unwrap().to_string();
        assert!(
            e.contains("status 127") && e.contains("`SshLaunch::remote_hsxfer`"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn the_announcement_is_found_after_other_lines() {
        let line = Announcement {
            port: 4242,
            token: "ab".repeat(32),
            key: "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU".into(),
        };
        let script = format!("echo motd; echo '{line}'; cat >/dev/null");
        let launch = SshLaunch {
            command: vec!["sh".into(), "-c".into(), script],
            ..SshLaunch::default()
        };
        let s = launch.start("host", ".").await.unwrap();
        assert_eq!(s.port, 4242);
        assert_eq!(s.auth, Auth::Token("ab".repeat(32).into_bytes()));
        // `cat` ends when the input closes: finish must not need the kill.
        let t = std::time::Instant::now();
        s.finish().await;
        assert!(t.elapsed() < EXIT_TIMEOUT);
    }
}
