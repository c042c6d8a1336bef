#!/usr/bin/env bash
# Preflight for dblp-server / dblp-worker: checks this host and prints the
# exact command that fixes each problem. Reads only; changes nothing and
# sends no traffic.
set -euo pipefail

PROG=$(basename "$0")
MODE=local
BUILD=build
SOCK_DIR=${TMPDIR:-/tmp}
QUIET=0

usage() {
  cat <<EOF
Usage: $PROG [--mode local|nic] [--build DIR] [--sock-dir DIR] [--quiet]

Checks, each PASS / WARN / FAIL with the exact fix:
  * DPDK installed (dpdk-testpmd, pkg-config libdpdk) and the apps built
  * hugepages reserved (or advice to run with --no-huge)
  * IOMMU + vfio-pci, or uio, loaded for NIC binding
  * NIC driver binding (dpdk-devbind.py --status-dev net)
  * memif socket dir and DPDK runtime dir writable
  * cores available (lcores for a server + workers)

  --mode local  (default) the memif local cluster (tools/dblp-cluster):
                no hugepages, no NIC needed; those checks only warn
  --mode nic    a NIC-bound run: hugepages, vfio/uio and a DPDK-bound
                port are hard requirements
  --build DIR   meson build dir holding apps/dblp-server (default: build)
  --sock-dir D  where memif sockets go (default: \$TMPDIR or /tmp)
  --quiet       print only WARN / FAIL lines
  -h, --help    this text

Exit status: 0 when no check FAILed (warnings allowed), 1 otherwise, 2 on
a usage error.
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --mode) MODE=${2:?--mode needs local or nic}; shift 2 ;;
    --mode=*) MODE=${1#*=}; shift ;;
    --build) BUILD=${2:?--build needs a directory}; shift 2 ;;
    --build=*) BUILD=${1#*=}; shift ;;
    --sock-dir) SOCK_DIR=${2:?--sock-dir needs a directory}; shift 2 ;;
    --sock-dir=*) SOCK_DIR=${1#*=}; shift ;;
    --quiet|-q) QUIET=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$PROG: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$MODE" in
  local|nic) ;;
  *) echo "$PROG: --mode must be local or nic" >&2; exit 2 ;;
esac

DEPLOY_DIR=$(cd "$(dirname "$0")" && pwd)
FAILS=0
WARNS=0

