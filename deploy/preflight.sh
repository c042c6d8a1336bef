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
PORT=""
LCORES=""
NO_HUGE=0

usage() {
  cat <<EOF
Usage: $PROG [--mode local|nic] [--port PCI|IFACE] [--lcores LIST]
          [--build DIR] [--sock-dir DIR] [--quiet] [--eal EAL_ARGS...]

Checks, each PASS / WARN / FAIL with the exact fix:
  * DPDK installed (dpdk-testpmd, pkg-config libdpdk) and the apps built
  * hugepages reserved (or advice to run with --no-huge): 2 MiB and 1 GiB
    pages per NUMA node, hugetlbfs mounts per page size, 1 GiB support
  * NUMA placement: the port, the lcores and free hugepages on one node
  * IOMMU + vfio-pci, or uio, loaded for NIC binding
  * NIC driver binding (dpdk-devbind.py --status-dev net)
  * memif socket dir and DPDK runtime dir writable
  * cores available (lcores for a server + workers)

  --mode local  (default) the memif local cluster (tools/dblp-cluster):
                no hugepages, no NIC needed; those checks only warn
  --mode nic    a NIC-bound run: hugepages, vfio/uio and a DPDK-bound
                port are hard requirements
  --port P      the NIC port the app will use: PCI address (0000:3b:00.0)
                or interface name; checks it exists, its driver and NUMA node
  --lcores L    the app's lcores, as for -l (2 or 2-3,6); checks they exist
                and sit on the port's node
  --eal ARGS... the rest of the line is the app's EAL options (e.g.
                \$EAL_ARGS of a unit): -l/--lcores and -a give --lcores and
                --port; --no-huge skips the hugepage checks
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
    --port) PORT=${2:?--port needs a PCI address or interface}; shift 2 ;;
    --port=*) PORT=${1#*=}; shift ;;
    --lcores) LCORES=${2:?--lcores needs a list like 2-3}; shift 2 ;;
    --lcores=*) LCORES=${1#*=}; shift ;;
    --eal)
      shift
      # EAL options as the app gets them: only what the checks need.
      while [ $# -gt 0 ]; do
        case "$1" in
          -l|--lcores|-a|--allow|--pci-whitelist)
            opt=$1; val=${2:-}; shift; [ $# -eq 0 ] || shift ;;
          -l*) opt=-l; val=${1#-l}; shift ;;
          -a*) opt=-a; val=${1#-a}; shift ;;
          --lcores=*|--allow=*) opt=${1%%=*}; val=${1#*=}; shift ;;
          --no-huge) NO_HUGE=1; shift; continue ;;
          --) shift; break ;;
          *) shift; continue ;;
        esac
        case "$opt" in
          -l|--lcores) LCORES=$val ;;
          *) [ -n "$PORT" ] || PORT=${val%%,*} ;;  # the first -a; drop devargs
        esac
      done
      # App options after "--" are not ours.
      set -- ;;
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
# Both page sizes, per NUMA node. 1 GiB pages need the CPU flag pdpe1gb and
# a hugetlbfs mount with pagesize=1G; EAL uses every size that is mounted.
hp_sys=/sys/kernel/mm/hugepages
huge_mounted() {  # $1 = 2M or 1G: a hugetlbfs mount of that page size?
  awk -v want="$1" '$3 == "hugetlbfs" {
      ps = "2M"                                 # the default page size here
      n = split($4, o, ",")
      for (i = 1; i <= n; i++)
        if (o[i] ~ /^pagesize=/) { ps = substr(o[i], 10) }
      if (ps == "1024M") ps = "1G"
      if (ps == want) f = 1 }
    END { exit !f }' /proc/mounts
}
sz_pages() { cat "$hp_sys/hugepages-$1/nr_hugepages" 2>/dev/null || echo 0; }
sz_free() { cat "$hp_sys/hugepages-$1/free_hugepages" 2>/dev/null || echo 0; }
node_pages() {  # $1 node dir, $2 size dir name, $3 nr|free
  cat "$1/hugepages/hugepages-$2/$3_hugepages" 2>/dev/null || echo 0
}
pages2=$(sz_pages 2048kB); free2=$(sz_free 2048kB)
pages1g=$(sz_pages 1048576kB); free1g=$(sz_free 1048576kB)
gb_cpu=no
grep -qw pdpe1gb /proc/cpuinfo 2>/dev/null && gb_cpu=yes
if [ -d "$hp_sys/hugepages-1048576kB" ]; then
  gb_kernel=yes
