#!/usr/bin/env bash
# The whole test suite: formatting, the bundled BPF objects against their sources, unit and
# integration tests (real sockets on loopback, and emulated paths in network namespaces; they
# and the disk-full test, which mounts a small tmpfs, need root, as CI has), the documentation's
# examples, the library's examples, and scripts/checks.sh: lints, the documentation's build,
# the Python package with its tests, and the fuzz targets' decoders on random input.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all --check
# The committed BPF objects must be what their sources build to.
make -C bpf check
# Most of the tests' time is spent waiting on emulated paths, with the CPU idle, and the
# build leaves a core idle at times too. The checks that need only the CPU run meanwhile, at
# the lowest priority (SCHED_IDLE: any other task that wants the CPU gets it first), so that
# they neither slow the tests much nor disturb the paths: tests/cc.rs took 267.6 s with them
# running and 267.0 s without on 2 cores, and repeated no flow for a late delay element (it
# runs at real-time priority itself).
checks_log=target/checks.log
mkdir -p target
if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0); else idle=(nice -n 19); fi
setsid "${idle[@]}" bash scripts/checks.sh >"$checks_log" 2>&1 &
checks=$!
trap 'kill -- -"$checks" 2>/dev/null || true' EXIT

cargo test --release --all-targets --all-features --no-run

# Every test binary runs even when an earlier one fails; any failure still fails the script.
tests=0
cargo test --release --all-targets --all-features --no-fail-fast || tests=$?
if [ "$tests" -eq 0 ]; then
    # The examples in the documentation (--all-targets leaves them out).
    cargo test --release --doc --all-features || tests=$?
fi
if [ "$tests" -eq 0 ]; then
    # The library's examples, run against each other on loopback.
    bash scripts/examples.sh || tests=$?
fi

checked=0
wait "$checks" || checked=$?
trap - EXIT
echo "---- scripts/checks.sh (exit $checked):"
cat "$checks_log"
[ "$tests" -eq 0 ] || { echo "the tests failed" >&2; exit 1; }
[ "$checked" -eq 0 ] || { echo "scripts/checks.sh failed" >&2; exit 1; }

# The Python package, installed from the wheel checks.sh built as `pip install ./python`
# builds it, and its tests against a server on loopback.
target/pyenv/bin/pip install --quiet --force-reinstall --no-deps target/wheels/hsxfer-*.whl
target/pyenv/bin/pip install --quiet pytest
target/pyenv/bin/python -m pytest -q python/tests
echo "all checks passed"
