#!/usr/bin/env bash
# Bind a NIC port to vfio-pci for DPDK (a checked wrapper around
# dpdk-devbind.py), or give it back to its kernel driver.
set -euo pipefail

PROG=$(basename "$0")
DRIVER=vfio-pci
ACTION=bind
FORCE=0
DRY_RUN=0
DEV=""

usage() {
  cat <<EOF
Usage: $PROG [--driver vfio-pci|uio_pci_generic|igb_uio] [--force] [--dry-run] DEVICE
       $PROG --restore DRIVER DEVICE
       $PROG --status

Binds DEVICE (a PCI address like 0000:3b:00.0, or a kernel interface name
like ens1f0) to a DPDK driver (default vfio-pci), after checking:
  * dpdk-devbind.py is installed and we are root
  * DEVICE exists, and is not the interface that carries a default route
    or an IPv4/IPv6 address (refused unless --force: you would lose that
    network connection)
  * the driver module is loaded (modprobe'd if not) and, for vfio-pci, the
    IOMMU is on or vfio's unsafe no-IOMMU mode is enabled
It prints the driver the port had before and the exact command that gives
it back.

  --driver D        DPDK driver to bind (default vfio-pci)
  --force           bind even if the interface is up with addresses
  --dry-run         print what would run, change nothing
  --restore DRIVER  bind DEVICE back to kernel driver DRIVER (e.g. ice, mlx5_core, ixgbe)
  --status          dpdk-devbind.py --status-dev net
  -h, --help        this text

Only the named device is touched; no traffic is sent.
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --driver) DRIVER=${2:?--driver needs a name}; shift 2 ;;
    --driver=*) DRIVER=${1#*=}; shift ;;
    --restore) ACTION=restore; DRIVER=${2:?--restore needs the kernel driver}; shift 2 ;;
    --restore=*) ACTION=restore; DRIVER=${1#*=}; shift ;;
    --status) ACTION=status; shift ;;
    --force) FORCE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "$PROG: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *)
      [ -z "$DEV" ] || { echo "$PROG: one device at a time" >&2; exit 2; }
      DEV=$1; shift ;;
  esac
done

DEVBIND=$(command -v dpdk-devbind.py || command -v dpdk-devbind || true)
if [ -z "$DEVBIND" ]; then
  echo "$PROG: dpdk-devbind.py not found. Fix: apt-get install -y dpdk" >&2
  exit 1
fi

if [ "$ACTION" = status ]; then
  "$DEVBIND" --status-dev net 2>/dev/null
  exit 0
fi
if [ -z "$DEV" ]; then
  echo "$PROG: which device? (see --help; list: $DEVBIND --status-dev net)" >&2
  exit 2
fi
if [ "$DRY_RUN" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "$PROG: needs root. Fix: sudo $0 $*" >&2
  exit 1
fi

# Resolve an interface name to its PCI address.
PCI=$DEV
IFACE=""
if [ -e "/sys/class/net/$DEV/device" ]; then
  IFACE=$DEV
  devpath=$(readlink -f "/sys/class/net/$DEV/device")
  # virtio-net: .../0000:00:03.0/virtio2 -> the PCI function is the parent.
  case "$(basename "$devpath")" in
    [0-9a-f][0-9a-f][0-9a-f][0-9a-f]:*) ;;
    *) devpath=$(dirname "$devpath") ;;
  esac
  PCI=$(basename "$devpath")
fi
case "$PCI" in
  [0-9a-f][0-9a-f]:[0-9a-f][0-9a-f].[0-7]) PCI=0000:$PCI ;;
esac
SYS=/sys/bus/pci/devices/$PCI
if [ ! -e "$SYS" ]; then
  echo "$PROG: no PCI device $PCI (from '$DEV'). List: $DEVBIND --status-dev net" >&2
  exit 1
fi
current=""
if [ -e "$SYS/driver" ]; then
  current=$(basename "$(readlink -f "$SYS/driver")")
