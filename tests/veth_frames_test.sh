#!/usr/bin/env bash
# DBLP frames on a real Linux network stack: dblp-sendframes (DPDK,
# net_af_packet on one end of a veth pair, in namespace A) sends frames built
# by FrameTemplate; in namespace B a kernel UDP socket must receive them and an
# AF_PACKET capture must find every header field and checksum right
# (tests/veth_check.py).
#
# Usage: veth_frames_test.sh <dblp-sendframes> <veth_check.py>
# Needs root and `ip` (netns + veth); otherwise exits 77 (meson: skipped).
set -u

SENDER=${1:?usage: $0 <dblp-sendframes> <veth_check.py>}
CHECKER=${2:?usage: $0 <dblp-sendframes> <veth_check.py>}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (run as root or with sudo)"
for tool in ip python3 timeout; do
  command -v "$tool" >/dev/null 2>&1 || skip "'$tool' not found (apt-get install iproute2 python3 coreutils)"
done
[ -x "$SENDER" ] || fail "sender '$SENDER' is not an executable"

# Names unique per run (interface names must stay under 16 characters).
ID=$(printf '%05x%03x' $(( $$ % 0x100000 )) $(( RANDOM % 0x1000 )))
NSA="dblp-a-$ID"; NSB="dblp-b-$ID"
IFA="dfa$ID"; IFB="dfb$ID"
IPA=10.213.7.1; IPB=10.213.7.2
PREFIX="dblp-veth-$ID"
TMP=$(mktemp -d /tmp/dblp-veth.XXXXXX)
CHECKER_PID=""

cleanup() {
  [ -n "$CHECKER_PID" ] && kill "$CHECKER_PID" 2>/dev/null
  ip netns del "$NSA" 2>/dev/null
  ip netns del "$NSB" 2>/dev/null
  ip link del "$IFA" 2>/dev/null
  rm -rf "$TMP" /var/run/dpdk/"$PREFIX"-* 2>/dev/null
  true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NSA" 2>/dev/null || skip "cannot create network namespaces (ip netns add failed)"
ip netns add "$NSB" || skip "cannot create a second network namespace"
ip link add "$IFA" type veth peer name "$IFB" 2>/dev/null || skip "veth interfaces unavailable (ip link add type veth failed)"
ip link set "$IFA" netns "$NSA" || fail "move $IFA to $NSA"
ip link set "$IFB" netns "$NSB" || fail "move $IFB to $NSB"
for ns in "$NSA" "$NSB"; do
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null
  ip netns exec "$ns" ip link set lo up
done
ip netns exec "$NSA" ip link set "$IFA" up || fail "link up $IFA"
ip netns exec "$NSB" ip addr add "$IPB/24" dev "$IFB" || fail "address on $IFB"
ip netns exec "$NSB" ip link set "$IFB" up || fail "link up $IFB"
MACB=$(ip netns exec "$NSB" cat /sys/class/net/"$IFB"/address) || fail "MAC of $IFB"
echo "veth pair $NSA/$IFA -> $NSB/$IFB ($IPB, $MACB)"

EAL=(--no-huge -m 256 --no-pci --no-telemetry -l 0 --log-level='*:warning')

# run_sender <file-prefix suffix> <sender args...>: dblp-sendframes in NSA.
run_sender() {
  local suffix=$1; shift
  timeout -k 5 30 ip netns exec "$NSA" "$SENDER" "${EAL[@]}" \
    --file-prefix="$PREFIX-$suffix" --vdev="net_af_packet0,iface=$IFA" -- "$@"
}

COUNT=64
FLOATS=363   # fills a 1500-byte MTU: 14 + 20 + 8 + 20 + 1452 = 1514 bytes
LAST=17      # short last chunk

# case <name> <udp port> <checker --udp_cksum> <sender args...>
run_case() {
  local name=$1 port=$2 expect=$3; shift 3
  echo "=== $name"
  local ready="$TMP/ready.$name"
  timeout -k 5 40 ip netns exec "$NSB" python3 "$CHECKER" --iface "$IFB" \
    --ip "$IPB" --port "$port" --src_ip "$IPA" --count "$COUNT" \
    --payload_floats "$FLOATS" --last_payload_floats "$LAST" \
    --udp_cksum "$expect" --timeout 20 --ready_file "$ready" &
  CHECKER_PID=$!
  for _ in $(seq 100); do
    [ -e "$ready" ] && break
    kill -0 "$CHECKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  [ -e "$ready" ] || { wait "$CHECKER_PID"; CHECKER_PID=""; fail "$name: checker did not start"; }
  if ! run_sender "$name" --dst_mac="$MACB" --dst_ip="$IPB" --src_ip="$IPA" \
      --dst_port="$port" --count="$COUNT" --payload_floats="$FLOATS" \
      --last_payload_floats="$LAST" "$@"; then
    kill "$CHECKER_PID" 2>/dev/null; wait "$CHECKER_PID" 2>/dev/null; CHECKER_PID=""
    fail "$name: dblp-sendframes failed"
  fi
  wait "$CHECKER_PID"; local rc=$?; CHECKER_PID=""
  [ "$rc" = 0 ] || fail "$name: checker exit code $rc"
}

run_case sw 9300 valid --checksum=sw
run_case auto 9301 valid --checksum=auto   # af_packet has no offloads: sw
run_case none 9302 zero --checksum=none
# Negative control: corrupt UDP checksums must be caught by the capture check
# and dropped by the kernel, so the two checks above really discriminate.
run_case corrupt 9303 corrupt --checksum=sw --corrupt_udp_cksum

# Error messages name the fix.
echo "=== errors"
out=$(timeout -k 5 30 ip netns exec "$NSA" "$SENDER" "${EAL[@]}" \
        --file-prefix="$PREFIX-noport" -- --dst_mac="$MACB" --dst_ip="$IPB" \
        --src_ip="$IPA" 2>&1) && fail "sender without a port succeeded"
echo "$out" | grep -q "available ports: none" || fail "no port list in: $out"
echo "$out" | grep -q -- "--vdev=" || fail "no --vdev hint in: $out"
out=$(run_sender bigmtu --dst_mac="$MACB" --dst_ip="$IPB" --src_ip="$IPA" \
        --mtu=9600 --payload_floats=10 2>&1) && fail "MTU 9600 on af_packet accepted"
echo "$out" | grep -q "above the device's max" || fail "no device max in: $out"
echo "$out" | grep "above the device's max"

echo "PASS: DBLP frames from DPDK verified by a kernel UDP socket and an AF_PACKET capture"
exit 0
