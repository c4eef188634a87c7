#!/usr/bin/env bash
# One command from a fresh clone: install, build, and show a transfer. Starts a local server
# (token-authenticated, on loopback), pushes a generated dataset (a 1 GiB file and a tree of
# 2,000 small files) over 8 channels, pulls it back, checks it with sha256sum, and prints the
# per-channel goodput of each transfer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release --quiet --features cli
BIN="$PWD/target/release/hsxfer"
WORK=$(mktemp -d /tmp/hsxfer-demo.XXXXXX)
SERVER_PID=""
LAB=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    [ -n "$LAB" ] && "$BIN" lab down --name "$LAB" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/src/dataset/tree" "$WORK/root" "$WORK/back"
"$BIN" token new "$WORK/token"
echo "== generating a dataset: 1 GiB file + 2,000 small files"
head -c 1G /dev/urandom > "$WORK/src/dataset/big.bin"
for d in $(seq -w 0 19); do
    mkdir -p "$WORK/src/dataset/tree/d$d"
    for f in $(seq -w 0 99); do printf 'file %s/%s\n' "$d" "$f" > "$WORK/src/dataset/tree/d$d/f$f"; done
done
mkdir -p "$WORK/src/dataset/tree/empty-dir"
PORT=$((20000 + RANDOM % 20000))
"$BIN" serve --root "$WORK/root" --listen 127.0.0.1 --port "$PORT" --token-file "$WORK/token" 2>"$WORK/server.log" &
SERVER_PID=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.05; done
echo "== push: hsxfer copy -n 8 -r dataset 127.0.0.1:dataset"
"$BIN" copy -n 8 -r --port "$PORT" --token-file "$WORK/token" "$WORK/src/dataset" "127.0.0.1:dataset"
echo "== pull: hsxfer copy -n 8 -r 127.0.0.1:dataset back/"
"$BIN" copy -n 8 -r --port "$PORT" --token-file "$WORK/token" "127.0.0.1:dataset" "$WORK/back/"
echo "== memory-to-memory: hsxfer bench -n 8 --time 5 --cc reno --trace cwnd.csv"
"$BIN" bench -n 8 --time 5 --cc reno --trace "$WORK/cwnd.csv" --port "$PORT" --token-file "$WORK/token" 127.0.0.1
echo "   trace: $(($(wc -l < "$WORK/cwnd.csv") - 1)) TCP_INFO samples; first rows:"
head -n 3 "$WORK/cwnd.csv" | sed 's/^/   /'
echo "== host checks: hsxfer doctor --rate 10G --rtt 100ms"
"$BIN" doctor --rate 10G --rtt 100ms || true
if [ "$(id -u)" -eq 0 ]; then
    LAB=demo
    echo "== emulated WAN: hsxfer lab up --rate 200M --rtt 40ms --buffer 32 (namespaces, delay element, self-check)"
    "$BIN" lab down --name "$LAB" >/dev/null 2>&1 || true
    "$BIN" lab up --name "$LAB" --rate 200M --rtt 40ms --buffer 32
    echo "== 4 reno channels through its 32-packet bottleneck"
    "$BIN" lab exec sender1 --name "$LAB" -- "$BIN" bench 10.77.0.2 --cc reno -n 4 --time 5 \
        --token-file "/run/hsxfer/lab/$LAB/token"
    "$BIN" lab status --name "$LAB"
    "$BIN" lab down --name "$LAB"
    LAB=""
else
    echo "== (the emulated-WAN part of the demo needs root: sudo bash scripts/demo.sh)"
fi
echo "== independent check (sha256sum of every file, source vs pulled back)"
(cd "$WORK/src" && find dataset -type f -print0 | sort -z | xargs -0 sha256sum) > "$WORK/a.sum"
(cd "$WORK/back" && find dataset -type f -print0 | sort -z | xargs -0 sha256sum) > "$WORK/b.sum"
if cmp -s "$WORK/a.sum" "$WORK/b.sum" && [ -d "$WORK/back/dataset/tree/empty-dir" ]; then
    echo "OK: $(wc -l < "$WORK/a.sum") files identical after push and pull"
else
    echo "MISMATCH"; exit 1
fi