fi
if [ -z "$IFACE" ]; then
  # The kernel interface of this PCI function, if it has one.
  sys_real=$(readlink -f "$SYS")
  for n in /sys/class/net/*; do
    [ -e "$n/device" ] || continue
    case "$(readlink -f "$n/device")" in
      "$sys_real"|"$sys_real"/*) IFACE=$(basename "$n"); break ;;
    esac
  done
fi

run() {
  echo "+ $*"
  if [ "$DRY_RUN" -eq 0 ]; then "$@"; fi
}

if [ "$ACTION" = restore ]; then
  echo "$PROG: $PCI: ${current:-no driver} -> $DRIVER"
  run "$DEVBIND" --bind="$DRIVER" "$PCI"
  exit 0
fi

case "$DRIVER" in
  vfio-pci|uio_pci_generic|igb_uio) ;;
  *) echo "$PROG: --driver $DRIVER is not a DPDK driver (vfio-pci, uio_pci_generic, igb_uio)" >&2
     exit 2 ;;
esac
if [ "$current" = "$DRIVER" ]; then
  echo "$PROG: $PCI is already bound to $DRIVER; nothing to do."
  exit 0
fi

# Refuse to take away an interface that is in use.
if [ -n "$IFACE" ] && [ -e "/sys/class/net/$IFACE" ]; then
  addrs=$(ip -o addr show dev "$IFACE" scope global 2>/dev/null | awk '{ print $4 }' | paste -sd' ' -)
  routes=$(ip -o route show default dev "$IFACE" 2>/dev/null || true)
  if [ -n "$routes" ] || [ -n "$addrs" ]; then
    if [ "$FORCE" -eq 0 ]; then
      echo "$PROG: $IFACE ($PCI) is in use (addresses: ${addrs:-none}," \
           "default route: $([ -n "$routes" ] && echo yes || echo no))." >&2
      echo "  Binding it to $DRIVER removes it from the kernel; on a remote" \
           "host that can cut you off. Use another port, or --force." >&2
      exit 1
    fi
    echo "$PROG: warning: $IFACE is in use; --force given, binding anyway"
  fi
fi

# The driver module and, for vfio, the IOMMU.
mod=${DRIVER//-/_}
if [ ! -d "/sys/module/$mod" ]; then
  if [ "$DRIVER" = igb_uio ]; then
    echo "$PROG: igb_uio is not loaded (it is out of tree: dpdk-kmods)." \
         "Prefer --driver vfio-pci." >&2
    exit 1
  fi
  run modprobe "$DRIVER"
fi
if [ "$DRIVER" = vfio-pci ]; then
  groups=0
  if [ -d /sys/kernel/iommu_groups ]; then
    groups=$(find /sys/kernel/iommu_groups -mindepth 1 -maxdepth 1 | wc -l)
  fi
  noiommu=N
  if [ -r /sys/module/vfio/parameters/enable_unsafe_noiommu_mode ]; then
    noiommu=$(cat /sys/module/vfio/parameters/enable_unsafe_noiommu_mode)
  fi
  if [ "$groups" -eq 0 ] && [ "$noiommu" != Y ]; then
    echo "$PROG: the IOMMU is off, so vfio-pci cannot bind $PCI. Fix, one of:" >&2
    echo "  add 'intel_iommu=on iommu=pt' (AMD: amd_iommu=on) to the kernel command line and reboot" >&2
    echo "  echo 1 > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode   (no DMA isolation)" >&2
    echo "  $0 --driver uio_pci_generic $DEV" >&2
    exit 1
  fi
fi

numa=$(cat "$SYS/numa_node" 2>/dev/null || echo -1)
echo "$PROG: $PCI${IFACE:+ ($IFACE)}: ${current:-no driver} -> $DRIVER (NUMA node $numa)"
if [ -n "$IFACE" ] && [ "$DRY_RUN" -eq 0 ]; then
  ip link set dev "$IFACE" down 2>/dev/null || true
fi
bind_args=(--bind="$DRIVER")
[ "$FORCE" -eq 0 ] || bind_args+=(--force)
run "$DEVBIND" "${bind_args[@]}" "$PCI"
if [ "$DRY_RUN" -eq 0 ]; then
  "$DEVBIND" --status-dev net 2>/dev/null | grep -F "$PCI" || true
fi
cat <<EOF

Use it:   dblp-server -l 1 -a $PCI --file-prefix=srv -- --local_ip=... (see deploy/README.md)
          (hugepages on NUMA node $numa: deploy/hugepages.sh --node ${numa/#-1/0})
Undo:     $0 --restore ${current:-<kernel driver>} $PCI
EOF
