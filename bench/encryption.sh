#!/usr/bin/env bash
# bench/encryption.sh — what TLS costs: `hsxfer bench -n N` on loopback, encrypted (the
# default) against `--no-encrypt`, alternated run by run against one server that allows both.
# Reports each run, the medians, the ratio encrypted / clear (issue 14's target: >= 0.85) and
# the CPU seconds per GB of both processes. Both ends share this host's cores, so each run
# pays for both ends' encryption and decryption.
#
#   bench/encryption.sh [--runs R] [--time SECS] [--streams N]
#
# Environment: HSXFER=/path/to/hsxfer (default: target/release/hsxfer, built if missing).
set -euo pipefail
export LC_ALL=C
RUNS=3; TIME=5; STREAMS=8
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS=${2:?}; shift 2 ;;
        --time) TIME=${2:?}; shift 2 ;;
        --streams) STREAMS=${2:?}; shift 2 ;;
        -h|--help) sed -n 2,11p "$0"; exit 0 ;;
        *) echo "encryption.sh: unknown argument $1" >&2; exit 1 ;;
    esac
done
cd "$(dirname "$0")/.."
HSXFER=${HSXFER:-target/release/hsxfer}
[ -x "$HSXFER" ] || cargo build --release --features cli >&2
command -v jq >/dev/null || { echo "encryption.sh: needs jq" >&2; exit 1; }

WORK=$(mktemp -d)
export XDG_CONFIG_HOME="$WORK/config" XDG_CACHE_HOME="$WORK/cache"
mkdir -p "$WORK/root"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$HSXFER" serve --root "$WORK/root" --no-auth --no-encrypt --port "$PORT" 2>"$WORK/serve.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do grep -q serving "$WORK/serve.log" && break; sleep 0.05; done

cpu_s() { # utime + stime of a process, in seconds
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}

run() { # label flags...
    local label=$1; shift
    local before after out bps bytes client
    before=$(cpu_s $SERVER)
    out=$( { /usr/bin/time -f '%U %S' "$HSXFER" bench --no-auth --port "$PORT" -n "$STREAMS" \
        --time "$TIME" --json "$@" 127.0.0.1 | tail -n 1; } 2>"$WORK/time" )
    after=$(cpu_s $SERVER)
    bps=$(jq -r .goodput_bps <<<"$out"); bytes=$(jq -r .bytes <<<"$out")
    client=$(awk '{ print $1 + $2 }' "$WORK/time" | tail -n 1)
    awk -v l="$label" -v g="$bps" -v b="$bytes" -v c="$client" -v s="$(awk -v a="$after" -v b="$before" 'BEGIN{print a-b}')" \
        -v suite="$(jq -r '.cipher_suite // "none"' <<<"$out")" \
        'BEGIN { printf "| %s | %s | %.2f | %.2f | %.2f |\n", l, suite, g / 1e9, c / (b / 1e9), s / (b / 1e9) }'
    echo "$bps" >>"$WORK/$label"
}

echo "| run | cipher suite | Gbit/s | client CPU-s/GB | server CPU-s/GB |"
echo "|---|---|---|---|---|"
for r in $(seq "$RUNS"); do
    if [ $((r % 2)) -eq 1 ]; then run tls; run clear --no-encrypt
    else run clear --no-encrypt; run tls; fi
done
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
tls=$(median "$WORK/tls"); clear=$(median "$WORK/clear")
awk -v t="$tls" -v c="$clear" -v n="$STREAMS" 'BEGIN {
    printf "\nmedian of %s: encrypted %.2f Gbit/s, clear %.2f Gbit/s, ratio %.2f (target >= 0.85)\n", n " channels", t / 1e9, c / 1e9, t / c }'
