#!/usr/bin/env bash
# The main job of README.md: builds DBLP if needed, then runs a local
# cluster (1 dblp-server + 3 dblp-workers over net_memif, --no-huge, no NIC)
# once per policy, fixed (MLT) vs dblp, with two one-iteration 70%
# microbursts, and prints the comparison. Flags go to tools/dblp-cluster
# (see --help), e.g. --iterations 200 --floats 6553600 --out results/run1.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD_DIR:-build}
tools/install-deps.sh
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" --buildtype=debugoptimized
ninja -C "$BUILD" apps/dblp-server apps/dblp-worker >/dev/null
exec python3 tools/dblp-cluster --build "$BUILD" "$@"
