#!/usr/bin/env bash
# The main job of README.md (until the DPDK apps land): a 3-worker DBLP job
# with two 70% microbursts, fixed (MLT) vs dblp, in memory. Extra flags go
# to dblp-inmem-demo (e.g. --iterations=200 --out_dir=results/inmem).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD_DIR:-build}
tools/install-deps.sh
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" --buildtype=debugoptimized
ninja -C "$BUILD" apps/dblp-inmem-demo >/dev/null
exec "$BUILD/apps/dblp-inmem-demo" "$@"
