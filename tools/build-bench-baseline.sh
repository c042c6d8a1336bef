#!/usr/bin/env bash
# Builds the apps as they were before the hot-path work of issue #5
# (commit 33db390) plus the push-only server flag tools/dblp-bench needs
# (tools/bench-baseline.patch), for `tools/dblp-bench --baseline_build`.
#
#   tools/build-bench-baseline.sh [DIR]     # default /tmp/dblp-bench-baseline
#   tools/dblp-bench --steps --baseline_build DIR/build ...
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-/tmp/dblp-bench-baseline}"
base=33db390
if [ -e "$dir" ]; then
  echo "build-bench-baseline: $dir exists; remove it or pass another DIR" >&2
  exit 2
fi
git -C "$repo" worktree add --detach "$dir" "$base" >/dev/null
git -C "$dir" apply "$repo/tools/bench-baseline.patch"
meson setup "$dir/build" "$dir" -Dtraining=disabled >/dev/null
ninja -C "$dir/build" apps/dblp-server apps/dblp-worker
echo "baseline apps in $dir/build/apps (pass --baseline_build $dir/build)"
