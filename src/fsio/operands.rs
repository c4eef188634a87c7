//! Telling remote operands (`HOST:PATH`, `[v6addr]:PATH`, `USER@HOST:PATH`,
//! `USER@[v6addr]:PATH`) from local paths, as scp does: a colon before the first slash makes
//! an operand remote; write `./a:b` for a local file whose name has a colon.

/// A parsed operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    /// A local path.
    Local(String),
    /// A path on a server.
    Remote {
        /// Host name or address (IPv6 without brackets), after `USER@` where one was given.
        host: String,
        /// Path relative to the server root.
        path: String,
    },
}

/// Parses one operand.
pub fn parse(s: &str) -> Operand {
    // A bracketed IPv6 address, with or without a user before it.
    let bracketed = s.strip_prefix('[').map(|rest| ("", rest)).or_else(|| {
        let (user, rest) = s.split_once("@[")?;
        (!user.is_empty() && !user.contains(['/', ':'])).then_some((user, rest))
    });
    if let Some((user, rest)) = bracketed {
        if let Some((addr, path)) = rest.split_once("]:") {
            return Operand::Remote {
                host: match user {
                    "" => addr.into(),
                    user => format!("{user}@{addr}"),
                },
                path: path.into(),
            };
        }
    }
    match s.find(':') {
        Some(i) if !s[..i].contains('/') && i > 0 => Operand::Remote {
            host: s[..i].into(),
            path: s[i + 1..].into(),
        },
        _ => Operand::Local(s.into()),
    }
}

/// A copy's direction, with its operands sorted out.
#[derive(Debug, PartialEq, Eq)]
pub enum Direction {
    /// Local sources to a server.
    Push {
        /// Server.
        host: String,
        /// Local sources.
        sources: Vec<String>,
        /// Remote destination.
        dest: String,
    },
    /// Server sources to a local destination.
    Pull {
        /// Server.
        host: String,
        /// Remote sources.
        sources: Vec<String>,
        /// Local destination.
        dest: String,
    },
}

/// Sorts `SRC... DST` into a push or a pull; mixed or all-local operands are refused.
pub fn direction(operands: &[String]) -> Result<Direction, String> {
    let (dst, srcs) = operands
        .split_last()
        .filter(|(_, s)| !s.is_empty())
        .ok_or("give at least one source and a destination")?;
    let srcs: Vec<Operand> = srcs.iter().map(|s| parse(s)).collect();
    match parse(dst) {
        Operand::Remote { host, path } => {
            let mut sources = Vec::new();
            for s in srcs {
                match s {
                    Operand::Local(p) => sources.push(p),
                    Operand::Remote { .. } => {
                        return Err(
                            "copying between two servers is not supported: one side must be local"
                                .into(),
                        )
                    }
                }
            }
            let dest = if path.is_empty() { ".".into() } else { path };
            Ok(Direction::Push {
                host,
                sources,
                dest,
            })
        }
        Operand::Local(dest) => {
            let mut host = None;
            let mut sources = Vec::new();
            for s in srcs {
                match s {
                    Operand::Remote { host: h, path } => {
                        if host.get_or_insert_with(|| h.clone()) != &h {
                            return Err("all remote sources must be on the same host".into());
                        }
                        sources.push(path);
                    }
                    Operand::Local(p) => {
                        return Err(format!(
                            "'{p}' and '{dest}' are both local: one side must be HOST:PATH"
                        ))
                    }
                }
            }
            let host = host.expect("at least one source");
            Ok(Direction::Pull {
                host,
                sources,
                dest,
            })
        }
    }
}

/// For `copy --ssh`: the one-shot server's root, `/` when every remote path is absolute
/// (they become relative to it) or `.` (the remote user's home) when none is.
pub fn ssh_root(dir: &mut Direction) -> Result<&'static str, String> {
    let paths: Vec<&mut String> = match dir {
        Direction::Push { dest, .. } => vec![dest],
        Direction::Pull { sources, .. } => sources.iter_mut().collect(),
    };
    let absolute = paths.iter().filter(|p| p.starts_with('/')).count();
    if absolute == 0 {
        return Ok(".");
    }
    if absolute < paths.len() {
        return Err(
            "with `ssh`, remote paths must be all absolute or all relative to the home directory"
                .into(),
        );
    }
    for p in paths {
        let rel = p.trim_start_matches('/');
        *p = if rel.is_empty() {
            ".".into()
        } else {
            rel.into()
        };
    }
    Ok("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ssh_roots() {
        let mut d = direction(&v(&["a", "h:/data/x"])).unwrap();
        assert_eq!(ssh_root(&mut d), Ok("/"));
        assert!(matches!(&d, Direction::Push { dest, .. } if dest == "data/x"));
        let mut d = direction(&v(&["a", "u@h:"])).unwrap();
        assert_eq!(ssh_root(&mut d), Ok("."));
        assert!(matches!(&d, Direction::Push { dest, host, .. } if dest == "." && host == "u@h"));
        let mut d = direction(&v(&["h:/", "b"])).unwrap();
        assert_eq!(ssh_root(&mut d), Ok("/"));
        assert!(matches!(&d, Direction::Pull { sources, .. } if sources == &v(&["."])));
        let mut d = direction(&v(&["h:/x", "h:y", "b"])).unwrap();
        assert!(ssh_root(&mut d).unwrap_err().contains("all absolute"));
    }

    #[test]
    fn operands() {
        assert_eq!(
            parse("[::1]:data/x"),
            Operand::Remote {
                host: "::1".into(),
                path: "data/x".into()
            }
        );
        assert_eq!(
            parse("alice@[fe80::1]:/data/in/"),
            Operand::Remote {
                host: "alice@fe80::1".into(),
                path: "/data/in/".into()
            }
        );
        assert_eq!(
            parse("alice@h:x"),
            Operand::Remote {
                host: "alice@h".into(),
                path: "x".into()
            }
        );
        assert_eq!(parse("./a@[b]:c"), Operand::Local("./a@[b]:c".into()));
        assert_eq!(parse("./a:b"), Operand::Local("./a:b".into()));
        assert_eq!(
            parse("host:"),
            Operand::Remote {
                host: "host".into(),
                path: "".into()
            }
        );
        assert_eq!(
            direction(&v(&["a", "b", "h:"])).unwrap(),
            Direction::Push {
                host: "h".into(),
                sources: v(&["a", "b"]),
                dest: ".".into()
            }
        );
        assert_eq!(
            direction(&v(&["10.0.0.1:x", "10.0.0.1:y", "d"])).unwrap(),
            Direction::Pull {
                host: "10.0.0.1".into(),
                sources: v(&["x", "y"]),
                dest: "d".into()
            }
        );
        assert!(direction(&v(&["a", "b"])).is_err());
        assert!(direction(&v(&["h:a", "g:b", "d"])).is_err());
        assert!(direction(&v(&["h:a", "g:b"])).is_err());
        assert!(direction(&v(&["h:a"])).is_err());
    }
}
