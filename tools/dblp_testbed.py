"""A shaped, lossy switch of network namespaces that gloo and DBLP share.

The switch namespace <prefix>-sw bridges one veth port per host namespace
<prefix>-h<i>. Every port is an output-queued switch port: its egress in the
switch (towards the host) is a token bucket at the link rate with a finite
queue, so an incast that overflows the queue drops frames as a real switch
does; the host's own egress (its NIC) is shaped at the same rate. A loss
stage on the wire (nftables in the switch's bridge forward hook, before the
output queue) drops frames independently of every transport:

  bernoulli   each frame leaving any port with probability p
  gray        one port's frames, both directions, with probability p
  burst       every port's frames with probability p for a while
              (microbursts at the switch, switched on and off at run time:
              on the server's port alone gloo's ring, which never crosses
              it in the paper topology, would meet none)

Segmentation offloads are off on every veth, so kernel TCP (gloo) sends
MTU-sized frames like DPDK's net_af_packet does; the switch counts every
frame longer than the MTU (the count must stay 0 for a drop rate to mean
something) and reports per port what it forwarded, queued over, dropped
in its queue and dropped on the wire.

Topologies (W workers; h0 is the server's host, h1..hW the workers', and
h<W+1> a background-traffic host on the server's side of the switch):

  paper       the DBLP paper's: the server's port 10x a worker's
  symmetric   every port at the same rate

Used by tools/dblp-testbed (the command) and tools/dblp-eval. Needs root,
ip(8), tc(8), nft(8) and ethtool(8) (Debian: iproute2 nftables ethtool).
"""

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

TABLE = "dblp_testbed"
# nftables' numgen draws from [0, SCALE): drop probabilities to 1e-6.
SCALE = 1000000
TOPOLOGIES = ("paper", "symmetric")
TOOLS = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables",
         "ethtool": "ethtool"}


# The background sender: on/off UDP to the discard port of each destination,
# paced in 1 ms slices at the on-rate.
BACKGROUND_SENDER = r"""
import random, socket, sys, time
dsts, mbit, seed = sys.argv[1].split(","), float(sys.argv[2]), sys.argv[3]
on_lo, on_hi, off_lo, off_hi, size = map(float, sys.argv[4:9])
rng = random.Random(seed)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
data = b"x" * int(size)
per_ms = max(1, int(mbit * 1e6 / 8 / size / 1000))
while True:
    end = time.monotonic() + rng.uniform(on_lo, on_hi) / 1000
    while time.monotonic() < end:
        t = time.monotonic()
        for _ in range(per_ms):
            for d in dsts:
                try:
                    s.sendto(data, (d, 9))
                except OSError:
                    pass
        rest = 0.001 - (time.monotonic() - t)
        if rest > 0:
            time.sleep(rest)
    time.sleep(rng.uniform(off_lo, off_hi) / 1000)
"""


class TestbedError(Exception):
    """A testbed that cannot be built or driven, with the fix in the text."""


def _run(cmd, check=True, input_text=None):
    r = subprocess.run(cmd, input=input_text, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)}: exit {r.returncode}: "
                           f"{r.stdout.strip()[-400:]}")
    return r.stdout


def missing_tools():
    """Debian packages to install for the testbed's tools, or []."""
    return sorted({pkg for tool, pkg in TOOLS.items()
                   if shutil.which(tool) is None})


