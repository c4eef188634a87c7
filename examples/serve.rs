//! Serves a directory until Ctrl-C.
//!
//! ```sh
//! cargo run --release --example serve -- ROOT [PORT [TOKEN_FILE]]
//! ```
//!
//! Prints `listening on IP:PORT` once bound (port 0 takes a free one). Without a token file
//! it listens on 127.0.0.1 only.

use std::net::{IpAddr, Ipv4Addr};

use hsxfer::Server;

#[tokio::main]
async fn main() -> hsxfer::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, rest @ ..] = args.as_slice() else {
        eprintln!("usage: serve ROOT [PORT [TOKEN_FILE]]");
        std::process::exit(2);
    };
    let port = rest.first().map_or(Ok(hsxfer::DEFAULT_PORT), |p| p.parse());
    let Ok(port) = port else {
        eprintln!("serve: PORT must be a number from 0 to 65535");
        std::process::exit(2);
    };
    let mut builder = Server::builder(root).port(port);
    if let Some(token) = rest.get(1) {
        builder = builder
            .token_file(token)
            .listen(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    }
    let server = builder.bind().await?;
    println!("listening on {}", server.local_addr());
    tokio::select! {
        served = server.run() => served,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
