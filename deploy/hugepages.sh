#!/usr/bin/env bash
# Reserve 2 MiB hugepages for DPDK and make sure hugetlbfs is mounted.
# Prints what it changed and the exact command that undoes it.
set -euo pipefail

PROG=$(basename "$0")
PAGES=512
NODE=""
MOUNT=/dev/hugepages
ACTION=reserve
DRY_RUN=0
STATE=/run/dblp-hugepages.state

usage() {
  cat <<EOF
Usage: $PROG [--pages N] [--node NUMA_NODE] [--mount DIR] [--dry-run]
       $PROG --status
       $PROG --undo

Reserves N 2 MiB hugepages (default $PAGES = $((PAGES * 2)) MiB), system-wide
or on one NUMA node, and mounts hugetlbfs on DIR (default $MOUNT) if nothing
is mounted there. Needs root. Not persistent across reboots (the output says
how to make it so).

  --pages N     number of 2 MiB pages to reserve (total, not additional)
  --node NODE   reserve on NUMA node NODE only (multi-socket hosts: the
                NIC's node, see /sys/bus/pci/devices/<PCI>/numa_node)
  --mount DIR   hugetlbfs mount point (default $MOUNT)
  --dry-run     print the commands, change nothing
  --status      show the current reservation and mounts, change nothing
  --undo        restore the page count recorded by the last reservation
                and unmount DIR if this script mounted it
  -h, --help    this text

The local memif cluster (tools/dblp-cluster) does not need hugepages: it
runs every app with --no-huge. Hugepages matter for NIC runs and for
throughput.
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --pages) PAGES=${2:?--pages needs a number}; shift 2 ;;
    --pages=*) PAGES=${1#*=}; shift ;;
    --node) NODE=${2:?--node needs a NUMA node number}; shift 2 ;;
    --node=*) NODE=${1#*=}; shift ;;
    --mount) MOUNT=${2:?--mount needs a directory}; shift 2 ;;
    --mount=*) MOUNT=${1#*=}; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --status) ACTION=status; shift ;;
    --undo) ACTION=undo; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$PROG: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

case "$PAGES" in
  ''|*[!0-9]*) echo "$PROG: --pages must be a non-negative integer" >&2; exit 2 ;;
esac
if [ -n "$NODE" ]; then
  case "$NODE" in
    *[!0-9]*) echo "$PROG: --node must be a NUMA node number" >&2; exit 2 ;;
  esac
  NR_FILE=/sys/devices/system/node/node$NODE/hugepages/hugepages-2048kB/nr_hugepages
else
  NR_FILE=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo "

run() {
  echo "+ $*"
  if [ "$DRY_RUN" -eq 0 ]; then "$@"; fi
}

is_hugetlbfs_mounted() {
  # Field 2 is the mount point, field 3 the type.
  awk -v m="$1" '$2 == m && $3 == "hugetlbfs" { found = 1 } END { exit !found }' \
    /proc/mounts
}

status() {
  echo "2 MiB hugepages ($NR_FILE): $(cat "$NR_FILE" 2>/dev/null || echo unavailable)"
  grep -E '^(HugePages_(Total|Free|Rsvd)|Hugepagesize)' /proc/meminfo || true
  for n in /sys/devices/system/node/node[0-9]*; do
    [ -r "$n/hugepages/hugepages-2048kB/nr_hugepages" ] || continue
    echo "  $(basename "$n"): $(cat "$n/hugepages/hugepages-2048kB/nr_hugepages") pages" \
      "($(cat "$n/hugepages/hugepages-2048kB/free_hugepages") free)"
  done
  echo "hugetlbfs mounts:"
  awk '$3 == "hugetlbfs" { print "  " $2 " (" $4 ")" }' /proc/mounts
  if ! awk '$3 == "hugetlbfs" { f = 1 } END { exit !f }' /proc/mounts; then
    echo "  none"
  fi
}

if [ "$ACTION" = status ]; then
  status
  exit 0
fi

if [ ! -e "$NR_FILE" ]; then
  echo "$PROG: $NR_FILE does not exist: this kernel has no 2 MiB hugepage" \
       "support${NODE:+ on node $NODE}" >&2
  exit 1
fi
if [ "$DRY_RUN" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "$PROG: needs root. Fix: sudo $0 $*" >&2
  exit 1
fi

if [ "$ACTION" = undo ]; then
  if [ ! -r "$STATE" ]; then
    echo "$PROG: nothing to undo ($STATE not found)." \
         "To release every 2 MiB page: echo 0 | sudo tee $NR_FILE" >&2
    exit 1
  fi
  # The state file is ours: KEY=VALUE lines written below.
  prev_pages=$(sed -n 's/^PREV_PAGES=//p' "$STATE")
  nr_file=$(sed -n 's/^NR_FILE=//p' "$STATE")
  mounted=$(sed -n 's/^MOUNTED=//p' "$STATE")
  echo "$PROG: restoring $nr_file to $prev_pages pages"
  if [ "$DRY_RUN" -eq 0 ]; then echo "$prev_pages" > "$nr_file"; fi
  if [ -n "$mounted" ] && is_hugetlbfs_mounted "$mounted"; then
    run umount "$mounted"
  fi
  run rm -f "$STATE"
  status
  exit 0
fi

prev=$(cat "$NR_FILE")
echo "$PROG: $NR_FILE: $prev -> $PAGES pages"
if [ "$DRY_RUN" -eq 0 ]; then
  echo "$PAGES" > "$NR_FILE"
  got=$(cat "$NR_FILE")
  if [ "$got" -lt "$PAGES" ]; then
    echo "$PROG: warning: the kernel reserved only $got of $PAGES pages" \
         "(memory fragmented or too small). Try right after boot, fewer" \
         "pages, or the kernel command line: hugepages=$PAGES" >&2
  fi
else
  echo "+ echo $PAGES > $NR_FILE"
fi

mounted_by_us=""
if is_hugetlbfs_mounted "$MOUNT"; then
  echo "$PROG: hugetlbfs already mounted on $MOUNT"
else
  run mkdir -p "$MOUNT"
  run mount -t hugetlbfs -o pagesize=2M nodev "$MOUNT"
  mounted_by_us=$MOUNT
fi

if [ "$DRY_RUN" -eq 0 ]; then
  # Keep the first reservation's "before" so repeated runs undo to it.
  if [ -r "$STATE" ]; then
    prev=$(sed -n 's/^PREV_PAGES=//p' "$STATE")
    old_mount=$(sed -n 's/^MOUNTED=//p' "$STATE")
    mounted_by_us=${mounted_by_us:-$old_mount}
  fi
  printf 'PREV_PAGES=%s\nNR_FILE=%s\nMOUNTED=%s\n' "$prev" "$NR_FILE" \
    "$mounted_by_us" > "$STATE"
fi

status
cat <<EOF

Undo:        $SUDO$0 --undo      (back to $prev pages${mounted_by_us:+, unmount $mounted_by_us})
Persistent:  echo 'vm.nr_hugepages = $PAGES' | ${SUDO}tee /etc/sysctl.d/80-dblp-hugepages.conf
             (or the kernel command line: default_hugepagesz=2M hugepages=$PAGES)
DPDK apps then run without --no-huge, e.g. -l 0 -m 512 --file-prefix=srv ...
EOF
