//! Memory to memory through the whole protocol for a few seconds, then the summary as JSON
//! (the same fields as `hsxfer bench --json`'s last line).
//!
//! ```sh
//! cargo run --release --example bench -- HOST PORT TOKEN_FILE [SECONDS]
//! ```

use std::sync::Arc;

use hsxfer::{BenchAmount, BenchDirection, Client, LiveStats};

#[tokio::main]
async fn main() -> hsxfer::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [host, port, token, rest @ ..] = args.as_slice() else {
        eprintln!("usage: bench HOST PORT TOKEN_FILE [SECONDS]");
        std::process::exit(2);
    };
    let (Ok(port), Ok(seconds)) = (
        port.parse(),
        rest.first().map_or(Ok(3.0), |s| s.parse::<f64>()),
    ) else {
        eprintln!("bench: PORT must be a port number and SECONDS a number");
        std::process::exit(2);
    };
    let mut builder = Client::builder(host).port(port);
    if token != "-" {
        builder = builder.token_file(token);
    }
    let live = Arc::new(LiveStats::default());
    let report = builder
        .build()?
        .bench(BenchDirection::Upload, BenchAmount::Seconds(seconds), &live)
        .await?;
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("a report serializes")
    );
    Ok(())
}
