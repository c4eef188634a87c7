#!/usr/bin/env bash
# bench/transfer.sh — whole-transfer benchmark: hsxfer vs reference tools, side by side.
#
#   a. memory-to-memory   hsxfer bench            vs  iperf3 -P N           (target >= 1.0x)
#   b. pull one big file  hsxfer copy  -> /dev/null vs  globus-url-copy -p N  (target >= 1.0x)
#   c. many small files   hsxfer copy -r          vs  globus-url-copy -cc 4 -pp -r (target >= 3x)
#   d. pull one big file into a file, both verified:
#                         hsxfer copy             vs  globus-url-copy -p N -verify-checksum (target >= 2x)
#
# Every comparison is repeated R times, alternating the two tools run by run (odd runs:
# hsxfer first, even runs: reference first); the median of each tool and the ratio
# hsxfer/reference are reported.  Loopback (127.0.0.1) only; datasets live on tmpfs.
# Progress goes to stderr; the markdown report goes to stdout (and JSON to --out FILE).
#
# Run `bench/transfer.sh --help` for flags; see bench/README.md.

set -uo pipefail
export LC_ALL=C
PATH="$PATH:/usr/sbin:/sbin"

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

usage() {
    cat <<'EOF'
Usage: bench/transfer.sh [options]

Compares hsxfer with iperf3 (memory-to-memory) and Globus GridFTP (globus-url-copy against
a loopback globus-gridftp-server) for a big-file pull and a many-small-files pull.

Options:
  --runs R            repetitions per comparison, tools alternated run by run (default 3)
  --big-size SIZE     size of the big file for test b, head -c syntax (default 2G = 2 GiB)
  --small-count N     number of small files for test c, spread over <=100 dirs (default 10000)
  --small-size SIZE   size of each small file, numfmt --from=iec syntax (default 64K)
  --bench-time S      seconds for the memory-to-memory test a (default 10)
  --streams N         parallel streams: hsxfer -n N, iperf3 -P N, globus-url-copy -p N (default 8)
  --only LIST         run only some tests, comma separated subset of a,b,c,d (default a,b,c,d)
  --quick             smoke check: 1 run, 256M big file, 1000 small files, 3 s bench
                      (explicit flags override the --quick values)
  --out FILE          also write the results as JSON to FILE
  --clear             hsxfer in clear text at both ends (`--no-encrypt`), as iperf3 and
                      GridFTP run here; hsxfer still authenticates and verifies every block
  --perf              wrap every client run (hsxfer and reference) in
                      `perf stat -e task-clock,context-switches` and report client CPU-s/GB
  --anon-user USER    unprivileged user the GridFTP server maps anonymous logins to
                      (default: nobody; 'hsxbench' is created with useradd -r if nobody is missing)
  --keep              keep the /dev/shm/hsxfer-bench-XXXX work dir (datasets + logs)
  --strict            exit 3 if any target is missed (default: exit 0 when everything ran)
  -h, --help          this help

Environment:
  HSXFER=/path/to/hsxfer   use this binary instead of running `cargo build --release --features cli`

Exit status: 0 ok, 1 setup error or a run/verification failed, 3 target missed (--strict).
EOF
}

# ----------------------------------------------------------------------------- options
RUNS=""; BIG_SIZE=""; SMALL_COUNT=""; BENCH_TIME=""; STREAMS=8; ONLY="a,b,c,d"
QUICK=0; OUT=""; PERF=0; CLEAR_ARGS=(); ANON_USER=""; KEEP=0; STRICT=0
SMALL_FILE_SIZE=65536; SMALL_SIZE_ARG=""
SMALL_CC=4   # globus-url-copy -cc for the small-files test (per the benchmark spec)

die()  { echo "transfer.sh: error: $*" >&2; exit 1; }
log()  { echo "[bench $(date +%H:%M:%S)] $*" >&2; }
warn() { echo "[bench $(date +%H:%M:%S)] WARNING: $*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs)         RUNS=${2:?--runs needs a value}; shift 2 ;;
        --big-size)     BIG_SIZE=${2:?--big-size needs a value}; shift 2 ;;
        --small-count)  SMALL_COUNT=${2:?--small-count needs a value}; shift 2 ;;
        --small-size)   SMALL_SIZE_ARG=${2:?--small-size needs a value}; shift 2 ;;
        --bench-time|--time) BENCH_TIME=${2:?--bench-time needs a value}; shift 2 ;;
        --streams)      STREAMS=${2:?--streams needs a value}; shift 2 ;;
        --only)         ONLY=${2:?--only needs a value}; shift 2 ;;
        --quick)        QUICK=1; shift ;;
        --out)          OUT=${2:?--out needs a value}; shift 2 ;;
        --perf)         PERF=1; shift ;;
        --clear)        CLEAR_ARGS=(--no-encrypt); shift ;;
        --anon-user)    ANON_USER=${2:?--anon-user needs a value}; shift 2 ;;
        --keep)         KEEP=1; shift ;;
        --strict)       STRICT=1; shift ;;
        -h|--help)      usage; exit 0 ;;
        *)              usage >&2; die "unknown argument: $1" ;;
    esac
done

if (( QUICK )); then
    : "${RUNS:=1}" "${BIG_SIZE:=256M}" "${SMALL_COUNT:=1000}" "${BENCH_TIME:=3}"
else
    : "${RUNS:=3}" "${BIG_SIZE:=2G}" "${SMALL_COUNT:=10000}" "${BENCH_TIME:=10}"
fi

is_uint() { [[ $1 =~ ^[0-9]+$ ]] && (( $1 > 0 )); }
is_uint "$RUNS"        || die "--runs must be a positive integer (got '$RUNS')"
is_uint "$SMALL_COUNT" || die "--small-count must be a positive integer (got '$SMALL_COUNT')"
is_uint "$BENCH_TIME"  || die "--bench-time must be a positive integer (got '$BENCH_TIME')"
is_uint "$STREAMS"     || die "--streams must be a positive integer (got '$STREAMS')"
BIG_BYTES=$(numfmt --from=iec "$BIG_SIZE" 2>/dev/null) || die "bad --big-size '$BIG_SIZE' (use e.g. 256M, 2G)"
if [[ -n $SMALL_SIZE_ARG ]]; then
    SMALL_FILE_SIZE=$(numfmt --from=iec "$SMALL_SIZE_ARG" 2>/dev/null) || die "bad --small-size '$SMALL_SIZE_ARG' (use e.g. 4K, 64K)"
    is_uint "$SMALL_FILE_SIZE" || die "--small-size must be at least one byte (got '$SMALL_SIZE_ARG')"
