//! Pulls files from a server, printing progress every 200 ms while the copy runs.
//!
//! ```sh
//! cargo run --release --example pull_with_progress -- HOST PORT TOKEN_FILE DEST SOURCE...
//! ```
//!
//! `SOURCE`s are relative to the server's root; `DEST` is local. `TOKEN_FILE` `-` means
//! none.

use std::sync::Arc;
use std::time::Duration;

use hsxfer::{Client, LiveStats};

#[tokio::main]
async fn main() -> hsxfer::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [host, port, token, dest, sources @ ..] = args.as_slice() else {
        eprintln!("usage: pull_with_progress HOST PORT TOKEN_FILE DEST SOURCE...");
        std::process::exit(2);
    };
    let Ok(port) = port.parse() else {
        eprintln!("pull_with_progress: PORT must be a number from 1 to 65535");
        std::process::exit(2);
    };
    let mut builder = Client::builder(host).port(port).channels(4);
    if token != "-" {
        builder = builder.token_file(token);
    }
    let client = builder.build()?;
    // The counters grow as channels open; another task reads them while the copy runs.
    let live = Arc::new(LiveStats::default());
    let watch = live.clone();
    let progress = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            println!(
                "{:6.1} s  {} of {} bytes, {} files, per channel {:?}",
                watch.elapsed(),
                watch.total(),
                watch.expected(),
                watch.files_done(),
                watch.channel_bytes()
            );
        }
    });
    let report = client.pull(sources, true, dest, &live).await;
    progress.abort();
    let report = report?;
    println!(
        "pulled {} files, {} bytes at {:.0} Mbit/s; verified: {}",
        report.files,
        report.bytes,
        report.goodput_bps / 1e6,
        report.verified
    );
    Ok(())
}