else
  gb_kernel=no
fi
NODES=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null || true)
if [ "$NO_HUGE" -eq 1 ]; then
  pass "hugepages: not needed (--no-huge)"
elif [ "$pages2" -gt 0 ] || [ "$pages1g" -gt 0 ]; then
  ok=1
  if [ "$pages2" -gt 0 ] && ! huge_mounted 2M; then
    ok=0
    nic_req "$pages2 x 2 MiB hugepages reserved but no hugetlbfs mount for 2 MiB pages" \
            "${SUDO}mkdir -p /dev/hugepages && ${SUDO}mount -t hugetlbfs -o pagesize=2M nodev /dev/hugepages"
  fi
  if [ "$pages1g" -gt 0 ] && ! huge_mounted 1G; then
    ok=0
    nic_req "$pages1g x 1 GiB hugepages reserved but no hugetlbfs mount for 1 GiB pages" \
            "${SUDO}mkdir -p /dev/hugepages1G && ${SUDO}mount -t hugetlbfs -o pagesize=1G nodev /dev/hugepages1G"
  fi
  if [ $((free2 + free1g)) -eq 0 ]; then
    ok=0
    nic_req "hugepages reserved ($pages2 x 2 MiB, $pages1g x 1 GiB) but none free: another DPDK process holds them, or a killed one left its files" \
            "stop the other DPDK apps; list leftovers: ls /dev/hugepages (files <prefix>map_<n> of no running process can be removed)"
  fi
  [ "$ok" -eq 0 ] || pass "hugepages: 2 MiB $pages2 reserved ($free2 free), 1 GiB $pages1g reserved ($free1g free), hugetlbfs mounted"
else
  nic_req "no hugepages reserved, neither 2 MiB nor 1 GiB (local runs: use --no-huge -m 512, as tools/dblp-cluster does)" \
          "${SUDO}$DEPLOY_DIR/hugepages.sh --pages 512 [--node N]   (1 GiB pages: kernel command line default_hugepagesz=1G hugepagesz=1G hugepages=N)"
fi

# Per node: "node0: 2 MiB pages 512 (510 free), 1 GiB pages 0 (0 free)".
for n in $NODES; do
  info "$(basename "$n"): 2 MiB pages $(node_pages "$n" 2048kB nr) ($(node_pages "$n" 2048kB free) free), 1 GiB pages $(node_pages "$n" 1048576kB nr) ($(node_pages "$n" 1048576kB free) free)"
done
if [ "$gb_cpu" = yes ] && [ "$gb_kernel" = yes ]; then
  info "1 GiB pages: supported (CPU pdpe1gb, kernel); reserve on node N: echo 4 > /sys/devices/system/node/nodeN/hugepages/hugepages-1048576kB/nr_hugepages (or at boot: default_hugepagesz=1G hugepagesz=1G hugepages=4) and mount -t hugetlbfs -o pagesize=1G nodev /dev/hugepages1G"
else
  info "1 GiB pages: not available here (CPU pdpe1gb: $gb_cpu, kernel: $gb_kernel): use 2 MiB pages"
fi
# Map files in the mounts: a running app's, or a killed one's leftovers
# (the apps remove theirs on every exit they see; not after kill -9).
for m in $(awk '$3 == "hugetlbfs" { print $2 }' /proc/mounts); do
  nfiles=$(find "$m" -maxdepth 1 -name '*map_*' 2>/dev/null | wc -l)
  [ "$nfiles" -eq 0 ] || info "$m: $nfiles hugepage file(s), prefixes: $(find "$m" -maxdepth 1 -name '*map_*' -printf '%f\n' | sed 's/map_[0-9]*$//' | sort -u | head -5 | tr '\n' ' ')(a prefix of no running app is a leftover: rm $m/<prefix>map_*)"
done

