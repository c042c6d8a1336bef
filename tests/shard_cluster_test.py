#!/usr/bin/env python3
"""Server shards over memif: one job on S dblp-server processes (each owns a
partition of the gradient's chunks, shard 0 is the directory) against the
same job on one dblp-server. With --transport=udp the same over kernel UDP:
S dblp-udp-server processes and dblp-udp-workers, against one
dblp-udp-server.

Modes (one per meson test):

  parity  (default) 1 server, then 2 shards, 3 workers each, integer
          gradients (sums exact in float32), no injected loss. Which copies
          a round sums is timing (STOP at ceil((1-p)N) while frames are in
          flight), so: every shard mean (the partitions end to end) must
          be the mean of its own arrivals, bit for bit; wherever both jobs
          summed the same copies, the one server's, bit for bit (at least
          half of all floats); every shard's rows must carry the one
          server's p and phase every iteration (the same CLR decisions)
          and the norm of the whole mean, and the one server's norm bits
          where every arrival matched; every worker applies the shards'
          mean where its broadcast arrived (--policy=dblp: the reference
          must itself leave and re-enter the critical regime, or the test
          shows nothing).
  --loss  2 shards under Bernoulli loss and a 70% burst: every shard's push
          rounds deliver >= ceil((1 - p) N_k) of its own N_k chunks, and
          every worker's average equals the shards' mean on every chunk its
          broadcast bitmaps hold (zero elsewhere).
  --kill  2 shards, 2 workers; shard 1 is killed (SIGKILL) mid-job: every
          worker and shard 0 must end with an error naming shard 1 within
          the round timeout (+ slack), none by a signal.
  --netns  parity with 2 workers on deploy/netns-testbed.sh's namespaces,
          one per process: shard 0 with two lcores on net_af_packet
          (steered by rte_flow where the port takes rules, else by the
          kernel's fanout hash with frames on another lcore's queue handed
          to it), shard 1, and the workers with one port each that reaches
          both shards; plus no chunk summed by an lcore that does not own
          it. Exit 77 (skipped) without root.
  --wrong_map  a worker that JOINs shard 1 as if it were the directory is
          refused with an error that names the directory; a worker given a
          wrong shard map (--shard_map_override) is refused by the shard it
          claims, naming the claim and the directory.

  --transport=udp  (parity, --loss, --kill, --wrong_map without the shard
          map hook, which only dblp-worker has) the kernel-UDP apps.

  --worker_lcores=N  (parity, --loss) every server and worker runs N
          lcores: each worker's push sides (N per shard) split over its N
          lcores, every one of which must send.

Usage: shard_cluster_test.py BUILD_DIR [--policy=fixed|dblp] [--resync=K]
           [--loss | --kill | --wrong_map | --netns] [--worker_lcores=N]
           [--transport=dpdk|udp]
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from dblp_testlib import (NetnsTestbed, check, f32, finish, free_port,
                          hooked_app, integer_value, kill_all, make_secret,
                          read_bits, read_f32)

WORKERS = 3
ITERATIONS = 12
FLOATS = 90000  # 251 chunks of 359 floats: partitions [0, 128), [128, 251)
DUMP_ITERS = 6
P_FIXED = 0.05
P_LOW, P_HIGH, CLR_FREQ, CLR_ETA = 0.02, 0.3, 2, 0.05
TIMEOUT_S = 240
KILL_ROUND_TIMEOUT_MS = 3000


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def parse_args():
    a = {"build": sys.argv[1], "policy": "fixed", "resync": 0,
         "mode": "parity", "netns": False, "worker_lcores": 1,
         "transport": "dpdk"}
    for arg in sys.argv[2:]:
        key, _, value = arg.lstrip("-").partition("=")
        if key in ("loss", "kill", "wrong_map"):
            a["mode"] = key
        elif key == "netns":
            a["netns"] = True
        elif key == "resync":
            a["resync"] = int(value)
        elif key == "worker_lcores":
            a["worker_lcores"] = int(value)
        elif key == "policy":
            a["policy"] = value
        elif key == "transport" and value in ("dpdk", "udp"):
            a["transport"] = value
        else:
            fail("unknown argument " + arg)
    return a


class Job:
    """One job's processes: S servers (memif server ports, one per worker)
    and W workers (one memif client port per server)."""

    def __init__(self, a, tmp, shards, workers, flags, worker_flags):
        self.a, self.tmp, self.shards, self.workers = a, tmp, shards, workers
        self.flags, self.worker_flags = flags, worker_flags
        self.ports = [free_port() for _ in range(shards)]
        self.procs = []  # (name, Popen)
        self.uniq = "sc%d-%s" % (os.getpid(), os.path.basename(tmp)[-6:])

    def app(self, name):
        path = os.path.join(self.a["build"], "apps", name)
        if not os.access(path, os.X_OK):
            fail("missing " + path)
        return path

    def eal(self, who, vdevs, lcore):
        # --worker_lcores=N: every process runs N distinct EAL lcores (the
        # servers N lanes, so each worker has N push sides per
        # shard to split over its N lcores), even on fewer cores.
        n = self.a["worker_lcores"]
        ncpu = os.cpu_count() or 1
        lflag = (["-l", lcore] if n == 1 else
                 ["--lcores", ",".join("%d@%d" % (i, (int(lcore) + i) % ncpu)
                                       for i in range(n))])
        return (lflag + ["--no-huge", "-m", "256", "--no-pci",
                 "--file-prefix=dblp-%s-%s" % (self.uniq, who),
                 "--log-level=*:warning"] + ["--vdev=" + v for v in vdevs])

    def sock(self, k, w):
        return "%s/s%dw%d.sock" % (self.tmp, k, w)

    def server_cmd(self, k):
        vdevs = ["net_memif%d,role=server,socket=%s,id=0" % (w, self.sock(k, w))
                 for w in range(self.workers)]
        own = ["--listen=127.0.0.1:%d" % self.ports[k], "--stats_period=0"
               ] + self.server_own(k)
        return ([self.app("dblp-server")] + self.eal("s%d" % k, vdevs, "0") +
                ["--"] + own + self.flags)

    def server_own(self, k):
        """Server k's rows, dumps and place among the shards."""
        own = ["--out_dir=%s/server%d" % (self.tmp, k),
               "--dump_dir=%s/dump/s%d" % (self.tmp, k)]
        if self.shards > 1:
            own += ["--shards=%d" % self.shards, "--shard_index=%d" % k]
            if k > 0:
                own.append("--directory=127.0.0.1:%d" % self.ports[0])
        return own

    def worker_cmd(self, w, server=None):
        vdevs = ["net_memif%d,role=client,socket=%s,id=0" % (k, self.sock(k, w))
                 for k in range(self.shards)]
        cpu = "1" if (os.cpu_count() or 1) > 1 else "0"
        own = ["--server=127.0.0.1:%d" % (server or self.ports[0]),
               "--stats_period=0", "--name=w%d" % w,
               "--out_dir=%s/worker%d" % (self.tmp, w),
               "--dump_dir=%s/dump/w" % self.tmp]
        return ([self.app("dblp-worker")] + self.eal("w%d" % w, vdevs, cpu) +
                ["--"] + own + self.worker_flags)

    def spawn(self, name, cmd):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.procs.append((name, p))
        return p

    def start(self):
        for k in range(self.shards):
            os.makedirs("%s/dump/s%d" % (self.tmp, k), exist_ok=True)
        os.makedirs("%s/dump/w" % self.tmp, exist_ok=True)
        for k in range(self.shards):
            self.spawn("shard%d" % k, self.server_cmd(k))
            time.sleep(0.5)
        time.sleep(0.5)
        for w in range(self.workers):
            self.spawn("worker%d" % w, self.worker_cmd(w))
            time.sleep(0.2)  # join in rank order: rank == start order

    def wait(self, timeout):
        """Every process's (exit code, output, seconds from now)."""
        t0 = time.time()
        deadline = t0 + timeout
        results = {}
        for name, p in self.procs:
            try:
                out, _ = p.communicate(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.kill()
                out, _ = p.communicate()
                results[name] = (None, out, time.time() - t0)
                continue
            results[name] = (p.returncode, out, time.time() - t0)
        return results

    def kill(self):
        kill_all([p for _, p in self.procs])


class NetnsJob(Job):
    """The same job on deploy/netns-testbed.sh's namespaces, one per host:
    h0 shard 0 with two datapath lcores (net_af_packet qpairs=2; steered
    by rte_flow where the port takes rules, else by the kernel's fanout
    hash with frames on the wrong queue handed to their lcore), h1 shard 1,
    h2.. the workers, each with one port that reaches both shards (qpairs=2:
    TX queue k carries shard 0's lcore k's chunks)."""

    def __init__(self, bed, *args):
        super().__init__(*args)
        self.bed = bed

    def server_cmd(self, k):
        lcores = "0@0,1@1" if k == 0 else "0@0"
        q = ",qpairs=2" if k == 0 else ""
        own = ["--listen=%s:9100" % self.bed.ip(k), "--local_ip=" +
               self.bed.ip(k), "--stats_period=0",
               "--out_dir=%s/server%d" % (self.tmp, k),
               "--dump_dir=%s/dump/s%d" % (self.tmp, k),
               "--shards=%d" % self.shards, "--shard_index=%d" % k]
        if k > 0:
            own.append("--directory=%s:9100" % self.bed.ip(0))
        eal = ["--lcores", lcores, "--no-huge", "-m", "256", "--no-pci",
               "--file-prefix=dblp-%s-s%d" % (self.uniq, k),
               "--log-level=*:warning", "--vdev=net_af_packet0,iface=eth0" + q]
        return (["ip", "netns", "exec", self.bed.ns(k),
                 self.app("dblp-server")] + eal + ["--"] + own + self.flags)

    def worker_cmd(self, w, server=None):
        h = self.shards + w
        cpu = "1" if (os.cpu_count() or 1) > 1 else "0"
        eal = ["-l", cpu, "--no-huge", "-m", "256", "--no-pci",
               "--file-prefix=dblp-%s-w%d" % (self.uniq, w),
               "--log-level=*:warning",
               "--vdev=net_af_packet0,iface=eth0,qpairs=2"]
        own = ["--server=%s:9100" % self.bed.ip(0), "--local_ip=" +
               self.bed.ip(h), "--stats_period=0", "--name=w%d" % w,
               "--out_dir=%s/worker%d" % (self.tmp, w),
               "--dump_dir=%s/dump/w" % self.tmp]
        return (["ip", "netns", "exec", self.bed.ns(h),
                 self.app("dblp-worker")] + eal + ["--"] + own +
                self.worker_flags)


class UdpJob(Job):
    """The same job over kernel UDP: dblp-udp-server shards (each its own
    data socket, learnt by the workers from the WELCOMEs) and
    dblp-udp-workers, every one on 127.0.0.1."""

    def server_cmd(self, k):
        own = ["--control=127.0.0.1:%d" % self.ports[k]] + self.server_own(k)
        return [self.app("dblp-udp-server")] + own + self.flags

    def worker_cmd(self, w, server=None):
        own = ["--server=127.0.0.1:%d" % (server or self.ports[0]),
               "--name=w%d" % w, "--out_dir=%s/worker%d" % (self.tmp, w),
               "--dump_dir=%s/dump/w" % self.tmp]
        return [self.app("dblp-udp-worker")] + own + self.worker_flags


def job_class(a):
    return UdpJob if a["transport"] == "udp" else Job


def job_flags(a, secret, lossy):
    common = ["--secret_file=" + secret, "--seed=11", "--idle_sleep_us=50",
              "--round_timeout_ms=20000", "--dump_iterations=%d" % DUMP_ITERS]
    if lossy:
        common += ["--loss=bernoulli:0.05", "--burst_iters=3",
                   "--burst_loss=0.7"]
    policy = (["--policy=fixed", "--p_fixed=%g" % P_FIXED]
              if a["policy"] == "fixed" else
              ["--policy=dblp", "--p_low=%g" % P_LOW, "--p_high=%g" % P_HIGH,
               "--clr_freq=%d" % CLR_FREQ, "--clr_eta=%g" % CLR_ETA])
    server = (["--workers=%d" % WORKERS, "--push_fill=rescale",
               "--resync_every=%d" % a["resync"]] + policy + common)
    worker = (["--iterations=%d" % ITERATIONS, "--floats=%d" % FLOATS,
               "--gradient=integer"] + common)
    if a["policy"] == "dblp":
        # The mean's norm x4 for iterations 4-6: the detector leaves the
        # critical regime at the check of iteration 3 and comes back.
        worker += ["--norm_jumps=4", "--jump_length=3"]
    return server, worker


def run_job(a, tmp, shards, lossy=False, bed=None):
    workers = WORKERS
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, lossy)
    server = [f for f in server if not f.startswith("--workers=")] + [
        "--workers=%d" % workers]
    job = (NetnsJob(bed, a, tmp, shards, workers, server, worker) if bed
           else job_class(a)(a, tmp, shards, workers, server, worker))
    try:
        job.start()
        results = job.wait(TIMEOUT_S)
    finally:
        job.kill()
    bad = {n: r for n, r in results.items() if r[0] != 0}
    if bad:
        for n, r in results.items():
            print("---- %s (exit %s)\n%s" % (n, r[0], r[1][-1500:]))
        fail("%d-shard job: %s did not exit 0" % (shards, ", ".join(bad)))
    return results


