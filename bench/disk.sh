#!/usr/bin/env bash
# bench/disk.sh — hsxfer pushes onto a real disk against the plain copy of the same bytes.
#
#   small  N small files from tmpfs:  hsxfer copy -r          vs  cp -r, then sync -f
#   big    one file, disk to disk:    hsxfer copy (push)      vs  dd bs=4M conv=fsync   (issue 17: >= 0.9x)
#                                                             and dd bs=4M oflag=direct conv=fsync
#   (hsxfer writes files of 64 MiB and more with O_DIRECT; the second reference does too)
#
# The server is rooted on DIR (a directory on the disk under test) and listens on loopback.
# The two tools alternate run by run (odd runs hsxfer first); each run writes a fresh
# destination, removed after it, with `sync; sleep 1` between runs. Reports the median wall
# time of each and the ratio reference / hsxfer (above 1: hsxfer is faster).
#
# Usage: bench/disk.sh [--dir DIR] [--runs R] [--only small,big] [--small-count N]
#                      [--small-size SIZE] [--big-size SIZE]
#   --dir DIR        directory on the disk under test (default /var/tmp/hsxfer-disk-bench)
#   --runs R         runs per tool (default 3)
#   --small-count N  small files, over 100 directories (default 10000)
#   --small-size S   size of each, bytes or with K/M (default 4K)
#   --big-size S     size of the big file, head -c syntax (default 4G)
# Environment: HSXFER=/path/to/hsxfer (default: target/release/hsxfer, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=/var/tmp/hsxfer-disk-bench RUNS=3 ONLY=small,big COUNT=10000 SIZE=4K BIG=4G
while (($#)); do
    case $1 in
        --dir) DIR=$2 ;; --runs) RUNS=$2 ;; --only) ONLY=$2 ;;
        --small-count) COUNT=$2 ;; --small-size) SIZE=$2 ;; --big-size) BIG=$2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "disk.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift 2
done
HSXFER=${HSXFER:-target/release/hsxfer}
[[ -x $HSXFER ]] || cargo build --release --features cli >&2
HSXFER=$(realpath "$HSXFER")

SRC=$(mktemp -d /dev/shm/hsxfer-disk-bench.XXXX)
mkdir -p "$DIR"; DIR=$(realpath "$DIR"); ROOT=$DIR/root; mkdir -p "$ROOT"
PORT=$((20000 + RANDOM % 20000))
"$HSXFER" serve --root "$ROOT" --listen 127.0.0.1 --port "$PORT" --no-auth >"$SRC.serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$SRC" "$SRC.serve.log" "$ROOT" "$DIR/big.bin" "$DIR/dd.bin"' EXIT
sleep 0.5

bytes() { numfmt --from=iec "$1"; }
elapsed() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); printf '%.2f' "$(echo "$t1 - $t0" | bc)"; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# compare NAME HSXFER-FN REFERENCE-FN: alternated runs, then one markdown row.
compare() {
    local name=$1 hs=() ref=() r
    for ((r = 1; r <= RUNS; r++)); do
        sync; sleep 1
        if ((r % 2)); then hs+=("$($2 "$r")"); sync; sleep 1; ref+=("$($3 "$r")")
        else ref+=("$($3 "$r")"); sync; sleep 1; hs+=("$($2 "$r")"); fi
        echo "  $name run $r: hsxfer ${hs[-1]} s, reference ${ref[-1]} s" >&2
    done
    local mh mr
    mh=$(median "${hs[@]}"); mr=$(median "${ref[@]}")
    printf '| %s | %.2f s (%s) | %.2f s (%s) | %.2f |\n' "$name" "$mh" "${hs[*]}" "$mr" "${ref[*]}" \
        "$(echo "$mr / $mh" | bc -l)"
}

echo "| test | hsxfer (median, runs) | reference (median, runs) | reference / hsxfer |"
echo "|---|---|---|---|"
if [[ ,$ONLY, == *,small,* ]]; then
    size=$(bytes "$SIZE")
    for ((i = 0; i < COUNT; i++)); do
        d=$SRC/small/d$((i % 100)); [[ -d $d ]] || mkdir -p "$d"
        head -c "$size" /dev/urandom >"$d/f$i"
    done
    small_hs() { elapsed "$HSXFER" copy -r --no-auth --known-servers "$SRC/known" --port "$PORT" "$SRC/small" "127.0.0.1:s$1"; rm -rf "$ROOT/s$1"; }
    small_ref() { elapsed sh -c "cp -r '$SRC/small' '$ROOT/c$1' && sync -f '$ROOT/c$1'"; rm -rf "$ROOT/c$1"; }
    echo "small: $COUNT x $SIZE from tmpfs into $ROOT" >&2
    compare "push $COUNT × $SIZE files (100 dirs) / \`cp -r\` + \`sync -f\`" small_hs small_ref
fi
if [[ ,$ONLY, == *,big,* ]]; then
    head -c "$(bytes "$BIG")" /dev/urandom >"$DIR/big.bin"
    big_hs() { elapsed "$HSXFER" copy -n 8 --no-auth --known-servers "$SRC/known" --port "$PORT" "$DIR/big.bin" "127.0.0.1:b$1.bin"; rm -f "$ROOT/b$1.bin"; }
    big_ref() { elapsed dd if="$DIR/big.bin" of="$DIR/dd.bin" bs=4M conv=fsync status=none; rm -f "$DIR/dd.bin"; }
    echo "big: $BIG on $DIR" >&2
    compare "push $BIG, disk to disk / \`dd bs=4M conv=fsync\`" big_hs big_ref
    big_direct() { elapsed dd if="$DIR/big.bin" of="$DIR/dd.bin" bs=4M oflag=direct conv=fsync status=none; rm -f "$DIR/dd.bin"; }
    compare "push $BIG, disk to disk / \`dd bs=4M oflag=direct conv=fsync\`" big_hs big_direct
fi
