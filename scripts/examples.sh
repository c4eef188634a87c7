#!/usr/bin/env bash
# Builds the library's examples (examples/) and runs them against each other on loopback:
# serve a temporary root, push a tree into it, pull it back with progress, bench. Fails if
# any example fails or the pulled tree differs from the pushed one. Called by test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# --all-features: the build cargo test --all-targets made already (the examples use no feature).
cargo build --release --quiet --examples --all-features
EX="$PWD/target/release/examples"
WORK=$(mktemp -d /tmp/hsxfer-examples.XXXXXX)
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/root/in" "$WORK/data/sub" "$WORK/back"
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$WORK/token")
head -c 5000000 /dev/urandom > "$WORK/data/big"
for i in $(seq 1 50); do head -c $((i * 100)) /dev/urandom > "$WORK/data/sub/f$i"; done

"$EX/serve" "$WORK/root" 0 "$WORK/token" > "$WORK/serve.out" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
    grep -q '^listening on' "$WORK/serve.out" && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/serve.out"; exit 1; }
    sleep 0.1
done
PORT=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$WORK/serve.out")
[ -n "$PORT" ] || { echo "examples: the serve example did not say its port"; cat "$WORK/serve.out"; exit 1; }

"$EX/push" 127.0.0.1 "$PORT" "$WORK/token" in "$WORK/data"
"$EX/pull_with_progress" 127.0.0.1 "$PORT" "$WORK/token" "$WORK/back" in/data | tail -n 2
diff -r "$WORK/data" "$WORK/back/data"
"$EX/bench" 127.0.0.1 "$PORT" "$WORK/token" 1 | grep -q '"operation": "bench-upload"'
echo "examples: serve, push, pull_with_progress and bench ran; the pulled tree is identical"
