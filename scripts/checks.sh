#!/usr/bin/env bash
# The checks that need only the CPU: lints, the documentation's build, the Python wheel and a
# short fuzzing run of the peer-input decoders. scripts/test.sh runs this at the lowest CPU
# priority while its tests wait on emulated paths; on its own it is a quick check of a change
# (about 6 minutes from scratch on 2 cores). Each step prints a line with the seconds since
# the start, so a slow step shows in a log.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
# A build directory of their own: these builds run while cargo test uses target/, and share
# none of its artifacts anyway (lints and docs need metadata only; the wheel is built without
# the test suite's features).
export CARGO_TARGET_DIR=target/checks
# Ends with the script that started it (scripts/test.sh runs this in a process group of its
# own), should that script be killed outright.
parent=$PPID
(while kill -0 "$parent" 2>/dev/null; do sleep 5; done; kill -- -$$ 2>/dev/null) &
watchdog=$!
trap 'kill "$watchdog" 2>/dev/null || true' EXIT
start=$(date +%s)
step() { echo "== $(($(date +%s) - start)) s: $*"; }

step "clippy, every target"
cargo clippy --release --all-targets --all-features -- -D warnings
# The library alone, as a pipeline embeds it (no command line, no lab), and the Python
# bindings over it: one check of the library serves both.
step "clippy, the library alone and the Python bindings"
cargo clippy --release --lib -p hsxfer -p hsxfer-python -- -D warnings
# The documentation builds without a warning, broken links included: the library's as an
# embedder reads it, then every item's, private ones too, for the next engineer.
step "docs, the library's"
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps
step "docs, every item's"
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --all-features --document-private-items

# The Python package's wheel, built as `pip install ./python` builds it (test.sh installs it
# and runs its tests once the other tests are done).
step "the Python wheel"
python3 -m venv target/pyenv
rm -rf target/wheels
target/pyenv/bin/pip wheel --quiet --no-deps --wheel-dir target/wheels ./python

# Fuzz the peer-input decoders on 400,000 inputs (the same invariants run in the unit tests):
# a count, not a time, since at the lowest priority the time says little (about 45 s of an
# idle core here). Unoptimised and without AddressSanitizer: the decoders are safe Rust (an
# out-of-bounds access is a panic, which the fuzzer reports). Here this build took 1.5
# minutes where the optimised, sanitized one took 3.5, and ran 300,000 inputs in 30 s against
# 550,000.
inputs=400000
step "fuzzing the decoders on $inputs inputs"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --quiet
fuzz_log=$PWD/target/fuzz.log
if ! (cd fuzz && unset CARGO_TARGET_DIR && RUSTC_BOOTSTRAP=1 cargo fuzz run decoders --dev \
    -s none --fuzz-dir . -- -runs=$inputs -max_total_time=1200 >"$fuzz_log" 2>&1); then
    tail -n 40 "$fuzz_log"
    exit 1
fi
tail -n 2 "$fuzz_log"
ran=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$fuzz_log")
if [ "${ran:-0}" -lt "$inputs" ]; then
    echo "the fuzzer ran ${ran:-no} inputs of $inputs" >&2
    exit 1
fi
step "done"
