#!/usr/bin/env python3
"""A 2-lcore dblp-server on a real (virtual) port: NIC queue steering
(issue #22, src/dpdk/port/steering.h).

The netns testbed (deploy/netns-testbed.sh, 3 hosts): the server in h0 on
net_tap (its kernel side dtap0 bridged with h0's eth0), two workers in h1,
h2 on net_af_packet with 2 qpairs. Workers send lcore-shard k's chunks to
UDP port 47000 + k; the server asks the tap for one rte_flow rule per lcore
(--steering=auto) and falls back to RSS where the kernel refuses them (the
tap then spreads flows over its queues by hash, and a frame on the wrong
lcore's queue is handed to its owner).

Checks:
- --steering=bogus and --flow_isolate with --steering=rss are refused
  before the EAL starts, naming the values to use;
- --steering=flow either installs its rules or exits naming --steering=rss,
  and --flow_isolate either runs the job under them or exits naming the
  fix;
- the 2-lcore job completes; its startup log says how it steers;
- every frame reached the lcore that owns its range: no receiver counted
  push_misrouted; under flow rules no lcore had to hand a frame over
  (frames_misrouted=0); under RSS the hand-overs are counted per lcore;
- the dumped means are bit-identical to a 1-lcore server's on the same
  job, and to the integer gradients' exact average.

Usage: steering_netns_test.py BUILD_DIR. Exit 77 (skipped) without root,
ip(8) or /dev/net/tun.
"""

import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import (NetnsTestbed, check, eal, f32, finish,  # noqa
                          integer_value, kill_all, make_secret, read_f32)

WORKERS = 2
FLOATS = 150000
ITERATIONS = 6
DUMP_ITERS = 3
SUBNET = "10.77.6"
TAP_KERNEL_MAC = "02:00:00:77:06:fe"


def sh(*cmd):
    return subprocess.run(list(cmd), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def bridge_server_host(bed):
    """h0's eth0 and (later) the tap's kernel side on one bridge, brt,
    which holds h0's address (the control plane's TCP)."""
    ns = bed.ns(0)
    for cmd in (["ip", "-n", ns, "link", "add", "brt", "type", "bridge"],
                ["ip", "-n", ns, "addr", "flush", "dev", "eth0"],
                ["ip", "-n", ns, "link", "set", "eth0", "master", "brt"],
                ["ip", "-n", ns, "addr", "add", bed.ip(0) + "/24", "dev",
                 "brt"],
                ["ip", "-n", ns, "link", "set", "brt", "up"]):
        r = sh(*cmd)
        if r.returncode != 0:
            return " ".join(cmd) + ": " + r.stdout
    return ""


def attach_tap(bed, proc, log_path, deadline):
    """Once the server set its port up (it waits for the workers): a MAC of
    its own on dtap0's kernel side (the bridge keeps frames for a port's
    own MAC), then onto brt."""
    ns = bed.ns(0)
    while time.time() < deadline and proc.poll() is None:
        with open(log_path, errors="replace") as f:
            ready = "waiting for" in f.read()
        if ready:
            for cmd in (["link", "set", "dtap0", "address", TAP_KERNEL_MAC],
                        ["link", "set", "dtap0", "master", "brt"],
                        ["link", "set", "dtap0", "up"]):
                r = sh("ip", "-n", ns, *cmd)
                if r.returncode != 0:
                    return "ip " + " ".join(cmd) + ": " + r.stdout
            return ""
        time.sleep(0.05)
    return "the server never set its port up"


def run_job(build, tmp, bed, secret, name, lcores, server_extra=()):
    """One job: the server on net_tap with `lcores` lcores, two workers.
    Returns (exit codes, {app: log}, dump dir); every process is gone
    when it returns."""
    dump = os.path.join(tmp, name + "-dump")
    os.makedirs(dump, exist_ok=True)
    queues = len(lcores.split(","))
    common = ["--secret_file=" + secret, "--stats_period=0",
              "--idle_sleep_us=100", "--round_timeout_ms=10000",
              "--dump_dir=" + dump, "--dump_iterations=%d" % DUMP_ITERS]
    logs, procs = [], []

    def start(app, ns, cmd):
        log = open(os.path.join(tmp, "%s-%s.log" % (name, app)), "w")
        logs.append((app, log))
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns] + cmd,
                                      stdout=log, stderr=subprocess.STDOUT))

    rcs, setup_why = [], ""
    try:
        start("server", bed.ns(0),
              [os.path.join(build, "apps", "dblp-server")] +
              eal(name, "s", "net_tap0,iface=dtap0", lcore=lcores) +
              ["--", "--workers=%d" % WORKERS,
               "--listen=%s:9100" % bed.ip(0), "--local_ip=" + bed.ip(0),
               "--policy=reliable", "--resync_every=0"] + common +
              list(server_extra))
        setup_why = attach_tap(bed, procs[0],
                               os.path.join(tmp, "%s-server.log" % name),
                               time.time() + 15)
        for r in range(WORKERS if not setup_why else 0):
            vdev = "net_af_packet0,iface=eth0,qpairs=%d" % queues
            start("w%d" % r, bed.ns(1 + r),
                  [os.path.join(build, "apps", "dblp-worker")] +
                  eal(name, "w%d" % r, vdev,
                      lcore="1" if os.cpu_count() > 1 else "0") +
                  ["--", "--server=%s:9100" % bed.ip(0),
                   "--local_ip=" + bed.ip(1 + r), "--gradient=integer",
                   "--iterations=%d" % ITERATIONS,
                   "--floats=%d" % FLOATS] + common)
            time.sleep(0.3)  # ranks follow the JOIN order
        for p in procs:
            try:
                rcs.append(p.wait(timeout=40))
            except subprocess.TimeoutExpired:
                rcs.append(None)
    finally:
        kill_all(procs)
        # The tap goes with its process; nothing else to undo here.
        out = {"setup": setup_why} if setup_why else {}
        for app, log in logs:
            log.close()
            with open(os.path.join(tmp, "%s-%s.log" % (name, app)),
                      errors="replace") as f:
                out[app] = f.read()
    return rcs, out, dump


