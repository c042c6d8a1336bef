#!/usr/bin/env python3
"""An observer on the job's L2 segment cannot rewrite the mean (issue #21).

The netns testbed (deploy/netns-testbed.sh) with its bridge as a hub: the
server in h0 and two workers in h1, h2 (dblp-server / dblp-worker on
net_af_packet), and in h3 an observer that copies every DBLP frame it sees
(pushes and broadcasts), rewrites its floats, fixes its UDP checksum and
sends it again from the sender's own MAC and IP. Each receiving app drops
30% of what arrives (--loss) so that replays can fill the gaps, as they
did at 8cec710 under `--frame_auth=header` (the old default: the tag
covered the header only). Every app sends at 0.02 Gb/s (--link_gbps), so
that the observer, a Python loop, replays within the round: a copy that
comes after its round closed is refused as stale whatever its tag.

Under the default tags every replay must be refused (push_bad_tag counted)
and the means must be bit-exact: integer gradients, --policy=reliable, each
dumped iteration's server mean and every worker's copy checked against the
mean recomputed here.

Usage: netns_replay_test.py BUILD_DIR [-- extra dblp-server flags]
Exit 77 (skipped) without root or ip(8).
"""

import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import (NetnsTestbed, check, eal, f32, finish,  # noqa
                          integer_value, make_secret, read_f32)

WORKERS = 2
FLOATS = 20000
ITERATIONS = 40
DUMP_ITERS = 6
UDP_PORT = 47000  # dblp-server's default --udp_port; workers use +1+rank

# The observer: runs in its own namespace with python3 -c.
OBSERVER = r'''
import socket, struct, sys, time
port, end, out = int(sys.argv[1]), time.time() + float(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(("eth0", 0))
s.settimeout(0.2)
def csum(b):
    if len(b) % 2: b += b"\0"
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while t >> 16: t = (t & 0xffff) + (t >> 16)
    return ~t & 0xffff
sent = 0
while time.time() < end:
    try:
        f, addr = s.recvfrom(4096)
    except socket.timeout:
        continue
    if addr[2] == socket.PACKET_OUTGOING or len(f) < 14 + 20 + 8 + 20:
        continue
    if f[12:14] != b"\x08\x00" or f[23] != 17:
        continue
    ihl = (f[14] & 15) * 4
    u = 14 + ihl
    sport, dport, ulen = struct.unpack("!HHH", f[u:u + 6])
    if not (port <= dport <= port + 64 or sport == port):
        continue
    g = bytearray(f)
    body = u + 8 + 20             # DBLP header: 20 bytes
    tag = u + ulen - 16           # the frame tag: 16 bytes at the end
    for k in range(body, tag - 3, 4):
        g[k:k + 4] = struct.pack("<f", 1000.0)
    g[u + 6:u + 8] = b"\0\0"
    pseudo = bytes(g[26:34]) + struct.pack("!BBH", 0, 17, ulen)
    c = csum(pseudo + bytes(g[u:u + ulen])) or 0xffff
    g[u + 6:u + 8] = struct.pack("!H", c)
    s.send(bytes(g))
    sent += 1
    if sent % 20 == 1:
        open(out, "w").write(str(sent))
'''


