#!/usr/bin/env bash
# A switched testbed of network namespaces for net_af_packet runs: N host
# namespaces, each with one veth "eth0" whose peer sits on a Linux bridge in
# a "switch" namespace. Nothing is connected to the root namespace or to any
# real interface, so no traffic can leave the testbed.
set -euo pipefail

PROG=$(basename "$0")
PREFIX=dblp
HOSTS=4
SUBNET=10.0.0
MTU=1500
ACTION=""

usage() {
  cat <<EOF
Usage: $PROG up [--hosts N] [--prefix NAME] [--subnet A.B.C] [--mtu BYTES]
       $PROG down [--prefix NAME]
       $PROG status [--prefix NAME]

up     creates namespaces NAME-sw (bridge br0) and NAME-h0 .. NAME-h<N-1>
       (default N=$HOSTS: a server and 3 workers). Host i gets eth0 with
       A.B.C.<i+1>/24 (default $SUBNET.x: h0 = $SUBNET.1 is the server,
       matching dblp-server's default --local_ip, h<1+r> = worker r's
       default $SUBNET.<2+r>). TX checksum offload is turned off on every
       veth (ethtool -K tx off) so kernel-sent frames carry full checksums.
down   deletes every namespace named NAME-sw / NAME-h<k> (their veths go
       with them). Nothing else is touched.
status lists the testbed's namespaces, links and addresses.

  --hosts N       host namespaces (2..64, default $HOSTS)
  --prefix NAME   namespace name prefix (default $PREFIX)
  --subnet A.B.C  /24 of the hosts (default $SUBNET)
  --mtu BYTES     MTU of every veth and the bridge (default $MTU)
  -h, --help      this text

Needs root (ip netns). Example run after 'up' (DPDK's af_packet PMD on eth0):
  ip netns exec $PREFIX-h0 build/apps/dblp-server -l 0 --no-huge -m 512 --no-pci \\
      --file-prefix=srv --vdev=net_af_packet0,iface=eth0 -- \\
      --workers=3 --listen=$SUBNET.1:9100 --local_ip=$SUBNET.1
  ip netns exec $PREFIX-h1 build/apps/dblp-worker -l 1 --no-huge -m 256 --no-pci \\
      --file-prefix=w0 --vdev=net_af_packet0,iface=eth0 -- \\
      --server=$SUBNET.1:9100 --local_ip=$SUBNET.2
EOF
}

[ $# -gt 0 ] || { usage >&2; exit 2; }
case "$1" in
  up|down|status) ACTION=$1; shift ;;
  -h|--help) usage; exit 0 ;;
  *) echo "$PROG: first argument must be up, down or status (see --help)" >&2; exit 2 ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) HOSTS=${2:?--hosts needs a number}; shift 2 ;;
    --hosts=*) HOSTS=${1#*=}; shift ;;
    --prefix) PREFIX=${2:?--prefix needs a name}; shift 2 ;;
    --prefix=*) PREFIX=${1#*=}; shift ;;
    --subnet) SUBNET=${2:?--subnet needs A.B.C}; shift 2 ;;
    --subnet=*) SUBNET=${1#*=}; shift ;;
    --mtu) MTU=${2:?--mtu needs a number}; shift 2 ;;
    --mtu=*) MTU=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$PROG: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

case "$HOSTS" in ''|*[!0-9]*) echo "$PROG: --hosts must be a number" >&2; exit 2 ;; esac
if [ "$HOSTS" -lt 2 ] || [ "$HOSTS" -gt 64 ]; then
  echo "$PROG: --hosts must be in 2..64" >&2; exit 2
fi
case "$PREFIX" in
  ''|*[!A-Za-z0-9_-]*) echo "$PROG: --prefix must be [A-Za-z0-9_-]+" >&2; exit 2 ;;
esac
if ! [[ "$SUBNET" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]]; then
  echo "$PROG: --subnet must look like 10.0.0" >&2; exit 2
fi
case "$MTU" in ''|*[!0-9]*) echo "$PROG: --mtu must be a number" >&2; exit 2 ;; esac

SW=$PREFIX-sw

our_namespaces() {
  # Exactly NAME-sw and NAME-h<digits>; never anything else.
  ip netns list 2>/dev/null | awk '{ print $1 }' |
    grep -E "^${PREFIX}-(sw|h[0-9]+)\$" | sort -V || true
}

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$PROG: needs root (ip netns). Fix: sudo $0 $ACTION ..." >&2
    exit 1
  fi
  command -v ip >/dev/null 2>&1 || { echo "$PROG: 'ip' not found. Fix: apt-get install -y iproute2" >&2; exit 1; }
}

status() {
  local ns
  ns=$(our_namespaces)
  if [ -z "$ns" ]; then
    echo "no $PREFIX testbed (no namespace $PREFIX-sw / $PREFIX-h<k>)"
    return 0
  fi
  for n in $ns; do
    echo "== $n"
    ip -n "$n" -br addr show 2>/dev/null | sed 's/^/   /'
  done
}

down() {
  local ns
  ns=$(our_namespaces)
  if [ -z "$ns" ]; then
    echo "$PROG: no $PREFIX testbed to remove"
    return 0
  fi
  for n in $ns; do
    echo "+ ip netns delete $n"
    ip netns delete "$n"
  done
}

up() {
  if [ -n "$(our_namespaces)" ]; then
    echo "$PROG: a $PREFIX testbed exists already; '$0 down --prefix $PREFIX' first" >&2
    exit 1
  fi
  # On any failure, remove what was built so far.
  trap 'echo "$PROG: failed; removing the partial testbed" >&2; down >/dev/null 2>&1 || true' ERR
  local has_ethtool=0
  command -v ethtool >/dev/null 2>&1 && has_ethtool=1
  ip netns add "$SW"
  ip -n "$SW" link set lo up
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 mtu "$MTU" up
  for ((i = 0; i < HOSTS; i++)); do
    local h=$PREFIX-h$i
    ip netns add "$h"
    ip -n "$h" link set lo up
    # Create the pair inside the host namespace, peer straight into the
    # switch: no interface ever appears in the root namespace.
    ip -n "$h" link add eth0 mtu "$MTU" type veth peer name "p$i" mtu "$MTU" netns "$SW"
    ip -n "$SW" link set "p$i" master br0 up
    ip -n "$h" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$h" link set eth0 up
    if [ "$has_ethtool" -eq 1 ]; then
      ip netns exec "$h" ethtool -K eth0 tx off >/dev/null 2>&1 || true
      ip netns exec "$SW" ethtool -K "p$i" tx off >/dev/null 2>&1 || true
    fi
    echo "$h: eth0 $SUBNET.$((i + 1))/24 <-> $SW: p$i (br0)"
  done
  trap - ERR
  [ "$has_ethtool" -eq 1 ] || echo "$PROG: note: ethtool missing, TX checksum offload left on (apt-get install -y ethtool)"
  echo "testbed up: $HOSTS hosts on $SUBNET.0/24, MTU $MTU. Remove: $0 down --prefix $PREFIX"
}

need_root
case "$ACTION" in
  up) up ;;
  down) down ;;
  status) status ;;
esac
