//! Pushes files or directory trees to a server and prints the report.
//!
//! ```sh
//! cargo run --release --example push -- HOST PORT TOKEN_FILE DEST SOURCE...
//! ```
//!
//! `DEST` is relative to the server's root (an existing directory, or a new name for one
//! source). `TOKEN_FILE` `-` means none (a `--no-auth` server on loopback).

use std::path::PathBuf;
use std::sync::Arc;

use hsxfer::{Client, LiveStats};

#[tokio::main]
async fn main() -> hsxfer::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [host, port, token, dest, sources @ ..] = args.as_slice() else {
        eprintln!("usage: push HOST PORT TOKEN_FILE DEST SOURCE...");
        std::process::exit(2);
    };
    let Ok(port) = port.parse() else {
        eprintln!("push: PORT must be a number from 1 to 65535");
        std::process::exit(2);
    };
    let mut builder = Client::builder(host).port(port);
    if token != "-" {
        builder = builder.token_file(token);
    }
    let client = builder.build()?;
    let sources: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
    let live = Arc::new(LiveStats::default());
    let report = client.push(&sources, true, dest, &live).await?;
    println!(
        "pushed {} files, {} bytes in {:.2} s ({:.0} Mbit/s) over {} channels; verified: {}",
        report.files,
        report.bytes,
        report.seconds,
        report.goodput_bps / 1e6,
        report.channels.len(),
        report.verified
    );
    Ok(())
}
