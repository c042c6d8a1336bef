#!/usr/bin/env bash
# The test command of README.md: installs what is missing, configures,
# builds and runs every meson test suite. Exit code 0 only if all pass.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD_DIR:-build}
tools/install-deps.sh
# -Dtest_hooks=true: the tests' twins of the apps with fault flags
# (build/apps/hooked/); the apps themselves stay without them.
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=debugoptimized -Dtest_hooks=true
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