def rows_of(tmp, k):
    with open(os.path.join(tmp, "server%d" % k, "iterations.jsonl")) as f:
        return [json.loads(line) for line in f]


def per_iteration(rows, key):
    out = {}
    for r in rows:
        out.setdefault(r["iteration"], r[key])
    return out


def ranks_of(tmp, worker_lcores=1):
    """Worker name -> rank; with several worker lcores, also checks that
    every lcore of every worker sent frames."""
    ranks = {}
    for w in range(WORKERS):
        with open(os.path.join(tmp, "worker%d" % w, "summary.json")) as f:
            summary = json.load(f)
        ranks[w] = summary["rank"]
        if worker_lcores > 1:
            c = summary["counters"]
            per = [c.get("tx_frames_lcore%d" % k, 0)
                   for k in range(worker_lcores)]
            check("worker%d: every lcore sent frames %s" % (w, per),
                  all(per) and sum(per) == c["tx_frames"])
    return ranks


def sharded_mean(tmp, shards, it):
    mean = []
    for k in range(shards):
        mean += read_f32(os.path.join(tmp, "dump", "s%d" % k,
                                      "mean_it%d.f32" % it))
    return mean


CHUNK_FLOATS = (((1500 - 20 - 8 - 20) & ~3) - 16) // 4  # full tags: 359
N_CHUNKS = (FLOATS + CHUNK_FLOATS - 1) // CHUNK_FLOATS
BOUNDS = {1: [0, N_CHUNKS], 2: [0, 128, N_CHUNKS]}  # ChunkRanges' cut, 64-aligned


