//! The library's messages name options as their fields (`` `token_file` ``,
//! `` `ServerLimits::sessions` ``), the way an embedder or the Python package sets them; the
//! command shows the flag that sets each instead.

/// Each option as the library's messages name it, and the command's flag for it.
const FLAGS: &[(&str, &str)] = &[
    (
        "`ServerLimits::sessions_per_address`",
        "--max-sessions-per-address",
    ),
    ("`ServerLimits::sessions`", "--max-sessions"),
    (
        "`ServerLimits::channels_per_address`",
        "--max-channels-per-address",
    ),
    ("`ServerLimits::channels`", "--max-channels"),
    ("`SshLaunch::command`", "--ssh-command"),
    ("`ServerBuilder::allow_clear`", "--no-encrypt"),
    ("`Security::Clear`", "--no-encrypt"),
    ("`Trust::Pinned`", "--server-fingerprint"),
    ("`SshLaunch::remote_hsxfer`", "--remote-hsxfer PATH"),
    ("`token_file`", "--token-file FILE"),
    ("`key_file`", "--key-file FILE"),
    ("`no_auth`", "--no-auth"),
    ("`recursive`", "--recursive"),
    ("`mptcp`", "--mptcp"),
    ("`block_size`", "--block-size"),
    ("`buffer`", "--buffer"),
    ("`budget`", "--budget"),
    ("`policy`", "--policy"),
    ("`rate`", "--rate"),
    ("`pace`", "--pace"),
    ("`tune`", "--tune"),
    ("`rtt`", "--rtt"),
    ("`port`", "--port"),
    ("`ssh`", "--ssh"),
    ("`cc`", "--cc"),
];

/// `text` with every option field it names replaced by the command's flag.
pub(crate) fn as_flags(text: &str) -> String {
    FLAGS
        .iter()
        .fold(text.to_string(), |t, (field, flag)| t.replace(field, flag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn fields_become_flags() {
        assert_eq!(
            as_flags("wrong token (give the server's token with `token_file`, or `no_auth` ...)"),
            "wrong token (give the server's token with --token-file FILE, or --no-auth ...)"
        );
        assert_eq!(
            as_flags("(the server's `ServerLimits::sessions` raises the limit)"),
            "(the server's --max-sessions raises the limit)"
        );
        // Other backquoted text is left alone.
        assert_eq!(
            as_flags("run `sudo hsxfer cc load dmctcp --pin`"),
            "run `sudo hsxfer cc load dmctcp --pin`"
        );
    }

    /// Every flag in the table is one the command has.
    #[test]
    fn every_flag_exists() {
        let mut longs = Vec::new();
        let mut stack = vec![super::super::Cli::command()];
        while let Some(c) = stack.pop() {
            longs.extend(
                c.get_arguments()
                    .filter_map(|a| a.get_long().map(String::from)),
            );
            stack.extend(c.get_subcommands().cloned());
        }
        for (_, flag) in FLAGS {
            let long = flag.split(' ').next().unwrap().trim_start_matches("--");
            assert!(
                longs.iter().any(|l| l == long),
                "{flag} is not a flag of hsxfer"
            );
        }
    }

    /// The library names options as fields, never as the command's flags. The exceptions
    /// are whole commands to run, the remote command line that `copy --ssh` builds and the
    /// probe's recommended command line.
    #[test]
    fn library_messages_name_fields_not_flags() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src.clone()];
        let mut offenders = Vec::new();
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(&src).unwrap().to_string_lossy().to_string();
                if rel == "cli" || rel == "lab" || rel == "main.rs" {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let code = line.trim_start();
                    if code.starts_with("//") || code.starts_with("#[arg") {
                        continue;
                    }
                    // Whole commands, the remote command line of `copy --ssh`, and the probe's
                    // recommendation, which is a command line by design.
                    let commands = [
                        "hsxfer cc load",
                        "\"serve\", \"--once\"",
                        "\"--listen\"",
                        "\"--port\"",
                        "\"--token-stdin\"",
                        "\"-n ",
                        "\" --rate ",
                        "\" --pace off\"",
                        "\"--mptcp {}\"",
                    ];
                    let in_string = code.split('"').skip(1).step_by(2).any(|s| {
                        s.contains("--") && s.split_whitespace().any(|w| w.starts_with("--"))
                    });
                    if in_string && !commands.iter().any(|c| code.contains(c)) {
                        offenders.push(format!("src/{rel}:{}: {code}", n + 1));
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "library text naming flags:\n{}",
            offenders.join("\n")
        );
    }
}