pass() { [ "$QUIET" -eq 1 ] || printf 'PASS  %s\n' "$1"; }
warn() {
  WARNS=$((WARNS + 1))
  printf 'WARN  %s\n' "$1"
  [ $# -lt 2 ] || printf '      fix: %s\n' "$2"
}
fail() {
  FAILS=$((FAILS + 1))
  printf 'FAIL  %s\n' "$1"
  [ $# -lt 2 ] || printf '      fix: %s\n' "$2"
}
# FAIL in nic mode, WARN in local mode.
nic_req() {
  if [ "$MODE" = nic ]; then fail "$@"; else warn "$@"; fi
}
info() { [ "$QUIET" -eq 1 ] || printf '      %s\n' "$1"; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo "

# --- DPDK ------------------------------------------------------------------
if command -v dpdk-testpmd >/dev/null 2>&1; then
  pass "dpdk-testpmd: $(command -v dpdk-testpmd)"
else
  fail "dpdk-testpmd not found (DPDK runtime not installed)" \
       "${SUDO}apt-get install -y dpdk"
fi
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libdpdk; then
  pass "libdpdk $(pkg-config --modversion libdpdk) (pkg-config)"
else
  fail "pkg-config cannot find libdpdk (needed to build the apps)" \
       "${SUDO}apt-get install -y dpdk-dev libdpdk-dev pkg-config"
fi
if [ -x "$BUILD/apps/dblp-server" ] && [ -x "$BUILD/apps/dblp-worker" ]; then
  pass "apps built: $BUILD/apps/dblp-server, $BUILD/apps/dblp-worker"
elif command -v dblp-server >/dev/null 2>&1; then
  pass "apps installed: $(command -v dblp-server)"
else
  warn "dblp-server / dblp-worker not built in $BUILD" \
       "meson setup $BUILD && ninja -C $BUILD"
fi

# --- hugepages -----------------------------------------------------------
NR=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
pages=0
[ -r "$NR" ] && pages=$(cat "$NR")
free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
if [ "$pages" -gt 0 ]; then
  if awk '$3 == "hugetlbfs" { f = 1 } END { exit !f }' /proc/mounts; then
    pass "hugepages: $pages x 2 MiB reserved, ${free:-?} free, hugetlbfs mounted"
  else
    nic_req "hugepages reserved but no hugetlbfs mount" \
            "${SUDO}mount -t hugetlbfs -o pagesize=2M nodev /dev/hugepages"
  fi
else
  nic_req "no 2 MiB hugepages reserved (local runs: use --no-huge -m 512, as tools/dblp-cluster does)" \
          "${SUDO}$DEPLOY_DIR/hugepages.sh --pages 512"
fi

# --- IOMMU / vfio / uio ----------------------------------------------------
iommu_groups=0
if [ -d /sys/kernel/iommu_groups ]; then
  iommu_groups=$(find /sys/kernel/iommu_groups -mindepth 1 -maxdepth 1 | wc -l)
fi
noiommu=N
if [ -r /sys/module/vfio/parameters/enable_unsafe_noiommu_mode ]; then
  noiommu=$(cat /sys/module/vfio/parameters/enable_unsafe_noiommu_mode)
fi
has_mod() { [ -d "/sys/module/$1" ]; }
if has_mod vfio_pci; then
  if [ "$iommu_groups" -gt 0 ]; then
    pass "vfio-pci loaded, IOMMU on ($iommu_groups groups)"
  elif [ "$noiommu" = Y ]; then
    warn "vfio-pci in unsafe no-IOMMU mode (works, no DMA isolation)" \
         "enable the IOMMU: add 'intel_iommu=on iommu=pt' (or amd_iommu=on) to the kernel command line"
  else
    nic_req "vfio-pci loaded but no IOMMU groups: binding will fail" \
            "add 'intel_iommu=on iommu=pt' to the kernel command line and reboot, or: echo 1 | ${SUDO}tee /sys/module/vfio/parameters/enable_unsafe_noiommu_mode"
  fi
elif has_mod uio_pci_generic || has_mod igb_uio; then
  pass "uio driver loaded ($(has_mod igb_uio && echo igb_uio || echo uio_pci_generic))"
else
  if [ "$iommu_groups" -gt 0 ]; then
    nic_req "no vfio-pci / uio module loaded (IOMMU is on)" "${SUDO}modprobe vfio-pci"
  else
    nic_req "no vfio-pci / uio module loaded and no IOMMU" \
            "${SUDO}modprobe vfio-pci && echo 1 | ${SUDO}tee /sys/module/vfio/parameters/enable_unsafe_noiommu_mode   (or: ${SUDO}modprobe uio_pci_generic)"
  fi
fi

# --- NIC binding -------------------------------------------------------------
DEVBIND=$(command -v dpdk-devbind.py || command -v dpdk-devbind || true)
if [ -z "$DEVBIND" ]; then
  nic_req "dpdk-devbind.py not found" "${SUDO}apt-get install -y dpdk"
else
  status=$("$DEVBIND" --status-dev net 2>/dev/null || true)
  dpdk_bound=$(printf '%s\n' "$status" |
    awk '/^Network devices using DPDK-compatible driver/ { s = 1; next }
         /^Network devices using/ { s = 0 } /^Other/ { s = 0 }
         s && /^[0-9a-f]{4}:/ { n++ } END { print n + 0 }')
  if [ "$dpdk_bound" -gt 0 ]; then
    pass "$dpdk_bound NIC port(s) bound to a DPDK driver"
  else
    nic_req "no NIC port bound to a DPDK driver (fine for memif / af_packet)" \
            "${SUDO}$DEPLOY_DIR/bind-nic.sh <PCI address>   (list: $DEVBIND --status-dev net)"
  fi
  if [ "$QUIET" -eq 0 ]; then
    printf "%s\n" "$status" | sed "/^\s*$/d" | sed -n "1,20p" | sed "s/^/      | /"
  fi
fi

# --- sockets and runtime dirs --------------------------------------------
if [ -d "$SOCK_DIR" ] && probe=$(mktemp -p "$SOCK_DIR" dblp-preflight.XXXXXX 2>/dev/null); then
  rm -f "$probe"
  pass "memif socket dir $SOCK_DIR writable"
else
  fail "memif socket dir $SOCK_DIR not writable" \
       "mkdir -p $SOCK_DIR && chmod 1777 $SOCK_DIR   (or --sock-dir / TMPDIR elsewhere)"
fi
if [ "$(id -u)" -eq 0 ]; then
  rt=/var/run/dpdk
  parent=/var/run
else
  rt=${XDG_RUNTIME_DIR:-/tmp}/dpdk
  parent=${XDG_RUNTIME_DIR:-/tmp}
fi
if { [ -d "$rt" ] && [ -w "$rt" ]; } || { [ ! -e "$rt" ] && [ -w "$parent" ]; }; then
  pass "DPDK runtime dir $rt writable"
  if [ -d "$rt" ]; then
    stale=$(find "$rt" -mindepth 1 -maxdepth 1 -name 'dblp-*' | wc -l)
    [ "$stale" -eq 0 ] || info "$stale leftover dblp-* prefix dir(s) in $rt (harmless; remove when no app runs)"
  fi
else
  fail "DPDK runtime dir $rt not writable" "run as root, or set XDG_RUNTIME_DIR to a writable dir"
fi

# --- cores -------------------------------------------------------------------
cores=$(nproc)
if [ "$cores" -ge 4 ]; then
  pass "$cores cores"
elif [ "$cores" -ge 2 ]; then
  warn "only $cores cores: server and workers share them (the idle back-off keeps this working; latencies include scheduling)"
else
  warn "1 core: every app on lcore 0 (-l 0); expect slow rounds" \
       "use a machine with >= 2 cores for meaningful latencies"
fi
if [ "$MODE" = nic ] && [ "$cores" -lt 2 ]; then
  fail "NIC mode needs >= 2 cores (datapath lcore + control thread)"
fi

# --- python for the launcher -------------------------------------------------
if command -v python3 >/dev/null 2>&1; then
  pass "python3 for tools/dblp-cluster"
else
  warn "python3 missing (tools/dblp-cluster needs it)" "${SUDO}apt-get install -y python3"
fi

echo "preflight ($MODE): $FAILS failure(s), $WARNS warning(s)"
[ "$FAILS" -eq 0 ]
