#!/usr/bin/env bash
# bench/mptcp.sh — MPTCP subflows against TCP channels (issue 16): `hsxfer bench` with N TCP
# channels and with one MPTCP connection of N subflows, each with cubic and dmctcp, paced
# (--rate, caps at 0.97 of it) and unpaced (--pace off), alternated TCP/MPTCP run by run.
# Reports goodput, its share of the goodput ceiling, retransmissions and the CPU seconds per
# GB of client and server. The in-kernel path manager gives a connection at most 9 subflows,
# so larger counts run 9 (the `subflows` column says what ran), unless --userspace-pm starts
# the server with `--mptcp-pm userspace` (then use only counts above 9: clients with fewer
# wait for announced ports, which that server does not make).
#
#   bench/mptcp.sh lab [--runs R] [--time SECS] [--counts "1 4 8 16"] [--rate 1G] [--rtt 60ms] [--buffer 64] [--userspace-pm]
#       builds `hsxfer lab up --name hsxmp ...` (root), serves on its receiver, runs the
#       clients on sender1, and removes the lab at the end.
#   bench/mptcp.sh loopback [--runs R] [--time SECS] [--counts "1 4 8"]
#       the CPU cost on loopback (no bottleneck; unpaced cubic only).
#
# Environment: HSXFER=/path/to/hsxfer (default: target/release/hsxfer, built if missing).
set -euo pipefail
export LC_ALL=C
WHERE=${1:-}
case "$WHERE" in lab|loopback) shift ;; -h|--help|*) sed -n 2,18p "$0"; exit 0 ;; esac
RUNS=1; TIME=20; RATE=1G; RTT=60ms; BUFFER=64; SERVE_PM=()
COUNTS="1 4 8 16"; [ "$WHERE" = loopback ] && { COUNTS="1 4 8"; TIME=5; }
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS=${2:?}; shift 2 ;;
        --time) TIME=${2:?}; shift 2 ;;
        --counts) COUNTS=${2:?}; shift 2 ;;
        --rate) RATE=${2:?}; shift 2 ;;
        --rtt) RTT=${2:?}; shift 2 ;;
        --buffer) BUFFER=${2:?}; shift 2 ;;
        --userspace-pm) SERVE_PM=(--mptcp-pm userspace); shift ;;
        *) echo "mptcp.sh: unknown argument $1" >&2; exit 1 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "mptcp.sh: needs root (the path manager's limits, BPF pacing, the lab)" >&2; exit 1; }
cd "$(dirname "$0")/.."
HSXFER=$(realpath "${HSXFER:-target/release/hsxfer}")
[ -x "$HSXFER" ] || cargo build --release --features cli >&2
command -v jq >/dev/null || { echo "mptcp.sh: needs jq" >&2; exit 1; }

WORK=$(mktemp -d)
chmod 755 "$WORK"
export XDG_CONFIG_HOME="$WORK/config" XDG_CACHE_HOME="$WORK/cache"
mkdir -p "$WORK/root"
LAB=hsxmp
SERVER=""
cleanup() {
    [ -n "$SERVER" ] && { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true; }
    [ "$WHERE" = lab ] && "$HSXFER" lab down --name "$LAB" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$WHERE" = lab ]; then
    "$HSXFER" lab up --name "$LAB" --rate "$RATE" --rtt "$RTT" --buffer "$BUFFER" >"$WORK/lab.txt"
    "$HSXFER" token new "$WORK/token" >/dev/null
    HOST=10.77.0.2; PORT=7700
    AUTH=(--token-file "$WORK/token")
    on_server=("$HSXFER" lab exec --name "$LAB" receiver --)
    on_client=("$HSXFER" lab exec --name "$LAB" sender1 --)
    PACINGS="paced unpaced"; CCS="cubic dmctcp"
    # The ceiling: the bottleneck's rate less the headers of each 1448-byte segment.
    CEILING=$(awk -v r="$("$HSXFER" lab status --name "$LAB" --json 2>/dev/null | jq -r '.state.spec.rate_bps // empty')" \
        'BEGIN { if (r == "") print 0; else print r * 1448 / 1514 }')
else
    HOST=127.0.0.1
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    AUTH=(--no-auth)
    on_server=(); on_client=()
    PACINGS="unpaced"; CCS="cubic"; CEILING=0
fi
"${on_server[@]}" "$HSXFER" serve --mptcp "${SERVE_PM[@]}" --root "$WORK/root" --listen "$HOST" --port "$PORT" "${AUTH[@]}" \
    2>"$WORK/serve.log" &
SERVER=$!
for _ in $(seq 200); do grep -q serving "$WORK/serve.log" && break; sleep 0.05; done
grep -q serving "$WORK/serve.log" || { cat "$WORK/serve.log" >&2; exit 1; }
# The server runs under `ip netns exec` in the lab: find the hsxfer process itself.
SERVER_PID=$(pgrep -f -n -- "--root $WORK/root") || SERVER_PID=$SERVER

cpu_s() { # utime + stime of a process, in seconds
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}

run() { # transport n cc pacing
    local transport=$1 n=$2 cc=$3 pacing=$4 flags=() before after out client
    [ "$transport" = mptcp ] && flags+=(--mptcp --mptcp-paths off)
    if [ "$WHERE" = lab ]; then
        flags+=(--rate "$RATE")
        [ "$pacing" = unpaced ] && flags+=(--pace off)
    else
        flags+=(--pace off)
    fi
    before=$(cpu_s "$SERVER_PID")
    out=$( { /usr/bin/time -f '%U %S' "${on_client[@]}" "$HSXFER" bench "${AUTH[@]}" --port "$PORT" \
        -n "$n" --cc "$cc" --tune off --time "$TIME" --json "${flags[@]}" "$HOST" | tail -n 1; } \
        2>"$WORK/time" )
    after=$(cpu_s "$SERVER_PID")
    client=$(awk 'NF == 2 { c = $1 + $2 } END { print c }' "$WORK/time")
    jq -r --arg t "$transport" --arg n "$n" --arg cc "$cc" --arg p "$pacing" \
        --arg c "$client" --arg s "$(awk -v a="$after" -v b="$before" 'BEGIN { print a - b }')" \
        --arg ceiling "$CEILING" '
        (.bytes / 1e9) as $gb |
        "| \($t) | \($n) | \(.subflows // "–") | \($cc) | \($p) | \(.goodput_bps / 1e6 | . * 10 | round / 10) | " +
        (if ($ceiling | tonumber) > 0 then "\(.goodput_bps / ($ceiling | tonumber) * 1000 | round / 10) %" else "–" end) +
        " | \([.channels[].retransmits] | add) | \(($c | tonumber) / $gb * 100 | round / 100) | \(($s | tonumber) / $gb * 100 | round / 100) |"' <<<"$out"
}

echo "| transport | -n | subflows | cc | pacing | Mbit/s | of the ceiling | retransmits | client CPU-s/GB | server CPU-s/GB |"
echo "|---|---|---|---|---|---|---|---|---|---|"
k=0
for r in $(seq "$RUNS"); do
    for n in $COUNTS; do
        for cc in $CCS; do
            for pacing in $PACINGS; do
                k=$((k + 1))
                if [ $((k % 2)) -eq 1 ]; then run tcp "$n" "$cc" "$pacing"; run mptcp "$n" "$cc" "$pacing"
                else run mptcp "$n" "$cc" "$pacing"; run tcp "$n" "$cc" "$pacing"; fi
            done
        done
    done
done
