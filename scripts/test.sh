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
cargo test --release --all-targets --all-features --no-run

# The tests through emulated paths spend most of their time waiting, with the CPU idle. The
# checks that need only the CPU run meanwhile, at the lowest priority (SCHED_IDLE: any other
# task that wants the CPU gets it first; the delay element runs at real-time priority), so
# that they do not disturb the paths: tests/cc.rs took 267.6 s with them running and 267.0 s
# without on 2 cores, and repeated no flow for a late delay element. They stay in this
# session: with autogroup scheduling, a session of their own would get half the CPU as a group.
checks_log=target/checks.log
if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0); else idle=(nice -n 19); fi
set -m # a process group of their own, to end them with
"${idle[@]}" bash scripts/checks.sh </dev/null >"$checks_log" 2>&1 &
checks=$!
set +m
trap 'kill -- -"$checks" 2>/dev/null || true' EXIT

# Every test binary runs even when an earlier one fails; any failure still fails the script.
# Those through emulated paths first, while the checks run; then every other target,
# including any test target added later (cargo lists them).
on_paths=(cc lab netpath tuning)
test_targets=$(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "hsxfer":
        print("\n".join(t["name"] for t in p["targets"] if "test" in t["kind"]))')
others=()
for name in $test_targets; do
    [[ " ${on_paths[*]} " == *" $name "* ]] || others+=(--test "$name")
done
[ "${#others[@]}" -gt 0 ] || { echo "cargo metadata listed no test targets" >&2; exit 1; }
tests=0
cargo test --release --all-features --no-fail-fast $(printf -- '--test %s ' "${on_paths[@]}") ||
    tests=$?
cargo test --release --all-features --no-fail-fast --lib --bins --benches --examples \
    "${others[@]}" || tests=$?
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
