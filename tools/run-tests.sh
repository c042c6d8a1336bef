#!/usr/bin/env bash
# The test command of README.md: installs what is missing, configures,
# builds and runs every meson test suite. Exit code 0 only if all pass.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD_DIR:-build}
tools/install-deps.sh
# -Dtest_hooks=true: the tests' twins of the apps with fault flags
# (build/apps/hooked/); the apps themselves stay without them.
# DBLP_FAST_BUILD=1 (.ci/run sets it): a fresh build dir for one run and
# then thrown away: no debug info (-O2 and assert()s as always) and a
# unity build (the torch units apart: training/meson.build): 438
# CPU-seconds from scratch on the 2-core VM, where the per-file build kept
# both cores busy for 338 s (docs/RELIABILITY.md, "Time in CI"). What a unity build alone
# warns of is quieted as in tools/run-sanitizers.sh; a developer's build
# keeps one compile per file (a missing include shows) and -g.
# DBLP_BUILD_ONLY=1: stop after the build (.ci/run builds first, then
# starts the sanitizer build beside the tests).
if [ ! -f "$BUILD/build.ninja" ]; then
  kind=(--buildtype=debugoptimized)
  if [ "${DBLP_FAST_BUILD:-0}" = 1 ]; then
    kind=(-Doptimization=2 -Ddebug=false --unity=on
          "-Dcpp_args=-Wno-subobject-linkage -Wno-deprecated-declarations")
  fi
  meson setup "$BUILD" "${kind[@]}" -Dtest_hooks=true
elif ! meson introspect "$BUILD" --buildoptions |
     grep -q '"name": "test_hooks", "value": true'; then
  meson setup --reconfigure "$BUILD" -Dtest_hooks=true >/dev/null
fi
ninja -C "$BUILD"
[ "${DBLP_BUILD_ONLY:-0}" = 1 ] && exit 0

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
