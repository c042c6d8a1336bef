#!/usr/bin/env bash
# The protocol alone, without DPDK: a 3-worker DBLP job with two 70%
# microbursts, fixed (MLT) vs dblp, in one process (no EAL, no ports, no
# hugepages). The main job of README.md is tools/run-cluster.sh (dblp-server
# and dblp-workers over memif). Extra flags go to dblp-inmem-demo (e.g.
# --iterations=200 --out_dir=results/inmem).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD_DIR:-build}
tools/install-deps.sh
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" --buildtype=debugoptimized
ninja -C "$BUILD" apps/dblp-inmem-demo >/dev/null
exec "$BUILD/apps/dblp-inmem-demo" "$@"
