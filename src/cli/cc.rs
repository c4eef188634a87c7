//! `hsxfer cc`: the congestion controls of this host and hsxfer's bundled BPF ones: list them,
//! register them (for as long as the command runs, or pinned), unregister them.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hsxfer::tuning::bundled::inspect::{self, Origin};
use hsxfer::tuning::bundled::{self, Registration, BUNDLED};

/// Options of `hsxfer cc`.
#[derive(Args)]
pub struct CcArgs {
    #[command(subcommand)]
    command: CcCommand,
}

#[derive(Subcommand)]
enum CcCommand {
    /// Kernel and bundled congestion controls: registered or not, by whom, allowed or not,
    /// and the guard's repair counters of hsxfer's programs.
    List {
        /// One JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Register bundled congestion controls (root). Without --pin they stay registered while
    /// this command runs (until Ctrl-C); with --pin they stay until `hsxfer cc unload`.
    Load {
        /// Names (dmctcp highspeed scalable htcp bic dmctcp_classic), or `all`.
        #[arg(required = true, value_name = "NAME|all")]
        names: Vec<String>,
        /// Pin them under /sys/fs/bpf/hsxfer and return at once, with the maps users without
        /// root need to group dmctcp channels and read the counters (docs/cc.md, "Groups").
        #[arg(long)]
        pin: bool,
    },
    /// Unregister bundled congestion controls, pinned or held by a running process (root).
    /// Sockets using one keep it until they close.
    Unload {
        /// Names, or `all`.
        #[arg(required = true, value_name = "NAME|all")]
        names: Vec<String>,
    },
}

/// Runs `hsxfer cc`.
pub async fn cc(a: CcArgs) -> anyhow::Result<bool> {
    match a.command {
        CcCommand::List { json } => list(json),
        CcCommand::Load { names, pin } => load(&expand(&names)?, pin).await,
        CcCommand::Unload { names } => unload(&expand(&names)?),
    }
}

/// `all` or bundled names, checked.
fn expand(names: &[String]) -> anyhow::Result<Vec<&'static str>> {
    if names.iter().any(|n| n == "all") {
        return Ok(BUNDLED.iter().map(|b| b.name).collect());
    }
    names
        .iter()
        .map(|n| {
            bundled::find(n)
                .map(|b| b.name)
                .ok_or_else(|| bundled::BundledError::Unknown(n.clone()).into())
        })
        .collect()
}

fn list(json: bool) -> anyhow::Result<bool> {
    let entries = inspect::list().context("reading the congestion controls")?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(true);
    }
    outln!(
        "{:<14} {:<32} {:<8} {:<8} {:>8} {:>8}",
        "NAME",
        "REGISTERED",
        "ALLOWED",
        "BUNDLED",
        "SOCKETS",
        "REPAIRS"
    );
    for e in &entries {
        let (sockets, repairs) = match e.stats {
            Some(s) => (s.sockets.to_string(), s.repairs().to_string()),
            None => ("-".into(), "-".into()),
        };
        let origin = match (e.origin, e.default) {
            (o, true) => format!("{} (default)", o.describe()),
            (o, false) => o.describe().to_string(),
        };
        outln!(
            "{:<14} {:<32} {:<8} {:<8} {:>8} {:>8}",
            e.name,
            origin,
            match (e.origin, e.allowed) {
                (Origin::Absent, _) => "-",
                (_, true) => "yes",
                (_, false) => "root",
            },
            if e.bundled { "yes" } else { "-" },
            sockets,
            repairs
        );
    }
    let absent: Vec<&str> = entries
        .iter()
        .filter(|e| e.bundled && e.origin == Origin::Absent)
        .map(|e| e.name.as_str())
        .collect();
    if !absent.is_empty() {
        outln!(
            "not registered: {}; run `hsxfer cc load NAME --pin` (root) to make one available",
            absent.join(" ")
        );
    }
    Ok(true)
}

async fn load(names: &[&'static str], pin: bool) -> anyhow::Result<bool> {
    let mut held = Vec::new();
    for name in names {
        let cc = bundled::find(name).expect("expanded names are bundled");
        match Registration::load(cc) {
            Ok(mut reg) => {
                if pin {
                    let pinned = reg.pin()?;
                    if pinned.opened_bpffs {
                        outln!("/sys/fs/bpf: others may now pass through it (o+x), to reach the maps hsxfer shares with users without root");
                    }
                    outln!("{name}: registered and pinned at {}", pinned.path.display());
                } else {
                    outln!("{name}: registered");
                }
                held.push(reg);
            }
            Err(bundled::BundledError::AlreadyRegistered(n, by)) => {
                outln!("{n}: already registered ({by}), left as it is");
            }
            Err(e) => bail!(e),
        }
    }
    if pin || held.is_empty() {
        return Ok(true);
    }
    outln!("holding them until Ctrl-C (or `hsxfer cc unload`); --pin keeps them without a process");
    tokio::signal::ctrl_c().await?;
    drop(held);
    outln!("unregistered");
    Ok(true)
}

fn unload(names: &[&'static str]) -> anyhow::Result<bool> {
    if !hsxfer::transport::cc::privileged() {
        // Without it nothing can be detached or unpinned, and nothing says so.
        bail!(
            "unregistering congestion controls needs root (CAP_BPF and CAP_NET_ADMIN): run \
             `sudo hsxfer cc unload {}`",
            names.join(" ")
        );
    }
    for name in names {
        let origin = inspect::origin(name);
        if origin == Origin::Kernel {
            outln!("{name}: provided by the kernel, not by hsxfer; left alone");
            continue;
        }
        let unpinned = bundled::unpin(name)?;
        let detached = bundled::detach(name)?;
        match (unpinned, detached) {
            (false, 0) if origin == Origin::Absent => outln!("{name}: not registered"),
            _ => outln!("{name}: unregistered"),
        }
    }
    Ok(true)
}