# --- NUMA placement: port, lcores, hugepages on one node --------------------
# The node of a CPU: the nodeN entry in its sysfs dir (0 without NUMA).
cpu_node() {
  local d
  for d in /sys/devices/system/cpu/cpu"$1"/node[0-9]*; do
    [ -e "$d" ] && { basename "$d" | sed 's/^node//'; return; }
  done
  echo 0
}
# Expands an EAL lcore list (2 | 0-3,6 | --lcores forms such as 1@3 or
# (0-1)@2, where the CPUs are after the @) into CPU numbers.
expand_cpus() {
  local spec=$1 item a b el cpus=""
  # --lcores: split on the commas outside parentheses, then keep what
  # follows each element's "@" (its CPUs), else the lcore itself.
  while IFS= read -r el; do
    case "$el" in *@*) el=${el#*@} ;; esac
    cpus="$cpus,${el//[()]/}"
  done < <(printf '%s\n' "$spec" | awk '{ d = 0; o = "";
    for (i = 1; i <= length($0); i++) { c = substr($0, i, 1);
      if (c == "(") d++; if (c == ")") d--;
      if (c == "," && d == 0) c = "\n"; o = o c } print o }')
  for item in $(printf '%s' "$cpus" | tr ',' ' '); do
    case "$item" in
      *-*) a=${item%-*}; b=${item#*-} ;;
      *) a=$item; b=$item ;;
    esac
    case "$a$b" in ''|*[!0-9]*) echo "BAD:$item"; continue ;; esac
    seq "$a" "$b"
  done
}
PORT_NODE=""
if [ -n "$PORT" ]; then
  pci=$PORT
  if [ -e "/sys/class/net/$PORT" ]; then
    # An interface name: the PCI device above it (virtio nets sit one below).
    pci=""
    d=$(readlink -f "/sys/class/net/$PORT/device" 2>/dev/null || true)
    while [ -n "$d" ] && [ "$d" != / ]; do
      case "$(basename "$d")" in
        [0-9a-f][0-9a-f][0-9a-f][0-9a-f]:*) pci=$(basename "$d"); break ;;
      esac
      d=$(dirname "$d")
    done
    [ -n "$pci" ] || fail "interface $PORT is not a PCI device (virtual: use --vdev, not -a)"
  fi
  case "$pci" in
    [0-9a-f][0-9a-f]:*) pci=0000:$pci ;;  # -a 3b:00.0 means domain 0000
  esac
  if [ -z "$pci" ]; then
    :
  elif [ ! -e "/sys/bus/pci/devices/$pci" ]; then
    fail "port $PORT: no PCI device $pci on this host (a VM or host without that NIC?)" \
         "list the NICs: ${DEVBIND_HINT:-dpdk-devbind.py} --status-dev net, and give -a / --port one of them"
  else
    PORT_NODE=$(cat "/sys/bus/pci/devices/$pci/numa_node" 2>/dev/null || echo -1)
    [ "$PORT_NODE" -ge 0 ] 2>/dev/null || PORT_NODE=0  # -1: no NUMA info
    drv=$(basename "$(readlink -f "/sys/bus/pci/devices/$pci/driver" 2>/dev/null)" 2>/dev/null || true)
    [ -e "/sys/bus/pci/devices/$pci/driver" ] || drv=none
    ifs=$(ls "/sys/bus/pci/devices/$pci/net" 2>/dev/null | tr '\n' ' ' || true)
    if [ -z "$ifs" ]; then
      ifs=$(ls -d /sys/bus/pci/devices/"$pci"/virtio*/net/* 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ' || true)
    fi
    case "$drv" in
      vfio-pci|uio_pci_generic|igb_uio)
        pass "port $pci bound to $drv, NUMA node $PORT_NODE" ;;
      mlx4_core|mlx5_core)
        pass "port $pci on $drv (bifurcated: stays on the kernel driver), NUMA node $PORT_NODE" ;;
      none)
        nic_req "port $pci has no driver bound" \
                "${SUDO}$DEPLOY_DIR/bind-nic.sh $pci" ;;
      *)
        nic_req "port $pci is on the kernel driver $drv${ifs:+ (interface ${ifs% }, in use by the kernel)}, not a DPDK driver: the app will not find it (\"no Ethernet port\")" \
                "${SUDO}$DEPLOY_DIR/bind-nic.sh $pci   (it refuses an interface that is up with addresses or routes: use a spare port, never the one you are logged in through)" ;;
    esac
  fi
fi
if [ -n "$LCORES" ]; then
  bad=""; nodes_used=""
  for c in $(expand_cpus "$LCORES"); do
    case "$c" in
      BAD:*) fail "--lcores/-l '$LCORES': cannot read '${c#BAD:}'" "use a list like 2 or 2-3,6"; continue ;;
    esac
    if [ ! -d "/sys/devices/system/cpu/cpu$c" ]; then
      bad="$bad $c"
      continue
    fi
    n=$(cpu_node "$c")
    nodes_used="$nodes_used $n"
    if [ -n "$PORT_NODE" ] && [ "$n" != "$PORT_NODE" ]; then
      nic_req "lcore $c is on NUMA node $n, the port on node $PORT_NODE: every frame would cross the socket interconnect" \
              "use lcores of node $PORT_NODE: $(cat /sys/devices/system/node/node$PORT_NODE/cpulist 2>/dev/null)"
    fi
  done
  if [ -n "$bad" ]; then
    fail "lcore(s)${bad}: no such CPU (this host has CPUs $(cat /sys/devices/system/cpu/online))" \
         "pick -l from $(cat /sys/devices/system/cpu/online)"
  fi
  nodes_used=$(printf '%s\n' $nodes_used | sort -u | tr '\n' ' ')
  if [ -z "$PORT_NODE" ] && [ "$(printf '%s\n' $nodes_used | grep -c .)" -gt 1 ]; then
    warn "lcores $LCORES span NUMA nodes ${nodes_used% }" \
         "keep an app's lcores on one node (the one of its port)"
  fi
  [ -n "$bad" ] || [ -z "$nodes_used" ] ||
    pass "lcores $LCORES on NUMA node(s) ${nodes_used% }"
fi
# Free hugepages where the port (else the lcores) sit: EAL allocates from
# the node of the lcore that asks, the driver from the port's node.
want_node=$PORT_NODE
if [ -z "$want_node" ] && [ -n "${nodes_used:-}" ]; then
  want_node=$(printf '%s' "$nodes_used" | awk '{ print $1 }')
fi
if [ -n "$want_node" ] && [ "$NO_HUGE" -eq 0 ]; then
  nd=/sys/devices/system/node/node$want_node
  f2=$(node_pages "$nd" 2048kB free); f1=$(node_pages "$nd" 1048576kB free)
  if [ $((f2 + f1)) -gt 0 ]; then
    pass "free hugepages on node $want_node: $f2 x 2 MiB, $f1 x 1 GiB"
  else
    other=""
    for n in $NODES; do
      [ "$n" = "$nd" ] && continue
      [ $(( $(node_pages "$n" 2048kB free) + $(node_pages "$n" 1048576kB free) )) -eq 0 ] || other="$other $(basename "$n")"
    done
    nic_req "no free hugepages on NUMA node $want_node (the port's/lcores' node)${other:+; there are some on${other}: the wrong node}" \
            "${SUDO}$DEPLOY_DIR/hugepages.sh --pages 512 --node $want_node"
  fi
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
  # Kernel-driver ports: "*Active*" ones carry this host's own traffic.
  kernel_ports=$(printf '%s\n' "$status" | grep -cE '^[0-9a-f]{4}:.* drv=' || true)
  active_ports=$(printf '%s\n' "$status" | grep -E '^[0-9a-f]{4}:.*\*Active\*' | awk '{ print $1 }' | tr '\n' ' ')
  spare=$((kernel_ports - $(printf '%s' "$active_ports" | wc -w)))
  if [ "$dpdk_bound" -gt 0 ]; then
    pass "$dpdk_bound NIC port(s) bound to a DPDK driver"
  elif [ "$kernel_ports" -eq 0 ] || [ "$spare" -le 0 ]; then
    nic_req "no NIC for DPDK on this host: no port is bound to a DPDK driver${active_ports:+ and the only one(s) (${active_ports% }) are in use by this host (*Active*)} (fine for memif / af_packet: --mode local)" \
            "NIC runs need a spare port (a VM: add a second NIC, e.g. an SR-IOV VF or a virtio NIC), then: ${SUDO}$DEPLOY_DIR/bind-nic.sh <PCI address>"
  else
    nic_req "no NIC port bound to a DPDK driver ($spare spare kernel port(s); fine for memif / af_packet)" \
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