fi
SMALL_LABEL=$(numfmt --to=iec-i --suffix=B "$SMALL_FILE_SIZE" | sed 's/\([0-9]\)\([KMG]\)/\1 \2/')
is_uint "$BIG_BYTES" || die "bad --big-size '$BIG_SIZE'"
RUN_A=0; RUN_B=0; RUN_C=0; RUN_D=0
IFS=',' read -r -a _only <<<"$ONLY"
for t in "${_only[@]}"; do
    case "$t" in a) RUN_A=1 ;; b) RUN_B=1 ;; c) RUN_C=1 ;; d) RUN_D=1 ;; *) die "--only takes a subset of a,b,c,d (got '$ONLY')" ;; esac
done
[[ -n $OUT ]] && { : >"$OUT" 2>/dev/null || die "cannot write --out file '$OUT'"; OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT"); }

# ----------------------------------------------------------------------------- dependencies
IS_ROOT=0; [[ $EUID -eq 0 ]] && IS_ROOT=1
declare -A PKG_FOR=(
    [iperf3]=iperf3
    [globus-gridftp-server]=globus-gridftp-server-progs
    [globus-url-copy]=globus-gass-copy-progs
    [jq]=jq
    [ss]=iproute2
)
missing_pkgs=()
for cmd in iperf3 globus-gridftp-server globus-url-copy jq ss; do
    command -v "$cmd" >/dev/null 2>&1 || missing_pkgs+=("${PKG_FOR[$cmd]}")
done
if (( ${#missing_pkgs[@]} )); then
    (( IS_ROOT )) || die "missing packages: ${missing_pkgs[*]} (run as root to auto-install, or apt-get install them)"
    log "installing: ${missing_pkgs[*]}"
    apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_pkgs[@]}" >/dev/null \
        || die "apt-get install ${missing_pkgs[*]} failed"
    for cmd in iperf3 globus-gridftp-server globus-url-copy jq ss; do
        command -v "$cmd" >/dev/null 2>&1 || die "'$cmd' still missing after apt-get install"
    done
fi

if (( PERF )); then
    if ! command -v perf >/dev/null 2>&1; then
        warn "--perf: 'perf' not installed, CPU accounting of clients disabled"; PERF=0
    elif ! perf stat -x, -o /dev/null -e task-clock,context-switches -- true >/dev/null 2>&1; then
        warn "--perf: 'perf stat -e task-clock,context-switches' does not work here (perf_event_paranoid?), disabled"; PERF=0
    fi
fi

# ----------------------------------------------------------------------------- hsxfer binary
if [[ -n ${HSXFER:-} ]]; then
    [[ -f $HSXFER && -x $HSXFER ]] || die "HSXFER=$HSXFER: hsxfer binary missing or not executable"
else
    command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust, or set HSXFER=/path/to/hsxfer"
    log "building hsxfer: cargo build --release --features cli (in $REPO_ROOT)"
    (cd "$REPO_ROOT" && cargo build --release --features cli 1>&2) || die "cargo build --release --features cli failed"
    _tdir=${CARGO_TARGET_DIR:-target}
    [[ $_tdir = /* ]] || _tdir="$REPO_ROOT/$_tdir"
    HSXFER="$_tdir/release/hsxfer"
    [[ -f $HSXFER && -x $HSXFER ]] || die "hsxfer binary missing after build: expected $HSXFER"
fi
HSXFER=$(cd "$(dirname "$HSXFER")" && pwd)/$(basename "$HSXFER")
HS_HELP=$("$HSXFER" --help 2>&1)   # captured first: grep -q + pipefail could see SIGPIPE
if ! grep -qw serve <<<"$HS_HELP"; then
    die "$HSXFER does not look like the hsxfer CLI ('$HSXFER --help' lists no 'serve' subcommand)"
fi

# ----------------------------------------------------------------------------- anonymous GridFTP user
if (( IS_ROOT )); then
    if [[ -z $ANON_USER ]]; then
        if id nobody >/dev/null 2>&1; then
            ANON_USER=nobody
        else
            ANON_USER=hsxbench
            id "$ANON_USER" >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin "$ANON_USER" \
                || die "useradd -r $ANON_USER failed; pass --anon-user USER"
        fi
    fi
    id "$ANON_USER" >/dev/null 2>&1 || die "anonymous user '$ANON_USER' does not exist"
    [[ $(id -u "$ANON_USER") -ne 0 ]] || die "--anon-user must not be root"
fi

# ----------------------------------------------------------------------------- work dir, cleanup
WORK=$(mktemp -d /dev/shm/hsxfer-bench-XXXX) || die "mktemp -d /dev/shm/hsxfer-bench-XXXX failed (is /dev/shm a tmpfs?)"
chmod 755 "$WORK"                       # mktemp makes it 0700: the GridFTP anon user must traverse it
DATA="$WORK/data"; LOGS="$WORK/logs"; DEST="$WORK/dst"
mkdir -p "$DATA" "$LOGS"; chmod 755 "$DATA"
BG_PIDS=()
ERRORS=0

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${BG_PIDS[@]}"; do
        pkill -TERM -P "$pid" 2>/dev/null    # GridFTP per-connection children (by parent id)
        kill -TERM "$pid" 2>/dev/null
    done
    sleep 0.3
    for pid in "${BG_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then pkill -KILL -P "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; fi
        wait "$pid" 2>/dev/null
    done
    if (( KEEP )); then
        log "kept work dir: $WORK"
    else
        rm -rf -- "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ----------------------------------------------------------------------------- helpers
now() { date +%s.%N; }
fsub() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", a-b}'; }
fdiv() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b+0==0 || a=="null" || b=="null") print "null"; else printf "%.6g", a/b }'; }
fmt()  { awk -v v="$1" -v p="${2:-1}" 'BEGIN{ if (v=="null"||v=="") print "n/a"; else printf "%.*f", p, v }'; }
median() { # median of numeric args, "null" if none
    printf '%s\n' "$@" | awk '/^-?[0-9.eE+-]+$/{v[n++]=$1} END{
        if(n==0){print "null"; exit}
        for(i=0;i<n;i++)for(j=i+1;j<n;j++)if(v[j]<v[i]){t=v[i];v[i]=v[j];v[j]=t}
        if(n%2) printf "%.6g\n", v[int(n/2)]; else printf "%.6g\n", (v[n/2-1]+v[n/2])/2 }'
}
json_arr() { if (( $# )); then printf '%s\n' "$@" | jq -s -c .; else echo '[]'; fi; }
qcmd() { local s; printf -v s '%q ' "$@"; echo "${s% }"; }

declare -A USED_PORTS=()
port_busy() {
    if command -v ss >/dev/null 2>&1; then
        [[ -n $(ss -Htln "sport = :$1" 2>/dev/null) ]]
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}
pick_port() { # sets PORT
    local i p
    for i in $(seq 1 500); do
        p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
        [[ -n ${USED_PORTS[$p]:-} ]] && continue
        port_busy "$p" && continue
        USED_PORTS[$p]=1; PORT=$p; return 0
    done
    die "could not find a free TCP port"
}
wait_listen() { # port pid name logfile
    local port=$1 pid=$2 name=$3 logf=$4 i
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$logf" >&2; die "$name exited during startup (log above)"; }
        port_busy "$port" && return 0
        sleep 0.1
    done
    tail -n 20 "$logf" >&2; die "$name did not listen on 127.0.0.1:$port within 10 s (log above)"
}
proc_cpu_s() { # utime+stime+cutime+cstime of a process, in seconds (includes reaped children)
    local pid=$1 hz
    hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
    [[ -r /proc/$pid/stat ]] || { echo null; return; }
    sed 's/.*) //' "/proc/$pid/stat" | awk -v hz="$hz" '{printf "%.3f", ($12+$13+$14+$15)/hz}'
}

# run_client NAME STDOUT_FILE STDERR_FILE cmd...  -> sets RC, ELAPSED, CPU_S (client task-clock, s), CTXSW
run_client() {
    local name=$1 out=$2 err=$3 t0 t1 pf; shift 3
    CPU_S=null; CTXSW=null
    pf="$LOGS/perf.$name.$RANDOM.txt"
    t0=$(now)
    if (( PERF )); then
        perf stat -x, -o "$pf" -e task-clock,context-switches -- "$@" >"$out" 2>"$err"; RC=$?
    else
        "$@" >"$out" 2>"$err"; RC=$?
    fi
    t1=$(now)
    ELAPSED=$(fsub "$t1" "$t0")
    if (( PERF )) && [[ -s $pf ]]; then
        CPU_S=$(awk -F, '$3 ~ /^task-clock/ {printf "%.4f", $1/1000; f=1} END{if(!f) print "null"}' "$pf")
        CTXSW=$(awk -F, '$3 ~ /^context-switches/ {print $1+0; f=1} END{if(!f) print "null"}' "$pf")
    fi
    if (( RC != 0 )); then
        warn "$name exited with status $RC; stderr tail:"
        tail -n 15 "$err" >&2
    fi
}

# per-run CPU bookkeeping: CPU[key]="client_s server_s bytes" lists
declare -A CPU_CLIENT=() CPU_SERVER=() CPU_BYTES=()
add_cpu() { # key client_s server_s bytes
    CPU_CLIENT[$1]+="$2 "; CPU_SERVER[$1]+="$3 "; CPU_BYTES[$1]+="$4 "
}
cpu_per_gb() { # key which(client|server) -> median CPU-s per GB (1e9 bytes)
    local -a c b; local vals=() i
    if [[ $2 == client ]]; then read -r -a c <<<"${CPU_CLIENT[$1]:-}"; else read -r -a c <<<"${CPU_SERVER[$1]:-}"; fi
    read -r -a b <<<"${CPU_BYTES[$1]:-}"
    for i in "${!c[@]}"; do
        [[ ${c[$i]} == null || ${b[$i]:-null} == null ]] && continue
        vals+=("$(awk -v c="${c[$i]}" -v b="${b[$i]}" 'BEGIN{ if (b>0) printf "%.6g", c/(b/1e9) }')")
    done
    median "${vals[@]}"
}
srv_cpu_delta() { # before after -> delta or null
    if [[ $1 == null || $2 == null ]]; then echo null; else fsub "$2" "$1"; fi
}

LOAD_BEFORE=$(cat /proc/loadavg)
declare -A LOAD_AT=()
declare -a CMD_LINES=()
record_cmd() { CMD_LINES+=("$1"); }

# ----------------------------------------------------------------------------- datasets
BIG="$DATA/big.bin"
SMALL="$DATA/small"
SMALL_BYTES=$(( SMALL_COUNT * SMALL_FILE_SIZE ))
if (( RUN_B || RUN_D )); then
    log "generating big file: $BIG_SIZE ($BIG_BYTES bytes) from /dev/urandom -> $BIG"
    head -c "$BIG_BYTES" /dev/urandom >"$BIG" || die "generating $BIG failed (tmpfs full?)"
fi
if (( RUN_C )); then
    ndirs=$(( SMALL_COUNT < 100 ? SMALL_COUNT : 100 ))
    log "generating $SMALL_COUNT x $SMALL_FILE_SIZE-byte files in $ndirs dirs -> $SMALL"
    mkdir -p "$SMALL"
    for (( d = 0; d < ndirs; d++ )); do
        n=$(( SMALL_COUNT / ndirs + (d < SMALL_COUNT % ndirs ? 1 : 0) ))
        dir=$(printf '%s/d%03d' "$SMALL" "$d"); mkdir -p "$dir"
        head -c $(( n * SMALL_FILE_SIZE )) /dev/urandom | (cd "$dir" && split -b "$SMALL_FILE_SIZE" -a 5 -d - f) \
            || die "generating small files in $dir failed"
    done
    got=$(find "$SMALL" -type f | wc -l)
    [[ $got -eq $SMALL_COUNT ]] || die "small-file dataset has $got files, expected $SMALL_COUNT"
fi
chmod -R a+rX "$DATA"
sync

# ----------------------------------------------------------------------------- servers
HS_PORT=""; IPERF_PORT=""; GFS_PORT=""; HS_SRV_PID=""; IPERF_PID=""; GFS_PID=""

pick_port; HS_PORT=$PORT
HS_SERVE_CMD=("$HSXFER" serve --root "$DATA" --listen 127.0.0.1 --port "$HS_PORT" --no-auth "${CLEAR_ARGS[@]}")
log "starting: $(qcmd "${HS_SERVE_CMD[@]}")"
"${HS_SERVE_CMD[@]}" >"$LOGS/hsxfer-serve.log" 2>&1 &
HS_SRV_PID=$!; BG_PIDS+=("$HS_SRV_PID")
wait_listen "$HS_PORT" "$HS_SRV_PID" "hsxfer serve" "$LOGS/hsxfer-serve.log"
record_cmd "hsxfer server:  $(qcmd "${HS_SERVE_CMD[@]}")"

if (( RUN_A )); then
    pick_port; IPERF_PORT=$PORT
    IPERF_SRV_CMD=(iperf3 -s -p "$IPERF_PORT" -B 127.0.0.1)
    log "starting: $(qcmd "${IPERF_SRV_CMD[@]}")"
    "${IPERF_SRV_CMD[@]}" >"$LOGS/iperf3-server.log" 2>&1 &
    IPERF_PID=$!; BG_PIDS+=("$IPERF_PID")
    wait_listen "$IPERF_PORT" "$IPERF_PID" "iperf3 -s" "$LOGS/iperf3-server.log"
    record_cmd "iperf3 server:  $(qcmd "${IPERF_SRV_CMD[@]}")"
fi

if (( RUN_B || RUN_C || RUN_D )); then
    pick_port; GFS_PORT=$PORT
    # -c /dev/null: ignore /etc/gridftp.conf; default mode is a foreground daemon that
    # re-execs itself (inetd mode) per connection and setuids to the anonymous user.
    GFS_CMD=(globus-gridftp-server -c /dev/null -aa
             -control-interface 127.0.0.1 -data-interface 127.0.0.1 -p "$GFS_PORT"
             -l "$LOGS/gridftp.log" -d error,warn)
    (( IS_ROOT )) && GFS_CMD+=(-anonymous-user "$ANON_USER")
    if (( IS_ROOT )); then   # GridFTP opens files as the anonymous user: check it can read them
        chk=("$DATA")
        (( RUN_B || RUN_D )) && chk+=("$BIG")
        (( RUN_C )) && chk+=("$(find "$SMALL" -type f -print -quit)")
        for f in "${chk[@]}"; do
            runuser -u "$ANON_USER" -- test -r "$f" \
                || die "anonymous GridFTP user '$ANON_USER' cannot read $f"
        done
    fi
    log "starting: $(qcmd "${GFS_CMD[@]}")"
    (cd / && exec "${GFS_CMD[@]}") >"$LOGS/gridftp-server.out" 2>&1 &
    GFS_PID=$!; BG_PIDS+=("$GFS_PID")
    wait_listen "$GFS_PORT" "$GFS_PID" "globus-gridftp-server" "$LOGS/gridftp-server.out"
    record_cmd "GridFTP server: $(qcmd "${GFS_CMD[@]}")"
    # quick health check: anonymous login + listing of the dataset dir
    if ! globus-url-copy -list "ftp://127.0.0.1:$GFS_PORT$DATA/" >"$LOGS/gfs-list.out" 2>&1; then
        cat "$LOGS/gfs-list.out" >&2; tail -n 20 "$LOGS/gridftp.log" >&2 2>/dev/null
        die "anonymous GridFTP listing of $DATA failed (output above)"
    fi
fi

between_runs() { sync; sleep 1; }

# ============================================================================= a. memory-to-memory
A_HS=(); A_REF=(); A_HS_VERIFIED=(); A_UNIT_NOTE=""
declare -a HS_BENCH_CMD IPERF_CMD
HS_BENCH_CMD=("$HSXFER" bench -n "$STREAMS" --time "$BENCH_TIME" --no-auth "${CLEAR_ARGS[@]}" --json 127.0.0.1 --port "${HS_PORT}")
IPERF_CMD=(iperf3 -c 127.0.0.1 -p "${IPERF_PORT:-0}" -P "$STREAMS" -t "$BENCH_TIME" -J)

a_hsxfer() { # r
    local out="$LOGS/a.hsxfer.$1.json" err="$LOGS/a.hsxfer.$1.err" last bps bytes secs verified cb ca conv
    cb=$(proc_cpu_s "$HS_SRV_PID")
    run_client "a.hsxfer" "$out" "$err" "${HS_BENCH_CMD[@]}"
    sleep 0.2; ca=$(proc_cpu_s "$HS_SRV_PID")
    if (( RC != 0 )); then A_HS+=(null); ERRORS=$((ERRORS+1)); return; fi
    last=$(grep -v '^[[:space:]]*$' "$out" | tail -n 1)
    if ! jq -e 'select(.type == "summary") | .goodput_bps' >/dev/null 2>&1 <<<"$last"; then
        warn "hsxfer bench: last NDJSON line is not a summary with goodput_bps: $last"
        A_HS+=(null); ERRORS=$((ERRORS+1)); return
    fi
    bps=$(jq -r '.goodput_bps' <<<"$last"); bytes=$(jq -r '.bytes // "null"' <<<"$last")
    secs=$(jq -r '.seconds // "null"' <<<"$last"); verified=$(jq -r '.verified // "null"' <<<"$last")
    # goodput_bps should be bits/s; if it matches bytes/seconds instead, convert (and say so)
    if [[ $bytes != null && $secs != null ]]; then
        conv=$(awk -v g="$bps" -v b="$bytes" -v s="$secs" 'BEGIN{ if (s>0 && b>0) { r=g/(b*8/s); if (r>0.06 && r<0.25) print "bytes"; else print "bits" } else print "bits" }')
        if [[ $conv == bytes ]]; then
            bps=$(awk -v g="$bps" 'BEGIN{printf "%.6g", g*8}')
            A_UNIT_NOTE="hsxfer goodput_bps matched bytes/s (bytes/seconds), multiplied by 8"
            warn "$A_UNIT_NOTE"
        fi
    fi
    [[ $verified == true ]] || { warn "hsxfer bench summary: verified=$verified"; ERRORS=$((ERRORS+1)); }
    A_HS+=("$bps"); A_HS_VERIFIED+=("$verified")
    add_cpu a.hsxfer "$CPU_S" "$(srv_cpu_delta "$cb" "$ca")" "$bytes"
    log "  a run $1 hsxfer: $(fmt "$(fdiv "$bps" 1e9)" 2) Gbit/s (verified=$verified)"
}
a_iperf() { # r
    local out="$LOGS/a.iperf3.$1.json" err="$LOGS/a.iperf3.$1.err" bps bytes cb ca try
    for try in 1 2 3; do
        cb=$(proc_cpu_s "$IPERF_PID")
        run_client "a.iperf3" "$out" "$err" "${IPERF_CMD[@]}"
        sleep 0.2; ca=$(proc_cpu_s "$IPERF_PID")
        (( RC == 0 )) && break
        grep -q busy "$out" "$err" 2>/dev/null || break    # "the server is busy": retry
        sleep 2
    done
    bps=$(jq -r '.end.sum_received.bits_per_second // "null"' "$out" 2>/dev/null || echo null)
    bytes=$(jq -r '.end.sum_received.bytes // "null"' "$out" 2>/dev/null || echo null)
    if (( RC != 0 )) || [[ -z $bps || $bps == null ]]; then
        warn "iperf3 run failed: $(jq -r '.error // empty' "$out" 2>/dev/null)"; A_REF+=(null); ERRORS=$((ERRORS+1)); return
    fi
    A_REF+=("$bps")
    add_cpu a.iperf3 "$CPU_S" "$(srv_cpu_delta "$cb" "$ca")" "$bytes"
    log "  a run $1 iperf3: $(fmt "$(fdiv "$bps" 1e9)" 2) Gbit/s"
}

if (( RUN_A )); then
    LOAD_AT[a]=$(cat /proc/loadavg)
    log "test a: memory-to-memory, $STREAMS streams, ${BENCH_TIME}s, $RUNS run(s)"
    record_cmd "a hsxfer:       $(qcmd "${HS_BENCH_CMD[@]}")"
    record_cmd "a reference:    $(qcmd "${IPERF_CMD[@]}")"
    for (( r = 1; r <= RUNS; r++ )); do
        if (( r % 2 )); then a_hsxfer "$r"; between_runs; a_iperf "$r"
        else                  a_iperf "$r"; between_runs; a_hsxfer "$r"; fi
        between_runs
    done
fi

# ============================================================================= b. big file pull
B_HS=(); B_REF=(); B_VERIFY="skipped"
HS_BIG_CMD=("$HSXFER" copy -n "$STREAMS" --no-auth "${CLEAR_ARGS[@]}" --port "$HS_PORT" 127.0.0.1:big.bin /dev/null)
GUC_BIG_CMD=(globus-url-copy -fast -p "$STREAMS" "ftp://127.0.0.1:${GFS_PORT}${BIG}" file:///dev/null)

# alternate CMD...: RUNS runs each of `CMD... hsxfer R` and `CMD... globus R`, hsxfer first
# on odd runs and GridFTP first on even ones.
alternate() {
    local r
    for (( r = 1; r <= RUNS; r++ )); do
        if (( r % 2 )); then "$@" hsxfer "$r"; between_runs; "$@" globus "$r"
        else                  "$@" globus "$r"; between_runs; "$@" hsxfer "$r"; fi
        between_runs
    done
}

# big_pull TEST TOOL R: one timed pull of the big file, for test b (into /dev/null) or d (into a
# tmpfs file, cmp-checked and removed after); appends MB/s, or null on failure, to the test's
# array for TOOL.
big_pull() {
    local t=$1 tool=$2 r=$3 out="$LOGS/$1.$2.$3.out" err="$LOGS/$1.$2.$3.err" mbs cb ca spid
    local ok=1 which=HS cmd
    [[ $tool == hsxfer ]] || which=REF
    local -n results="${t^^}_$which"
    case $t$tool in
        bhsxfer) cmd=HS_BIG_CMD ;;  bglobus) cmd=GUC_BIG_CMD ;;
        dhsxfer) cmd=HS_VBIG_CMD ;; dglobus) cmd=GUC_VBIG_CMD ;;
    esac
    local -n command=$cmd
    if [[ $tool == hsxfer ]]; then spid=$HS_SRV_PID; else spid=$GFS_PID; fi
    [[ $t == d ]] && { rm -rf -- "$DEST"; mkdir -p "$DEST"; }
    cb=$(proc_cpu_s "$spid")
    run_client "$t.$tool" "$out" "$err" "${command[@]}"
    sleep 0.3; ca=$(proc_cpu_s "$spid")
    if (( RC == 0 )) && [[ $t == d ]] && ! cmp -s "$BIG" "$DEST/big.bin"; then
        warn "d: $tool's copy differs from the source"; ok=0
    fi
    [[ $t == d ]] && rm -rf -- "$DEST"
    if (( RC != 0 || ! ok )); then
        results+=(null); ERRORS=$((ERRORS+1)); return
    fi
    mbs=$(awk -v b="$BIG_BYTES" -v t="$ELAPSED" 'BEGIN{printf "%.6g", b/1e6/t}')
    results+=("$mbs")
    add_cpu "$t.$tool" "$CPU_S" "$(srv_cpu_delta "$cb" "$ca")" "$BIG_BYTES"
    log "  $t run $r $tool: $(fmt "$mbs" 0) MB/s (${ELAPSED}s)"
}

if (( RUN_B )); then
    LOAD_AT[b]=$(cat /proc/loadavg)
    log "test b: pull $BIG_SIZE file -> /dev/null, $RUNS run(s)"
    record_cmd "b hsxfer:       $(qcmd "${HS_BIG_CMD[@]}")"
    record_cmd "b reference:    $(qcmd "${GUC_BIG_CMD[@]}")"
    # untimed sanity pass: hsxfer into a tmpfs file + cmp (a /dev/null sink cannot show a short
    # transfer), and a warm-up globus-url-copy.
    log "  b: untimed verification pull (hsxfer -> tmpfs file, cmp) and globus warm-up"
    mkdir -p "$DEST"
    if "$HSXFER" copy -n "$STREAMS" --no-auth "${CLEAR_ARGS[@]}" --port "$HS_PORT" 127.0.0.1:big.bin "$DEST/big.bin" \
            >"$LOGS/b.verify.out" 2>"$LOGS/b.verify.err" && cmp -s "$BIG" "$DEST/big.bin"; then
        B_VERIFY="ok"
    else
        B_VERIFY="FAILED"; ERRORS=$((ERRORS+1))
        warn "hsxfer big-file verification pull failed or differs from source"; tail -n 15 "$LOGS/b.verify.err" >&2
    fi
    rm -rf -- "$DEST"
    globus-url-copy -fast -p "$STREAMS" "ftp://127.0.0.1:${GFS_PORT}${BIG}" file:///dev/null >/dev/null 2>&1 \
        || warn "globus warm-up pull failed"
    between_runs
    alternate big_pull b
fi

# ============================================================================= c. small files pull
C_HS=(); C_REF=(); C_HS_MB=(); C_REF_MB=(); C_DIFF_HS="not run"; C_DIFF_REF="not run"
HS_SMALL_CMD=("$HSXFER" copy -n "$STREAMS" -r --no-auth "${CLEAR_ARGS[@]}" --port "$HS_PORT" 127.0.0.1:small "$DEST")
GUC_SMALL_CMD=(globus-url-copy -cc "$SMALL_CC" -pp -fast -r "ftp://127.0.0.1:${GFS_PORT}${SMALL}/" "file://$DEST/")

c_diff() { # dest-dir -> diff -r source against the copy (handles DEST/ and DEST/small/ layouts)
    local cmp_dir=$1
    if [[ -d $1/small && $(ls -A "$1" | wc -l) -eq 1 ]]; then cmp_dir="$1/small"; fi
    diff -r "$SMALL" "$cmp_dir" >"$LOGS/c.diff.out" 2>&1
}
c_run() { # tool r
    local tool=$1 r=$2 out="$LOGS/c.$1.$2.out" err="$LOGS/c.$1.$2.err" n bytes fps mbs cb ca spid
    rm -rf -- "$DEST"; mkdir -p "$DEST"; sync
    if [[ $tool == hsxfer ]]; then spid=$HS_SRV_PID; else spid=$GFS_PID; fi
    cb=$(proc_cpu_s "$spid")
    if [[ $tool == hsxfer ]]; then run_client c.hsxfer "$out" "$err" "${HS_SMALL_CMD[@]}"
    else                           run_client c.globus "$out" "$err" "${GUC_SMALL_CMD[@]}"; fi
    sleep 0.3; ca=$(proc_cpu_s "$spid")
    n=$(find "$DEST" -type f | wc -l)
    bytes=$(find "$DEST" -type f -printf '%s\n' | awk '{s+=$1} END{print s+0}')
    if (( RC != 0 )) || (( n != SMALL_COUNT )) || (( bytes != SMALL_BYTES )); then
        warn "c run $r $tool: exit=$RC, files=$n/$SMALL_COUNT, bytes=$bytes/$SMALL_BYTES"
        if [[ $tool == hsxfer ]]; then C_HS+=(null); C_HS_MB+=(null); else C_REF+=(null); C_REF_MB+=(null); fi
        ERRORS=$((ERRORS+1)); rm -rf -- "$DEST"; return
    fi
    fps=$(awk -v n="$n" -v t="$ELAPSED" 'BEGIN{printf "%.6g", n/t}')
    mbs=$(awk -v b="$bytes" -v t="$ELAPSED" 'BEGIN{printf "%.6g", b/1e6/t}')
    if [[ $tool == hsxfer ]]; then
        C_HS+=("$fps"); C_HS_MB+=("$mbs")
        if [[ $C_DIFF_HS == "not run" ]]; then
            if c_diff "$DEST"; then C_DIFF_HS=ok; else C_DIFF_HS=FAILED; ERRORS=$((ERRORS+1)); warn "diff -r hsxfer copy:"; head -n 10 "$LOGS/c.diff.out" >&2; fi
        fi
    else
        C_REF+=("$fps"); C_REF_MB+=("$mbs")
        if [[ $C_DIFF_REF == "not run" ]]; then
            if c_diff "$DEST"; then C_DIFF_REF=ok; else C_DIFF_REF=FAILED; warn "diff -r globus copy:"; head -n 10 "$LOGS/c.diff.out" >&2; fi
        fi
    fi
    add_cpu "c.$tool" "$CPU_S" "$(srv_cpu_delta "$cb" "$ca")" "$bytes"
    log "  c run $r $tool: $(fmt "$fps" 0) files/s, $(fmt "$mbs" 0) MB/s (${ELAPSED}s)"
    rm -rf -- "$DEST"
}

# One untimed copy by each tool before the timed runs, results discarded: the first copy of a
# series writes its files into memory the guest has not touched since boot, which on a VM made
# it about half as fast (hsxfer 3,307 files/s against 5,368-7,241 in the runs after), and
# whichever tool ran first paid it. Later copies reuse the pages the earlier ones freed.
c_warm_up() {
    local -n cmd
    for cmd in HS_SMALL_CMD GUC_SMALL_CMD; do
        rm -rf -- "$DEST"; mkdir -p "$DEST"
        "${cmd[@]}" >/dev/null 2>&1 || warn "c warm-up: ${cmd[0]##*/} failed"
    done
    rm -rf -- "$DEST"
    between_runs
}

if (( RUN_C )); then
    LOAD_AT[c]=$(cat /proc/loadavg)
    log "test c: pull $SMALL_COUNT x $SMALL_LABEL files, $RUNS run(s)"
    record_cmd "c hsxfer:       $(qcmd "${HS_SMALL_CMD[@]}")   # DEST is a fresh empty dir, removed after each run"
    record_cmd "c reference:    $(qcmd "${GUC_SMALL_CMD[@]}")"
    c_warm_up
    alternate c_run
fi

# ============================================================================= d. big file pull, verified
# GridFTP's own end-to-end check (-verify-checksum: an MD5 of the file at both ends after the
# transfer) against hsxfer's (on by default). Both write a tmpfs file, removed after each run.
D_HS=(); D_REF=()
HS_VBIG_CMD=("$HSXFER" copy -n "$STREAMS" --no-auth "${CLEAR_ARGS[@]}" --port "$HS_PORT" 127.0.0.1:big.bin "$DEST/big.bin")
GUC_VBIG_CMD=(globus-url-copy -p "$STREAMS" -verify-checksum "ftp://127.0.0.1:${GFS_PORT}${BIG}" "file://$DEST/big.bin")

if (( RUN_D )); then
    LOAD_AT[d]=$(cat /proc/loadavg)
    log "test d: pull $BIG_SIZE file -> tmpfs file, both verified, $RUNS run(s)"
    record_cmd "d hsxfer:       $(qcmd "${HS_VBIG_CMD[@]}")   # DEST is a fresh empty dir, removed after each run"
    record_cmd "d reference:    $(qcmd "${GUC_VBIG_CMD[@]}")"
    between_runs
    alternate big_pull d
fi

LOAD_AFTER=$(cat /proc/loadavg)

# ============================================================================= report
TARGET_A=1.0; TARGET_B=1.0; TARGET_C=3; TARGET_D=2
MISSED=0
verdict() { # ratio target
    awk -v r="$1" -v t="$2" 'BEGIN{ if (r=="null"||r=="") print "n/a (FAIL)"; else if (r+0 >= t+0) print "PASS"; else print "FAIL" }'
}

A_HS_MED=$(median "${A_HS[@]}");  A_REF_MED=$(median "${A_REF[@]}");  A_RATIO=$(fdiv "$A_HS_MED" "$A_REF_MED")
B_HS_MED=$(median "${B_HS[@]}");  B_REF_MED=$(median "${B_REF[@]}");  B_RATIO=$(fdiv "$B_HS_MED" "$B_REF_MED")
C_HS_MED=$(median "${C_HS[@]}");  C_REF_MED=$(median "${C_REF[@]}");  C_RATIO=$(fdiv "$C_HS_MED" "$C_REF_MED")
D_HS_MED=$(median "${D_HS[@]}");  D_REF_MED=$(median "${D_REF[@]}");  D_RATIO=$(fdiv "$D_HS_MED" "$D_REF_MED")
RES_D=$(verdict "$D_RATIO" "$TARGET_D")
RES_A=$(verdict "$A_RATIO" "$TARGET_A"); RES_B=$(verdict "$B_RATIO" "$TARGET_B"); RES_C=$(verdict "$C_RATIO" "$TARGET_C")
(( RUN_A )) && [[ $RES_A != PASS ]] && MISSED=$((MISSED+1))
(( RUN_B )) && [[ $RES_B != PASS ]] && MISSED=$((MISSED+1))
(( RUN_C )) && [[ $RES_C != PASS ]] && MISSED=$((MISSED+1))
(( RUN_D )) && [[ $RES_D != PASS ]] && MISSED=$((MISSED+1))
C_HS_MB_MED=$(median "${C_HS_MB[@]}"); C_REF_MB_MED=$(median "${C_REF_MB[@]}")

BIG_LABEL=$(numfmt --to=iec-i --suffix=B "$BIG_BYTES")
{
echo "## hsxfer whole-transfer benchmark"
echo
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) · $(uname -n) · $(nproc) CPUs · kernel $(uname -r) · runs per test: $RUNS (median; tools alternated run by run) · loopback 127.0.0.1 · data on tmpfs · hsxfer $([[ ${#CLEAR_ARGS[@]} -gt 0 ]] && echo "in clear text (--no-encrypt)" || echo "with TLS 1.3")"
echo
echo "| test | hsxfer | reference | ratio | target | result |"
echo "|---|---|---|---|---|---|"
if (( RUN_A )); then
    echo "| a. memory-to-memory, $STREAMS streams, ${BENCH_TIME} s | $(fmt "$(fdiv "$A_HS_MED" 1e9)" 2) Gbit/s | $(fmt "$(fdiv "$A_REF_MED" 1e9)" 2) Gbit/s (iperf3) | $(fmt "$A_RATIO" 2)× | ≥ ${TARGET_A}× | $RES_A |"
fi
if (( RUN_B )); then
    echo "| b. pull $BIG_LABEL file → /dev/null, $STREAMS streams | $(fmt "$B_HS_MED" 0) MB/s | $(fmt "$B_REF_MED" 0) MB/s (globus-url-copy) | $(fmt "$B_RATIO" 2)× | ≥ ${TARGET_B}× | $RES_B |"
fi
if (( RUN_C )); then
    echo "| c. pull $SMALL_COUNT × $SMALL_LABEL files (tree) | $(fmt "$C_HS_MED" 0) files/s ($(fmt "$C_HS_MB_MED" 0) MB/s) | $(fmt "$C_REF_MED" 0) files/s ($(fmt "$C_REF_MB_MED" 0) MB/s) (globus-url-copy) | $(fmt "$C_RATIO" 2)× | ≥ ${TARGET_C}× | $RES_C |"
fi
if (( RUN_D )); then
    echo "| d. pull $BIG_LABEL file → tmpfs file, verified, $STREAMS streams | $(fmt "$D_HS_MED" 0) MB/s | $(fmt "$D_REF_MED" 0) MB/s (globus-url-copy -verify-checksum) | $(fmt "$D_RATIO" 2)× | ≥ ${TARGET_D}× | $RES_D |"
fi
echo
echo "MB = 10^6 bytes. Ratio = median(hsxfer) / median(reference); for c the ratio is of files/s."
echo
echo "### Per-run values"
echo
(( RUN_A )) && echo "- a hsxfer goodput (bit/s): ${A_HS[*]:-none} · verified: ${A_HS_VERIFIED[*]:-n/a}" \
            && echo "- a iperf3 end.sum_received.bits_per_second: ${A_REF[*]:-none}"
[[ -n $A_UNIT_NOTE ]] && echo "- note: $A_UNIT_NOTE"
(( RUN_B )) && echo "- b hsxfer MB/s: ${B_HS[*]:-none} · globus-url-copy MB/s: ${B_REF[*]:-none} · hsxfer cmp-verified pull: $B_VERIFY"
(( RUN_D )) && echo "- d hsxfer MB/s: ${D_HS[*]:-none} · globus-url-copy -verify-checksum MB/s: ${D_REF[*]:-none} · both copies cmp-checked every run"
(( RUN_C )) && echo "- c hsxfer files/s: ${C_HS[*]:-none} · globus-url-copy files/s: ${C_REF[*]:-none} · file counts checked every run · diff -r: hsxfer $C_DIFF_HS, globus $C_DIFF_REF"
echo
echo "### CPU"
echo
echo "- /proc/loadavg before: $LOAD_BEFORE · after: $LOAD_AFTER"
for t in a b c d; do [[ -n ${LOAD_AT[$t]:-} ]] && echo "- /proc/loadavg at start of test $t: ${LOAD_AT[$t]}"; done
echo
echo "CPU-seconds per GB (10^9 bytes) moved, median over runs. Server = utime+stime+cutime+cstime delta of the server process"
echo "(includes reaped GridFTP per-connection children). Client = perf stat task-clock (only with --perf)."
echo
echo "| test | hsxfer client | reference client | hsxfer server | reference server |"
echo "|---|---|---|---|---|"
(( RUN_A )) && echo "| a | $(fmt "$(cpu_per_gb a.hsxfer client)" 3) | $(fmt "$(cpu_per_gb a.iperf3 client)" 3) | $(fmt "$(cpu_per_gb a.hsxfer server)" 3) | $(fmt "$(cpu_per_gb a.iperf3 server)" 3) |"
(( RUN_B )) && echo "| b | $(fmt "$(cpu_per_gb b.hsxfer client)" 3) | $(fmt "$(cpu_per_gb b.globus client)" 3) | $(fmt "$(cpu_per_gb b.hsxfer server)" 3) | $(fmt "$(cpu_per_gb b.globus server)" 3) |"
(( RUN_C )) && echo "| c | $(fmt "$(cpu_per_gb c.hsxfer client)" 3) | $(fmt "$(cpu_per_gb c.globus client)" 3) | $(fmt "$(cpu_per_gb c.hsxfer server)" 3) | $(fmt "$(cpu_per_gb c.globus server)" 3) |"
(( RUN_D )) && echo "| d | $(fmt "$(cpu_per_gb d.hsxfer client)" 3) | $(fmt "$(cpu_per_gb d.globus client)" 3) | $(fmt "$(cpu_per_gb d.hsxfer server)" 3) | $(fmt "$(cpu_per_gb d.globus server)" 3) |"
echo
echo "### Commands"
echo
echo '```'
printf '%s\n' "${CMD_LINES[@]}"
(( PERF )) && echo "(every client command above was run as: perf stat -x, -o FILE -e task-clock,context-switches -- CMD)"
echo "timing: wall clock, date +%s.%N immediately before/after each client command; sync between runs"
echo '```'
echo
echo "Versions: hsxfer: $("$HSXFER" --version 2>/dev/null | head -n 1 || true) ($HSXFER) · $(iperf3 --version 2>/dev/null | head -n 1) · globus-url-copy $(globus-url-copy -version 2>&1 | awk '{print $2; exit}') · $(globus-gridftp-server -version 2>&1 | head -n 1)"
(( ERRORS )) && echo && echo "**$ERRORS error(s) during the run — see warnings on stderr.**"
} | tee "$LOGS/report.md"

# ----------------------------------------------------------------------------- JSON
if [[ -n $OUT ]]; then
    cmds_json=$(printf '%s\n' "${CMD_LINES[@]}" | jq -R . | jq -s -c .)
    jq -n \
        --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --arg host "$(uname -n)" --arg kernel "$(uname -r)" \
        --argjson cpus "$(nproc)" --argjson runs "$RUNS" --argjson streams "$STREAMS" \
        --argjson bench_time "$BENCH_TIME" --argjson big_bytes "$BIG_BYTES" \
        --argjson small_count "$SMALL_COUNT" --argjson small_file_size "$SMALL_FILE_SIZE" \
        --arg hsxfer "$HSXFER" --arg load_before "$LOAD_BEFORE" --arg load_after "$LOAD_AFTER" \
        --argjson perf "$PERF" --argjson clear "$([[ ${#CLEAR_ARGS[@]} -gt 0 ]] && echo true || echo false)" --argjson errors "$ERRORS" --argjson commands "$cmds_json" \
        --argjson run_a "$RUN_A" --argjson run_b "$RUN_B" --argjson run_c "$RUN_C" --argjson run_d "$RUN_D" \
        --argjson d_hs "$(json_arr "${D_HS[@]}")" --argjson d_ref "$(json_arr "${D_REF[@]}")" \
        --argjson d_hs_med "$D_HS_MED" --argjson d_ref_med "$D_REF_MED" --argjson d_ratio "$D_RATIO" \
        --argjson a_hs "$(json_arr "${A_HS[@]}")" --argjson a_ref "$(json_arr "${A_REF[@]}")" \
        --argjson a_hs_med "$A_HS_MED" --argjson a_ref_med "$A_REF_MED" --argjson a_ratio "$A_RATIO" \
        --argjson b_hs "$(json_arr "${B_HS[@]}")" --argjson b_ref "$(json_arr "${B_REF[@]}")" \
        --argjson b_hs_med "$B_HS_MED" --argjson b_ref_med "$B_REF_MED" --argjson b_ratio "$B_RATIO" \
        --arg b_verify "$B_VERIFY" \
        --argjson c_hs "$(json_arr "${C_HS[@]}")" --argjson c_ref "$(json_arr "${C_REF[@]}")" \
        --argjson c_hs_mb "$(json_arr "${C_HS_MB[@]}")" --argjson c_ref_mb "$(json_arr "${C_REF_MB[@]}")" \
        --argjson c_hs_med "$C_HS_MED" --argjson c_ref_med "$C_REF_MED" --argjson c_ratio "$C_RATIO" \
        --arg c_diff_hs "$C_DIFF_HS" --arg c_diff_ref "$C_DIFF_REF" \
        --argjson cpu "$(
            for k in a.hsxfer a.iperf3 b.hsxfer b.globus c.hsxfer c.globus d.hsxfer d.globus; do
                printf '{"key":"%s","client_cpu_s_per_gb":%s,"server_cpu_s_per_gb":%s}\n' \
                    "$k" "$(cpu_per_gb "$k" client)" "$(cpu_per_gb "$k" server)"
            done | jq -s -c 'map({(.key): {client_cpu_s_per_gb, server_cpu_s_per_gb}}) | add')" \
        '{
          date: $date, host: $host, kernel: $kernel, cpus: $cpus, hsxfer: $hsxfer,
          params: {runs: $runs, streams: $streams, bench_time_s: $bench_time, big_bytes: $big_bytes,
                   small_count: $small_count, small_file_size: $small_file_size, perf: ($perf == 1),
                   hsxfer_encrypted: ($clear | not)},
          loadavg: {before: $load_before, after: $load_after},
          tests: ([
            (if $run_a == 1 then {name: "mem_to_mem", unit: "bit/s", reference: "iperf3",
                hsxfer_runs: $a_hs, reference_runs: $a_ref, hsxfer_median: $a_hs_med,
                reference_median: $a_ref_med, ratio: $a_ratio, target: 1.0,
                pass: ($a_ratio != null and $a_ratio >= 1.0)} else empty end),
            (if $run_b == 1 then {name: "big_file_pull", unit: "MB/s", reference: "globus-url-copy",
                hsxfer_runs: $b_hs, reference_runs: $b_ref, hsxfer_median: $b_hs_med,
                reference_median: $b_ref_med, ratio: $b_ratio, target: 1.0,
                pass: ($b_ratio != null and $b_ratio >= 1.0), hsxfer_cmp_verify: $b_verify} else empty end),
            (if $run_c == 1 then {name: "small_files_pull", unit: "files/s", reference: "globus-url-copy",
                hsxfer_runs: $c_hs, reference_runs: $c_ref, hsxfer_mbps_runs: $c_hs_mb,
                reference_mbps_runs: $c_ref_mb, hsxfer_median: $c_hs_med, reference_median: $c_ref_med,
                ratio: $c_ratio, target: 3, pass: ($c_ratio != null and $c_ratio >= 3),
                diff_hsxfer: $c_diff_hs, diff_reference: $c_diff_ref} else empty end),
            (if $run_d == 1 then {name: "big_file_pull_verified", unit: "MB/s",
                reference: "globus-url-copy -verify-checksum",
                hsxfer_runs: $d_hs, reference_runs: $d_ref, hsxfer_median: $d_hs_med,
                reference_median: $d_ref_med, ratio: $d_ratio, target: 2,
                pass: ($d_ratio != null and $d_ratio >= 2)} else empty end)
          ]),
          cpu: $cpu, commands: $commands, errors: $errors
        }' >"$OUT" || { warn "writing JSON to $OUT failed"; ERRORS=$((ERRORS+1)); }
    log "JSON results written to $OUT"
fi

if (( ERRORS )); then exit 1; fi
if (( STRICT && MISSED )); then exit 3; fi
exit 0