class Testbed:
    """One testbed, by its namespace prefix. Construct, then up() (or
    attach to one that is up with the same arguments), and down()."""

    def __init__(self, prefix="dblptb", workers=2, topology="paper",
                 rate_mbit=100.0, server_ratio=10.0, queue_kb=64,
                 mtu=1500, subnet="10.0.1"):
        if topology not in TOPOLOGIES:
            raise TestbedError(f"topology {topology!r}: choose one of "
                               f"{', '.join(TOPOLOGIES)}")
        if not 1 <= workers <= 32:
            raise TestbedError(f"workers={workers}: 1 to 32")
        if not rate_mbit > 0:
            raise TestbedError(f"rate_mbit={rate_mbit}: give a rate > 0")
        if queue_kb * 1024 < 2 * (mtu + 14):
            raise TestbedError(f"queue_kb={queue_kb}: a queue must hold "
                               "two frames at least")
        self.prefix, self.workers, self.topology = prefix, workers, topology
        self.rate_mbit, self.server_ratio = float(rate_mbit), server_ratio
        self.queue_kb, self.mtu, self.subnet = queue_kb, mtu, subnet
        self.hosts = workers + 2  # server, workers, background
        self._burst_lock = threading.Lock()

    # ---- names ---------------------------------------------------------
    @property
    def switch(self):
        return f"{self.prefix}-sw"

    def ns(self, host):
        return f"{self.prefix}-h{host}"

    def ip(self, host):
        return f"{self.subnet}.{host + 1}"

    def server_host(self):
        return 0

    def worker_host(self, rank):
        return 1 + rank

    def background_host(self):
        return self.workers + 1

    def port(self, host):
        return f"p{host}"

    def port_rate_mbit(self, host):
        if self.topology == "paper" and host == self.server_host():
            return self.rate_mbit * self.server_ratio
        if host == self.background_host():
            # Other tenants' aggregate: it can overload a worker's port.
            return self.rate_mbit * self.server_ratio
        return self.rate_mbit

    def describe(self):
        return {"prefix": self.prefix, "topology": self.topology,
                "workers": self.workers, "mtu": self.mtu,
                "queue_kb": self.queue_kb,
                "port_rate_mbit": {self.port(h): self.port_rate_mbit(h)
                                   for h in range(self.hosts)},
                "hosts": {self.ns(h): self.ip(h) for h in range(self.hosts)}}

    # ---- up / down -----------------------------------------------------
    def namespaces(self):
        out = _run(["ip", "netns", "list"], check=False)
        names = [line.split()[0] for line in out.splitlines() if line]
        return sorted(n for n in names if n == self.switch or (
            n.startswith(self.prefix + "-h") and
            n[len(self.prefix) + 2:].isdigit()))

    def is_up(self):
        return self.switch in self.namespaces()

    def up(self):
        if os.geteuid() != 0:
            raise TestbedError("the testbed needs root (ip netns, tc, nft): "
                               "run it with sudo")
        lacking = missing_tools()
        if lacking:
            raise TestbedError("missing tools: apt-get install -y " +
                               " ".join(lacking))
        if self.is_up():
            raise TestbedError(f"a testbed {self.prefix} is up already: "
                               f"tools/dblp-testbed down --prefix "
                               f"{self.prefix} first")
        try:
            self._build()
        except BaseException:
            self.down()
            raise

    def _build(self):
        sw = self.switch
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "mtu", str(self.mtu),
              "up"])
        for h in range(self.hosts):
            ns, port = self.ns(h), self.port(h)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "add", "eth0", "mtu", str(self.mtu),
                  "type", "veth", "peer", "name", port, "mtu", str(self.mtu),
                  "netns", sw])
            _run(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.ip(h)}/24", "dev",
                  "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            # One frame per MTU on the wire: no GSO/TSO super-frames, no GRO
            # merging behind the counters; full checksums from the kernel.
            for where, dev in ((ns, "eth0"), (sw, port)):
                _run(["ip", "netns", "exec", where, "ethtool", "-K", dev,
                      "tso", "off", "gso", "off", "gro", "off", "tx", "off"],
                     check=False)
            rate = self.port_rate_mbit(h)
            self._shape(sw, port, rate, self.queue_kb * 1024)
            # The host's NIC sends at the link rate too; its queue is a
            # NIC's (1000 frames, Linux's txqueuelen), so a sender meets
            # the switch's queue, not its own, as on a real host.
            self._shape(ns, "eth0", rate, 1000 * (self.mtu + 14))
        self._nft_base()

    def _shape(self, ns, dev, rate_mbit, limit_bytes):
        """A token bucket at the link rate whose queue holds queue_kb: what
        does not fit is dropped (tail drop), as at a switch's output port."""
        # The bucket holds a few frames (at least one per kernel tick at the
        # rate) so the rate holds without bursts far above it.
        burst = max(4 * (self.mtu + 14), int(rate_mbit * 1e6 / 8 / 250))
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev,
              "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst),
              "limit", str(limit_bytes)])

    def _nft_base(self):
        ports = [self.port(h) for h in range(self.hosts)]
        # One command per line ("fwd" is an nft keyword: the chain is
        # "ports").
        t = f"bridge {TABLE}"
        lines = [f"add table {t}",
                 f"add chain {t} ports {{ type filter hook forward priority "
                 "0; policy accept; }"]
        for p in ports:
            for c in ("out", "oversize", "wire_drop"):
                lines.append(f"add counter {t} {c}_{p}")
            lines.append(f"add chain {t} loss_{p}")
        for p in ports:
            lines.append(f'add rule {t} ports oifname "{p}" counter name '
                         f'"out_{p}"')
            # meta length is the frame past its Ethernet header here: a
            # frame longer than the MTU is a GSO super-frame.
            lines.append(f'add rule {t} ports oifname "{p}" meta length > '
                         f'{self.mtu} counter name "oversize_{p}"')
            lines.append(f'add rule {t} ports oifname "{p}" jump loss_{p}')
        _run(["ip", "netns", "exec", self.switch, "nft", "-f", "-"],
             input_text="\n".join(lines) + "\n")

    def down(self):
        for n in self.namespaces():
            _run(["ip", "netns", "delete", n], check=False)

    # ---- the loss stage --------------------------------------------------
    def set_loss(self, port, probability, also_ingress=False):
        """Frames leaving `port` (and with also_ingress those entering the
        switch from it: a gray link loses both ways) are dropped with
        `probability`, counted in wire_drop_<port>."""
        if not 0 <= probability <= 1:
            raise TestbedError(f"loss probability {probability}: 0 to 1")
        threshold = int(round(probability * SCALE))
        cmds = [f"flush chain bridge {TABLE} loss_{port}"]
        if threshold > 0:
            cmds.append(f"add rule bridge {TABLE} loss_{port} numgen random "
                        f"mod {SCALE} < {threshold} counter name "
                        f'"wire_drop_{port}" drop')
        self._nft(cmds)
        if also_ingress:
            # The reverse direction: frames from the port's host, dropped
            # in the chains of every other port they could leave by.
            for h in range(self.hosts):
                other = self.port(h)
                if other == port:
                    continue
                self._nft([f"add rule bridge {TABLE} loss_{other} iifname "
                           f'"{port}" numgen random mod {SCALE} < {threshold}'
                           f' counter name "wire_drop_{port}" drop']
                          if threshold > 0 else [])

    def clear_loss(self):
        self._nft([f"flush chain bridge {TABLE} loss_{self.port(h)}"
                   for h in range(self.hosts)])

    def set_bernoulli(self, probability):
        for h in range(self.hosts):
            self.set_loss(self.port(h), probability)

    def _nft(self, cmds):
        if cmds:
            _run(["ip", "netns", "exec", self.switch, "nft", "-f", "-"],
                 input_text="\n".join(cmds) + "\n")

    def burst(self, ports, probability, seconds):
        """Microburst: `ports` drop with `probability` for `seconds`, then
        their loss chains are emptied again (bursts do not overlap)."""
        with self._burst_lock:
            for port in ports:
                self.set_loss(port, probability)
            time.sleep(seconds)
            self._nft([f"flush chain bridge {TABLE} loss_{port}"
                       for port in ports])

    def all_ports(self):
        return [self.port(h) for h in range(self.hosts)]

    # ---- background traffic ---------------------------------------------
    def background(self, mbit, seed, stop, on_ms=(10, 40), off_ms=(100, 400)):
        """On/off UDP background from the background host into every
        worker's host until `stop` is set, so it shares the workers' ports
        with every transport's traffic: `mbit` per worker for a uniform
        on-time, then silence for a uniform off-time, from a seeded
        generator (one sender process, no start-up per burst). Returns
        [stopper]: call join() on it after setting stop."""
        dsts = ",".join(self.ip(self.worker_host(r))
                        for r in range(self.workers))
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(self.background_host()),
             sys.executable, "-c", BACKGROUND_SENDER, dsts, str(mbit),
             str(seed), str(on_ms[0]), str(on_ms[1]), str(off_ms[0]),
             str(off_ms[1]), str(self.mtu - 28)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def stopper():
            stop.wait()
            proc.terminate()
            proc.wait()

        t = threading.Thread(target=stopper, daemon=True)
        t.start()
        return [t]

    # ---- what it did ----------------------------------------------------
    def counters(self):
        """Per port: frames out, oversize frames, wire drops (nft); sent,
        queue drops and overlimits of the switch's output queue (tc)."""
        out = _run(["ip", "netns", "exec", self.switch, "nft", "-j", "list",
                    "counters", "table", "bridge", TABLE])
        named = {}
        for item in json.loads(out).get("nftables", []):
            c = item.get("counter")
            if c:
                named[c["name"]] = (c["packets"], c["bytes"])
        ports = {}
        for h in range(self.hosts):
            p = self.port(h)
            q = self._qdisc_stats(self.switch, p)
            nic = self._qdisc_stats(self.ns(h), "eth0")
            ports[p] = {
                "frames_out": named.get(f"out_{p}", (0, 0))[0],
                "bytes_out": named.get(f"out_{p}", (0, 0))[1],
                "oversize": named.get(f"oversize_{p}", (0, 0))[0],
                "wire_drops": named.get(f"wire_drop_{p}", (0, 0))[0],
                "queue_sent": q.get("packets", 0),
                "queue_drops": q.get("drops", 0),
                "queue_overlimits": q.get("overlimits", 0),
                "host_queue_drops": nic.get("drops", 0),
                "host_sent": nic.get("packets", 0)}
        return ports

    @staticmethod
    def _qdisc_stats(ns, dev):
        out = _run(["ip", "netns", "exec", ns, "tc", "-j", "-s", "qdisc",
                    "show", "dev", dev], check=False)
        try:
            for q in json.loads(out):
                if q.get("kind") == "tbf":
                    return q
        except ValueError:
            pass
        return {}


def counter_delta(before, after):
    """after - before, per port and field."""
    return {p: {k: v - before.get(p, {}).get(k, 0) for k, v in f.items()}
            for p, f in after.items()}


def summarize_delta(delta):
    """Totals over the ports of one run, the table a report prints."""
    total = {}
    for fields in delta.values():
        for k, v in fields.items():
            total[k] = total.get(k, 0) + v
    frames = total.get("frames_out", 0)
    total["wire_drop_rate"] = (total.get("wire_drops", 0) / frames
                               if frames else 0.0)
    total["mean_frame_bytes"] = (total.get("bytes_out", 0) / frames
                                 if frames else 0.0)
    return total
