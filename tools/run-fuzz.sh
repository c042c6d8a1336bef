#!/usr/bin/env bash
# Bounded libFuzzer run of every target in tests/fuzz/ (docs/RELIABILITY.md,
# "Fuzzing"). Configures and builds build-fuzz (clang, ASan + UBSan, no
# DPDK) if needed, then fuzzes each target for SECONDS over a working copy
# of its seed corpus and prints one line per target. Exit code 0 only if no
# target crashed, leaked, hung or broke an invariant.
#
#   tools/run-fuzz.sh [SECONDS]          default 60 per target
#   tools/run-fuzz.sh --only receiver 600
#   tools/run-fuzz.sh --update-corpus 300   also merge what was learned into
#                                        tests/fuzz/corpus/ (to commit)
#   tools/run-fuzz.sh --build-only       configure and build the targets only
#
# The working corpora live in build-fuzz/fuzz-corpus/<target> and grow from
# run to run; tests/fuzz/corpus/ is only read unless --update-corpus is given.
# A crash leaves its input in build-fuzz/fuzz-artifacts/; reproduce it with
#   build-fuzz/tests/fuzz/fuzz_<target> build-fuzz/fuzz-artifacts/<file>
set -euo pipefail
cd "$(dirname "$0")/.."

# The comment block above, without its '#'.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; }

SECONDS_PER_TARGET=60
UPDATE_CORPUS=0
BUILD_ONLY=0
TARGETS=(wire control receiver)
while [ $# -gt 0 ]; do
  case "$1" in
    --update-corpus) UPDATE_CORPUS=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    --only) shift; IFS=, read -r -a TARGETS <<< "${1:?--only needs a target list}" ;;
    -h|--help) usage; exit 0 ;;
    *[!0-9]*|'') echo "run-fuzz: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    *) SECONDS_PER_TARGET=$1 ;;
  esac
  shift
done

BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
if ! command -v clang++ >/dev/null ||
   ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
     >/dev/null 2>&1; then
  tools/install-deps.sh  # clang and libclang-rt-14-dev are in its list
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  # No DPDK, training, googletest or Python package: the fuzzers need lib/
  # only, and every object is built with ASan, UBSan and libFuzzer's
  # coverage hooks.
  CC=clang CXX=clang++ meson setup "$BUILD" --buildtype=debugoptimized \
    -Dfuzz=enabled -Db_sanitize=address,undefined -Db_lundef=false \
    -Ddpdk=disabled -Dtraining=disabled -Dtests=disabled \
    -Dpython=disabled >/dev/null
fi
ninja -C "$BUILD" -j"${FUZZ_JOBS:-2}" "${TARGETS[@]/#/tests/fuzz/fuzz_}" >/dev/null
[ "$BUILD_ONLY" -eq 1 ] && exit 0

WORK="$BUILD/fuzz-corpus"
ARTIFACTS="$BUILD/fuzz-artifacts"
LOGS="$BUILD/fuzz-logs"
mkdir -p "$WORK" "$ARTIFACTS" "$LOGS"
# The environment wins over the defaults built into the targets; say it
# again here so that a stray setting cannot make UBSan recover silently.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

rc=0
for t in "${TARGETS[@]}"; do
  exe="$BUILD/tests/fuzz/fuzz_$t"
  seeds="tests/fuzz/corpus/$t"
  [ -x "$exe" ] && [ -d "$seeds" ] || {
    echo "run-fuzz: no target '$t'" >&2; exit 2; }
  mkdir -p "$WORK/$t"
  cp -n "$seeds"/* "$WORK/$t"/ 2>/dev/null || true
  log="$LOGS/$t.log"
  # One process (2-core machine); -timeout makes a slow input a failure.
  t_rc=0
  "$exe" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$ARTIFACTS/$t-" "$WORK/$t" >"$log" 2>&1 || t_rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<< "$last")
  if [ "$t_rc" -eq 0 ]; then
    status=OK
  else
    status="FAILED (exit $t_rc)"
    rc=1
  fi
  printf 'fuzz_%-9s %5ss  %10s execs  %7s/s  cov %5s  ft %6s  corpus %5s  %s\n' \
    "$t" "$SECONDS_PER_TARGET" "${execs:-?}" \
    "$(( ${execs:-0} / (SECONDS_PER_TARGET > 0 ? SECONDS_PER_TARGET : 1) ))" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$status"
  if [ "$t_rc" -ne 0 ]; then
    grep -E 'INVARIANT|ERROR: |runtime error|SUMMARY|Test unit written' "$log" \
      | head -8 | sed 's/^/    /' >&2
    echo "    full log: $log" >&2
  elif [ "$UPDATE_CORPUS" -eq 1 ]; then
    # Adds to the committed seeds only inputs that bring new coverage.
    "$exe" -merge=1 "$seeds" "$WORK/$t" >>"$log" 2>&1
    echo "    merged into $seeds: $(ls "$seeds" | wc -l) files"
  fi
done
exit $rc
