#!/usr/bin/env bash
# Can the fuzzers fail? Plants one known bug at a time in a copy of a lib/
# source file, links it into the matching fuzz target (the planted object
# overrides the library's) and expects the target to crash within SECONDS
# (default 60). The tree is never modified. Needs a configured build-fuzz
# (tools/run-fuzz.sh). Exit 0 only if every planted bug was caught.
#
#   tests/fuzz/mutants.sh [SECONDS]
#
# A mutant whose pattern no longer matches the source is reported as
# "not applied" (and fails the run): update the pattern with the code.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-60}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
[ -f "$BUILD/compile_commands.json" ] || {
  echo "mutants: configure $BUILD first (tools/run-fuzz.sh 0)" >&2; exit 2; }
ninja -C "$BUILD" -j2 tests/fuzz/fuzz_wire tests/fuzz/fuzz_control \
  tests/fuzz/fuzz_receiver >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# name | lib file | target | sed expression (the bug)
# Not here: dropping ReceiverRound's "len < body + tag" check. The overread
# then happens inside libcrypto's CRYPTO_memcmp, which ASan does not see,
# and the verdict is the same (bad tag), so no fuzzer can notice it.
MUTANTS=(
  "payload_len_off_by_two|lib/dblp/wire/wire.cc|wire|s/payload_len > len - kDataHeaderBytes/payload_len > len - kDataHeaderBytes + 2/"
  "last_chunk_length_unchecked|lib/dblp/wire/wire.cc|wire|s/h.payload_len != layout.Length(h.seq)/h.payload_len > layout.chunk_payload()/"
  "flag_not_canonical|lib/dblp/control/control.cc|control|s/if (b > 1) {/if (b > 2) {/"
  "unknown_type_accepted|lib/dblp/control/control.cc|control|s/\\(t <= static_cast<uint8_t>(ControlType::k[A-Za-z]*)\\);/\\1 + 1;/"
  "compaction_drops_a_byte|lib/dblp/control/control.cc|control|s/buf_.begin() + static_cast<std::ptrdiff_t>(read_));/buf_.begin() + static_cast<std::ptrdiff_t>(read_) + 1);/"
  "stale_round_accepted|lib/dblp/round/receiver_round.cc|receiver|s/if (ahead < 0) return/if (ahead < -1) return/"
  "shard_end_inclusive|lib/dblp/round/receiver_round.cc|receiver|s/>= seq_span_) {/> seq_span_) {/"
  "duplicate_accepted|lib/dblp/round/receiver_round.cc|receiver|s/if (!bitmap_.Set(hdr->seq)) return Count(Verdict::kDuplicate);/bitmap_.Set(hdr->seq);/"
)

# The library's compile command for `src`, re-pointed at the mutant copy.
compile_cmd() {
  python3 - "$BUILD" "$1" "$2" "$3" <<'EOF'
import json, sys, shlex
build, src, mutant, obj = sys.argv[1:]
for e in json.load(open(f"{build}/compile_commands.json")):
    if e["file"].endswith("/" + src) and "libdblp_core" in e["command"]:
        args = shlex.split(e["command"])
        out = []
        skip = False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("-MD",):
                continue
            if a in ("-MQ", "-MF", "-o", "-c"):
                skip = True
                continue
            out.append(a)
        print(shlex.join(out + ["-I", "../" + src.rsplit("/", 2)[0],
                                "-o", obj, "-c", mutant]))
        break
EOF
}

rc=0
for m in "${MUTANTS[@]}"; do
  IFS='|' read -r name file target expr <<< "$m"
  mutant="$TMP/$name.cc"
  sed "$expr" "$file" > "$mutant"
  if cmp -s "$file" "$mutant"; then
    printf '%-30s not applied (pattern gone from %s)\n' "$name" "$file"
    rc=1
    continue
  fi
  # Includes of the form "dblp/x.h" resolve from lib/ as before.
  cmd=$(compile_cmd "$file" "$(realpath "$mutant")" "$TMP/$name.o")
  (cd "$BUILD" && eval "$cmd")
  link=$(sed -n "/^build tests\/fuzz\/fuzz_$target: /,/LINK_ARGS/p" \
           "$BUILD/build.ninja" | sed -n 's/^ LINK_ARGS = //p')
  objs="tests/fuzz/fuzz_$target.p/fuzz_$target.cc.o tests/fuzz/fuzz_$target.p/sanitizer_options.cc.o"
  (cd "$BUILD" && eval "clang++ -o $TMP/$name $objs $TMP/$name.o $link")
  mkdir -p "$TMP/corpus-$name"
  cp "tests/fuzz/corpus/$target"/* "$TMP/corpus-$name/"
  start=$(date +%s)
  if "$TMP/$name" -max_total_time="$SECS" -timeout=10 \
       -artifact_prefix="$TMP/$name-" "$TMP/corpus-$name" \
       >"$TMP/$name.log" 2>&1; then
    printf '%-30s NOT caught in %ss (fuzz_%s)\n' "$name" "$SECS" "$target"
    rc=1
  else
    why=$(grep -m1 -oE 'INVARIANT VIOLATED at [^ ]+ .*|ERROR: AddressSanitizer: [a-z-]+|runtime error: .*' \
            "$TMP/$name.log" | cut -c1-90)
    printf '%-30s caught after %3ss by fuzz_%-8s %s\n' "$name" \
      "$(( $(date +%s) - start ))" "$target" "$why"
  fi
done
exit $rc
