#!/usr/bin/env bash
# The test command of README.md: installs what is missing, configures,
# builds and runs every meson test suite. Exit code 0 only if all pass.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD_DIR:-build}
tools/install-deps.sh
# -Dtest_hooks=true: the tests' twins of the apps with fault flags
# (build/apps/hooked/); the apps themselves stay without them.
# DBLP_FAST_BUILD=1 (.ci/run sets it): a fresh build dir is a unity build
# without debug info (-O2 and assert()s as always): about 440 CPU-seconds
# from scratch on the 2-core VM where the per-file build with -g takes
# over twice that. For a build that is thrown away after one run; a
# developer's build keeps one compile per file (a missing include shows)
# and -g. What a unity build alone warns of is quieted as in
# tools/run-sanitizers.sh.
if [ ! -f "$BUILD/build.ninja" ]; then
  fast=()
  if [ "${DBLP_FAST_BUILD:-0}" = 1 ]; then
    fast=(--unity=on -Ddebug=false
          "-Dcpp_args=-Wno-subobject-linkage -Wno-deprecated-declarations")
  fi
  meson setup "$BUILD" --buildtype=debugoptimized -Dtest_hooks=true \
    "${fast[@]}"
elif ! meson introspect "$BUILD" --buildoptions |
     grep -q '"name": "test_hooks", "value": true'; then
  meson setup --reconfigure "$BUILD" -Dtest_hooks=true >/dev/null
fi
ninja -C "$BUILD"

rc=0
meson test -C "$BUILD" --print-errorlogs --num-processes 2 "$@" || rc=$?

# One closing line with googletest case counts (meson counts suites only).
log="$BUILD/meson-logs/testlog.txt"
if [ -f "$log" ]; then
  awk '/^\[  PASSED  \] [0-9]+ test/ {p += $4}
       /^\[  FAILED  \] [0-9]+ test/ {f += $4}
       END {printf "googletest: %d passed, %d failed\n", p, f}' "$log"
fi
exit $rc
