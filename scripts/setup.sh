#!/usr/bin/env bash
# Installs what hsxfer needs on a fresh Debian/Ubuntu machine: system packages and, if no
# Rust toolchain is present, rustup's stable toolchain. Idempotent; run as root (or with sudo).
set -euo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=()
# clang, llvm, libbpf-dev, linux-libc-dev: rebuild and check the bundled BPF congestion controls
# (bpf/); libelf-dev, zlib1g-dev: the libbpf that libbpf-sys builds and links in;
# openssh-client, openssh-server: copy --ssh and its test against a real sshd;
# python3, python3-venv, python3-pip: the Python package (pip install ./python) and its tests;
# tcpdump: the test that an encrypted copy shows none of its data on the wire;
# e2fsprogs (chattr): a test's directory that refuses new entries even to root.
for pkg in ca-certificates curl gcc libc6-dev make pkg-config coreutils util-linux iproute2 procps ethtool iputils-ping iptables \
    clang llvm libbpf-dev linux-libc-dev libelf-dev zlib1g-dev openssh-client openssh-server \
    python3 python3-venv python3-pip tcpdump e2fsprogs; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
cargo --version
