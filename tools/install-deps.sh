#!/usr/bin/env bash
# Installs the Debian packages DBLP needs to build and test, if missing.
# Idempotent: does nothing (and needs no network) when all are present.
set -euo pipefail

PKGS=(meson ninja-build pkg-config g++ libgtest-dev libgflags-dev
      libgoogle-glog-dev libnuma-dev dpdk dpdk-dev libdpdk-dev python3 iproute2
      zlib1g-dev libssl-dev libipsec-mb-dev libtorch-dev dataset-fashion-mnist python3-matplotlib
      pybind11-dev python3-dev python3-torch python3-numpy python3-pytest)
# The shaped, lossy testbed and its evaluation (tools/dblp-testbed, -eval).
PKGS+=(nftables iperf3 ethtool python3-torchvision)
# The fuzzers (tools/run-fuzz.sh): clang and its libFuzzer/sanitizer runtimes.
PKGS+=(clang libclang-rt-14-dev)
PKGS+=("$@")

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || {
    echo "install-deps: need root to install: ${missing[*]} (run as root or install sudo)" >&2
    exit 1
  }
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
