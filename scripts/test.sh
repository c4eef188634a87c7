#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests (real sockets on
# loopback; the disk-full test mounts a small tmpfs and needs root, as CI has), the fuzz
# targets' decoders on random input, and a build of the benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release --all-targets