def counter(text, key):
    """A summary counter (the summary leaves out those at 0)."""
    m = re.search(r"\b%s=(\d+)" % key, text)
    return int(m.group(1)) if m else 0


def means_equal(a, b):
    """"" if every dumped mean of job dirs a and b is the same, bit for
    bit, and the integer gradients' exact average."""
    for it in range(DUMP_ITERS):
        ma = read_f32(os.path.join(a, "mean_it%d.f32" % it))
        mb = read_f32(os.path.join(b, "mean_it%d.f32" % it))
        if len(ma) != FLOATS or len(mb) != FLOATS:
            return "iteration %d: %d and %d floats dumped" % (
                it, len(ma), len(mb))
        if ma != mb:
            k = next(i for i in range(FLOATS) if ma[i] != mb[i])
            return "iteration %d float %d: 2 lcores %r, 1 lcore %r" % (
                it, k, ma[k], mb[k])
        for j in range(0, FLOATS, 7):
            want = f32(sum(integer_value(j, it, r) for r in range(WORKERS)) /
                       WORKERS)
            if ma[j] != want:
                return "iteration %d float %d: %r != %r" % (it, j, ma[j],
                                                            want)
    return ""


def flag_refusals(build):
    server = os.path.join(build, "apps", "dblp-server")
    for extra, want in ((["--steering=bogus"], "use auto, flow or rss"),
                        (["--steering=rss", "--flow_isolate"],
                         "--steering=flow or auto")):
        r = subprocess.run([server] + eal("steerflags", "x") +
                           ["--"] + extra, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=30)
        check("%s is refused naming the fix" % " ".join(extra),
              r.returncode != 0 and want in r.stdout and
              "EAL: Detected" not in r.stdout, r.stdout[-600:])


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    flag_refusals(build)
    if not os.path.exists("/dev/net/tun"):
        print("SKIP: no /dev/net/tun for net_tap")
        return 77
    tmp = tempfile.mkdtemp(prefix="dblp-steer-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    with NetnsTestbed(3, SUBNET) as bed:
        if not bed.ok:
            print("SKIP: " + bed.why)
            return 77
        why = bridge_server_host(bed)
        if why:
            print("SKIP: cannot bridge the tap in h0: " + why)
            return 77
        # --steering=flow: its rules, or an exit naming the fallback.
        rcs_f, out_f, _ = run_job(build, tmp, bed, secret, "flow", "0,1",
                                  ["--steering=flow"])
        srv_f = out_f.get("server", "") + out_f.get("setup", "")
        flow_ok = "steering flow: flow rules" in srv_f
        if not flow_ok:
            m = re.search(r"refused its flow rules: (.*)", srv_f)
            print("net_tap refused the flow rules: " +
                  (m.group(1) if m else srv_f[-400:]))
        check("--steering=flow installs its rules or exits naming "
              "--steering=rss",
              (flow_ok and rcs_f == [0] * (WORKERS + 1)) or
              (not flow_ok and rcs_f and rcs_f[0] == 1 and
               "--steering=rss" in srv_f), srv_f[-800:])
        # --flow_isolate: only the rules' frames reach DPDK, or an exit
        # naming the fix when the port refuses the rules.
        rcs_i, out_i, _ = run_job(build, tmp, bed, secret, "isolate", "0,1",
                                  ["--flow_isolate"])
        srv_i = out_i.get("server", "")
        iso_ok = "flow rules: UDP dst" in srv_i and "(isolated)" in srv_i
        check("--flow_isolate runs the job under its rules or exits naming "
              "the fix",
              (iso_ok and rcs_i == [0] * (WORKERS + 1) and
               counter(srv_i, "frames_misrouted") == 0) or
              (not iso_ok and rcs_i and rcs_i[0] == 1 and
               "drop --flow_isolate" in srv_i), srv_i[-800:])
        rcs2, out2, dump2 = run_job(build, tmp, bed, secret, "two", "0,1")
        rcs1, out1, dump1 = run_job(build, tmp, bed, secret, "one", "0")
    detail = "\n".join("%s:\n%s" % (k, v[-1200:]) for k, v in out2.items())
    check("the 2-lcore job on net_tap completes",
          rcs2 == [0] * (WORKERS + 1), "rcs=%s\n%s" % (rcs2, detail))
    check("the 1-lcore job on net_tap completes",
          rcs1 == [0] * (WORKERS + 1),
          "rcs=%s\n%s" % (rcs1, out1.get("server", "")[-800:]))
    srv = out2.get("server", "")
    line = re.search(r"dblp-server: port 0 \(net_tap\): steering auto: (.*)",
                     srv)
    print("startup: " + (line.group(0) if line else "(no steering line)"))
    flows = line is not None and line.group(1).startswith("flow rules:")
    check("the server says how port 0 steers its 2 queues",
          line is not None and (flows or "handed to it" in line.group(1)),
          srv[-800:])
    per = [counter(srv, "frames_misrouted_lcore%d" % k) for k in range(2)]
    print("frames_misrouted per lcore: %s (%s)" %
          (per, "flow rules" if flows else "RSS fallback"))
    check("the per-lcore misrouted counters add up to frames_misrouted",
          counter(srv, "frames_misrouted") == sum(per), srv[-800:])
    check("no frame was accepted by an lcore that does not own its range",
          counter(srv, "push_misrouted") == 0, srv[-800:])
    if flows:
        check("under flow rules every frame landed on its owner's queue",
              sum(per) == 0, "frames_misrouted per lcore: %s" % per)
    check("no handed-over frame was dropped",
          counter(srv, "frames_handoff_full") == 0, srv[-800:])
    ok = rcs2 and rcs1 and rcs2[0] == 0 and rcs1[0] == 0
    why = means_equal(dump2, dump1) if ok else "a job failed"
    check("the 2-lcore means are bit-identical to the 1-lcore server's",
          why == "", why)
    finish()


if __name__ == "__main__":
    sys.exit(main())