def run_job(build, tmp, bed, secret, server_extra):
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump, exist_ok=True)
    vdev = "net_af_packet0,iface=eth0"
    common = ["--secret_file=" + secret, "--stats_period=0",
              "--idle_sleep_us=100", "--round_timeout_ms=30000",
              "--loss=bernoulli:0.3", "--link_gbps=0.02", "--dump_dir=" + dump,
              "--dump_iterations=%d" % DUMP_ITERS]
    logs, procs = [], []

    def start(name, ns, cmd):
        log = open(os.path.join(tmp, name + ".log"), "w")
        logs.append((name, log))
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns] + cmd,
                                      stdout=log, stderr=subprocess.STDOUT))

    count = os.path.join(tmp, "replayed")
    start("observer", bed.ns(3), [sys.executable, "-c", OBSERVER,
                                   str(UDP_PORT), "90", count])
    start("server", bed.ns(0),
          [os.path.join(build, "apps", "dblp-server")] +
          eal("replay", "s", vdev) +
          ["--", "--workers=%d" % WORKERS, "--listen=%s:9100" % bed.ip(0),
           "--local_ip=" + bed.ip(0), "--policy=reliable",
           "--resync_every=0"] + common +
          list(server_extra))
    time.sleep(1.0)
    for r in range(WORKERS):
        start("w%d" % r, bed.ns(1 + r),
              [os.path.join(build, "apps", "dblp-worker")] +
              eal("replay", "w%d" % r, vdev,
                  lcore="1" if os.cpu_count() > 1 else "0") +
              ["--", "--server=%s:9100" % bed.ip(0),
               "--local_ip=" + bed.ip(1 + r), "--gradient=integer",
               "--iterations=%d" % ITERATIONS, "--floats=%d" % FLOATS] +
              common)
        time.sleep(0.5)  # ranks follow the JOIN order
    rcs = []
    for p in procs[1:]:
        try:
            rcs.append(p.wait(timeout=120))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(None)
    procs[0].kill()
    procs[0].wait()
    out = {}
    for name, log in logs:
        log.close()
        with open(os.path.join(tmp, name + ".log"), errors="replace") as f:
            out[name] = f.read()
    replayed = 0
    if os.path.exists(count):
        with open(count) as f:
            replayed = int(f.read() or 0)
    return rcs, out, dump, replayed


def counter(text, name):
    m = re.search(r"\b%s=(\d+)" % name, text)
    return int(m.group(1)) if m else 0


def means_exact(dump, tmp):
    """"" if every dumped mean is the integer gradients' exact average."""
    for it in range(DUMP_ITERS):
        mean = read_f32(os.path.join(dump, "mean_it%d.f32" % it))
        if len(mean) != FLOATS:
            return "iteration %d: the server dumped %d floats" % (it, len(mean))
        for j in range(FLOATS):
            want = f32(sum(integer_value(j, it, r) for r in range(WORKERS)) /
                       WORKERS)
            if mean[j] != want:
                return ("iteration %d float %d: server mean %r != %r" %
                        (it, j, mean[j], want))
        for r in range(WORKERS):
            avg = read_f32(os.path.join(dump, "w%d_it%d_avg.f32" % (r, it)))
            if list(avg) != list(mean):
                k = next(i for i in range(FLOATS) if avg[i] != mean[i])
                return ("iteration %d worker %d float %d: %r != the server's "
                        "%r" % (it, r, k, avg[k], mean[k]))
    return ""


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    extra = sys.argv[3:] if len(sys.argv) > 2 and sys.argv[2] == "--" else []
    tmp = tempfile.mkdtemp(prefix="dblp-replay-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    with NetnsTestbed(4, "10.77.4", hub=True) as bed:
        if not bed.ok:
            print("SKIP: " + bed.why)
            return 77
        rcs, out, dump, replayed = run_job(build, tmp, bed, secret, extra)
    detail = "\n".join("%s:\n%s" % (k, v[-800:]) for k, v in out.items())
    check("the job completes with an observer replaying its frames",
          rcs == [0] * (WORKERS + 1), "rcs=%s\n%s" % (rcs, detail))
    check("the observer saw and replayed the job's frames (hub bridge)",
          replayed > 100, "replayed=%d" % replayed)
    bad = counter(out.get("server", ""), "push_bad_tag")
    check("the server refused the replayed pushes as bad tags",
          bad > 0, out.get("server", "")[-800:])
    why = means_exact(dump, tmp) if rcs and rcs[0] == 0 else "job failed"
    check("every dumped mean is bit-exact on the server and every worker",
          why == "", why)
    finish()


if __name__ == "__main__":
    sys.exit(main())