def push_bits(tmp, shards, rank, it):
    """Worker `rank`'s push chunks that the server(s) summed in iteration
    `it`, in global chunk order (each shard dumps its partition's bits)."""
    bits = []
    b = BOUNDS[shards]
    for k in range(shards):
        bits += read_bits(os.path.join(tmp, "dump", "s%d" % k,
                                       "w%d_it%d_push.bits" % (rank, it)),
                          b[k + 1] - b[k])
    return bits


def train_step(it, every):
    if every == 0:
        return it
    if (it + 1) % (every + 1) == 0:
        return None
    return it - (it + 1) // (every + 1)


def sent_value(a, j, step, rank):
    """What worker `rank` pushed at float j (integer gradients, x4 in the
    --norm_jumps window; a resync pushes the integer source's model: 0)."""
    if step is None:
        return 0.0
    jump = a["policy"] == "dblp" and 4 <= step < 7
    return integer_value(j, step, rank) * (4.0 if jump else 1.0)


def parity(a, bed=None):
    """The same job on one server and on two shards. Which chunks a round
    sums is timing (STOP at ceil((1-p)N) while frames are in flight), so
    the runs are compared where their arrivals agree, and each is checked
    against its own arrivals everywhere."""
    ref = tempfile.mkdtemp(prefix="dblp-shards-ref-")
    sh = tempfile.mkdtemp(prefix="dblp-shards-2-")
    run_job(a, ref, 1)
    out = run_job(a, sh, 2, bed=bed)
    if bed:
        steered(sh)
    check("shard 1 registered with the directory and ran its partition",
          "shard 1" in out["shard1"][1] or "shard 1" in out["shard0"][1],
          out["shard1"][1][-600:])
    ref_rows, s0, s1 = rows_of(ref, 0), rows_of(sh, 0), rows_of(sh, 1)
    for key in ("p", "critical"):
        want = per_iteration(ref_rows, key)
        for k, rows in enumerate((s0, s1)):
            got = per_iteration(rows, key)
            check("shard %d: the one server's %s every iteration (one phase, "
                  "the same CLR decisions)" % (k, key), got == want,
                  "one server %s\nshard %d %s" % (want, k, got))
    norms0, norms1 = (per_iteration(s0, "grad_norm"),
                      per_iteration(s1, "grad_norm"))
    check("both shards record the job's one norm every iteration",
          norms0 == norms1, "%s\n%s" % (norms0, norms1))
    if a["policy"] == "dblp":
        # Training steps only: a resync's rounds are reliable (p = 0).
        ps = [p for _, p in sorted(per_iteration(ref_rows, "p").items())
              if p != 0.0]
        check("the reference left and re-entered the critical regime",
              P_HIGH in ps and any(x == P_HIGH and y == P_LOW
                                   for x, y in zip(ps, ps[1:])), ps)
    ref_norms = per_iteration(ref_rows, "grad_norm")
    rank_of = ranks_of(sh, a["worker_lcores"])
    bad = {"recompute": "", "ref": "", "norm": "", "same_norm": "",
           "avg": ""}
    compared = same_sets = 0
    for it in range(DUMP_ITERS):
        step = train_step(it, a["resync"])
        mean = sharded_mean(sh, 2, it)
        want_ref = read_f32(os.path.join(ref, "dump", "s0",
                                         "mean_it%d.f32" % it))
        arr = [push_bits(sh, 2, r, it) for r in range(WORKERS)]
        arr_ref = [push_bits(ref, 1, r, it) for r in range(WORKERS)]
        for j in range(FLOATS):
            c = j // CHUNK_FLOATS
            got = [r for r in range(WORKERS) if arr[r][c]]
            s = sum(sent_value(a, j, step, r) for r in got)
            expect = f32(s / len(got)) if got else 0.0
            if mean[j] != expect and not bad["recompute"]:
                bad["recompute"] = ("iteration %d float %d: %r, its own "
                                    "arrivals give %r" % (it, j, mean[j],
                                                          expect))
            if [arr[r][c] for r in range(WORKERS)] == \
                    [arr_ref[r][c] for r in range(WORKERS)]:
                compared += 1
                if mean[j] != want_ref[j] and not bad["ref"]:
                    bad["ref"] = ("iteration %d float %d: shards %r, one "
                                  "server %r" % (it, j, mean[j], want_ref[j]))
        norm = math.sqrt(sum(float(x) * x for x in mean))
        if abs(norms0[it] - norm) > 1e-9 * max(norm, 1) and not bad["norm"]:
            bad["norm"] = ("iteration %d: rows %r, the whole mean's %r"
                           % (it, norms0[it], norm))
        if arr == arr_ref:
            same_sets += 1
            if norms0[it] != ref_norms[it] and not bad["same_norm"]:
                bad["same_norm"] = ("iteration %d: %r vs one server's %r" %
                                    (it, norms0[it], ref_norms[it]))
        for w in range(WORKERS):
            r = rank_of[w]
            avg = read_f32(os.path.join(sh, "dump", "w",
                                        "w%d_it%d_avg.f32" % (r, it)))
            got = read_bits(os.path.join(sh, "dump", "w",
                                         "w%d_it%d_bcast.bits" % (r, it)),
                            N_CHUNKS)
            for j in range(FLOATS):
                if avg[j] != (mean[j] if got[j // CHUNK_FLOATS] else 0.0):
                    bad["avg"] = bad["avg"] or ("iteration %d worker %d "
                                                "float %d" % (it, w, j))
                    break
    check("every shard mean is the mean of its own arrivals, bit for bit",
          not bad["recompute"], bad["recompute"])
    check("where both jobs summed the same copies, the shards' mean is the "
          "one server's, bit for bit (%d of %d floats)" % (
              compared, DUMP_ITERS * FLOATS),
          not bad["ref"] and compared >= DUMP_ITERS * FLOATS // 2, bad["ref"])
    check("the rows' norm is the whole mean's (both partitions)",
          not bad["norm"], bad["norm"])
    check("iterations whose arrivals match carry the one server's norm, "
          "bit for bit (%d of %d)" % (same_sets, DUMP_ITERS),
          not bad["same_norm"], bad["same_norm"])
    check("every worker applied the shards' mean where its broadcast "
          "arrived", not bad["avg"], bad["avg"])
    shutil.rmtree(ref, ignore_errors=True)
    shutil.rmtree(sh, ignore_errors=True)


def steered(tmp):
    """Shard 0's two lcores: every chunk summed by the lcore that owns its
    range (push_misrouted = 0: frames on the other lcore's queue were
    handed to it, frames_misrouted, or steered there by flow rules)."""
    with open(os.path.join(tmp, "server0", "summary.json")) as f:
        c = json.load(f)["counters"]
    check("shard 0: no chunk summed by an lcore that does not own it "
          "(push_misrouted = %d; %d frames handed to their lcore)" % (
              c.get("push_misrouted", 0), c.get("frames_misrouted", 0)),
          ("push_misrouted" in c or "frames_misrouted" in c) and
          c.get("push_misrouted", 0) == 0, c)
    per_lcore = sum(v for k, v in c.items()
                    if k.startswith("frames_misrouted_lcore"))
    check("shard 0: its lcores' hand-overs add up (%d)" % per_lcore,
          per_lcore == c.get("frames_misrouted", 0), c)


def lossy(a):
    sh = tempfile.mkdtemp(prefix="dblp-shards-loss-")
    run_job(a, sh, 2, lossy=True)
    chunk_floats, n, bounds = CHUNK_FLOATS, N_CHUNKS, BOUNDS[2]
    for k in range(2):
        nk = bounds[k + 1] - bounds[k]
        low = []
        for r in rows_of(sh, k):
            need = nk - math.floor(r["p"] * nk * (1 + 1e-12))
            if r["delivered_fraction"] * nk + 1e-9 < need:
                low.append(r)
        check("shard %d: every push round delivered >= ceil((1-p) N_k)" % k,
              not low, low[:3])
    ranks = ranks_of(sh, a["worker_lcores"])
    bad = ""
    for it in range(DUMP_ITERS):
        mean = sharded_mean(sh, 2, it)
        for w in range(WORKERS):
            r = ranks[w]
            avg = read_f32(os.path.join(sh, "dump", "w",
                                        "w%d_it%d_avg.f32" % (r, it)))
            got = read_bits(os.path.join(sh, "dump", "w",
                                         "w%d_it%d_bcast.bits" % (r, it)), n)
            for j in range(FLOATS):
                want = mean[j] if got[j // chunk_floats] else 0.0
                if avg[j] != want:
                    bad = "iteration %d worker %d float %d" % (it, w, j)
                    break
    check("every worker's average is the shards' mean where it arrived",
          not bad, bad)
    shutil.rmtree(sh, ignore_errors=True)


def kill_shard(a):
    tmp = tempfile.mkdtemp(prefix="dblp-shards-kill-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, False)
    server = [f for f in server if not f.startswith("--workers")] + [
        "--workers=2"]
    flags = [f.replace("--round_timeout_ms=20000",
                       "--round_timeout_ms=%d" % KILL_ROUND_TIMEOUT_MS)
             for f in server]
    wflags = [f.replace("--round_timeout_ms=20000",
                        "--round_timeout_ms=%d" % KILL_ROUND_TIMEOUT_MS)
              .replace("--iterations=%d" % ITERATIONS, "--iterations=100000")
              for f in worker]
    job = job_class(a)(a, tmp, 2, 2, flags, wflags)
    try:
        job.start()
        rows = os.path.join(tmp, "worker0", "iterations.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.exists(rows) and sum(1 for _ in open(rows)) >= 5:
                break
            time.sleep(0.2)
        else:
            job.kill()
            fail("the 2-shard job never got going")
        victim = dict(job.procs)["shard1"]
        victim.send_signal(signal.SIGKILL)
        job.procs = [(n, p) for n, p in job.procs if n != "shard1"]
        limit = KILL_ROUND_TIMEOUT_MS / 1000.0 + 3
        results = job.wait(limit + 20)
    finally:
        job.kill()
    for name, (rc, out, secs) in results.items():
        check("%s ended with an error (exit 1), not a signal" % name,
              rc == 1, "exit %s\n%s" % (rc, out[-800:]))
        check("%s ended within the round timeout (%.1f s <= %.1f s)"
              % (name, secs, limit), secs <= limit)
        check("%s's error names shard 1" % name, "shard 1" in out,
              out[-800:])
    shutil.rmtree(tmp, ignore_errors=True)


def wrong_map(a):
    tmp = tempfile.mkdtemp(prefix="dblp-shards-map-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, False)
    job = job_class(a)(a, tmp, 2, WORKERS, server, worker)
    try:
        for k in range(2):
            job.spawn("shard%d" % k, job.server_cmd(k))
            time.sleep(0.5)
        time.sleep(0.5)
        # JOINs shard 1 as if it were the directory.
        p = job.spawn("lost", job.worker_cmd(0, server=job.ports[1]))
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out = "(no answer in 30 s)"
        check("a worker that JOINs shard 1 as the directory is refused",
              p.returncode not in (0, None) and p.returncode > 0,
              "exit %s" % p.returncode)
        check("...with an error naming the directory (shard 0)",
              "directory" in out and str(job.ports[0]) in out, out[-800:])
    finally:
        job.kill()
    shutil.rmtree(tmp, ignore_errors=True)
    if a["transport"] == "dpdk":  # the shard map hook is dblp-worker's
        wrong_claim(a)


def wrong_claim(a):
    """A worker given a wrong shard map (dblp-worker's test hook
    --shard_map_override: it claims chunks [0, 64) of shard 1, which owns
    [128, 251)) is refused by shard 1 with an error naming the claim and
    the directory; no process ends by a signal or hangs."""
    tmp = tempfile.mkdtemp(prefix="dblp-shards-claim-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    server, worker = job_flags(a, secret, False)
    server = [f for f in server if not f.startswith("--round_timeout_ms")]
    server.append("--round_timeout_ms=%d" % KILL_ROUND_TIMEOUT_MS)
    job = Job(a, tmp, 2, WORKERS, server, worker)
    plain = job.worker_cmd
    liar = WORKERS - 1
    # The liar is the tests' twin of dblp-worker (-Dtest_hooks=true).
    hooked = hooked_app(a["build"], "dblp-worker")
    job.worker_cmd = lambda w, server=None: (
        plain(w, server) if w != liar else
        [hooked] + plain(w, server)[1:] + ["--shard_map_override=1:0:64"])
    try:
        job.start()
        results = job.wait(60)
    finally:
        job.kill()
    rc, out, _ = results["worker%d" % liar]
    check("a worker given a wrong shard map is refused (exit 1)", rc == 1,
          "exit %s\n%s" % (rc, out[-800:]))
    check("...naming server shard 1, the claim and the directory",
          "server shard 1" in out and "claims chunks [0, 64)" in out and
          "directory" in out and str(job.ports[0]) in out, out[-800:])
    check("no process ended by a signal or hung",
          all(r[0] is not None and r[0] >= 0 for r in results.values()),
          {n: r[0] for n, r in results.items()})
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    global WORKERS
    a = parse_args()
    if a["netns"]:
        WORKERS = 2
        with NetnsTestbed(2 + WORKERS, "10.77.8") as bed:
            if not bed.ok:
                print("SKIP: " + bed.why)
                sys.exit(77)
            parity(a, bed)
        finish()
    {"parity": parity, "loss": lossy, "kill": kill_shard,
     "wrong_map": wrong_map}[a["mode"]](a)
    finish()


if __name__ == "__main__":
    main()
