#!/usr/bin/env python3
"""The parity test of the one job over its three transports: 1 server + 3
workers over memif DPDK (dblp-server, dblp-worker), kernel UDP
(--transport=udp: dblp-udp-server, dblp-udp-worker) or the simulator
(--transport=sim: dblp-sim, every member in one process, modelled clock),
the same job flags and the same checks on each.

Runs a short job with Bernoulli loss on every data link, a 70% microburst,
stale replays and malformed frames sent at the server, and integer-valued
gradients (sums are exact in float32). Then checks, from the dumps the apps
write, the protocol's promises:

  * the server's mean of every dumped iteration equals, bit for bit, the
    mean recomputed here from the known gradients and the push bitmaps
    (zero fill: sum over the workers whose chunk arrived, divided by W);
  * each worker's average equals the server's mean on every chunk its
    broadcast bitmap has, and is zero elsewhere;
  * every push round delivered at least ceil((1 - p) N) chunks;
  * stale and malformed frames were counted and dropped, and every round
    still completed.

With --server_lcores=2 the server runs two datapath lcores: each round's
chunks are split over them (lanes) (the workers get two memif queues), and the
same checks hold (bit-exact means, every round at or above the threshold
although its STOP is decided from two lcores' counts), plus: no frame
reached the wrong lcore. With --worker_lcores=2 as well, each worker's
push sides are split over its two lcores (lcore k steps TX queue k), and
each lcore must have sent frames (tx_frames_lcoreK in its summary).

With --consistent the server runs --bcast_tolerance=consistent: every
worker's broadcast bitmap is then the same subset of exactly the threshold's
size, and what the workers applied plus what the last iteration carried
equals the sum of the pushes' means (float tolerance: the carry adds in
float32; tests/test_broadcast_carry.cc checks it exactly).

With --feedback the server runs --push_feedback: each worker adds what the
server did not sum into its next push, so the expected mean is recomputed
from the gradients plus a carry the test tracks per worker (bit for bit).

With --policy=dblp the server's p follows its CLR detector: the p of every
iteration in the server's rows must be the one this test's own replay of
the detector (DBLP's rule, written here from the paper, not from our C++)
derives from the norms of the means the rows record. With --resync=K every
K-th step is a re-synchronisation: its rounds are reliable, and every
worker loads the same complete average. With --push_fill=rescale the
expected mean divides by the workers whose chunk arrived.

With --lose_worker the last worker runs LOST_AFTER iterations and the
server --on_worker_loss=continue: it is lost when the others push the next
one. It sent none of that push, so that round's mean already divides by
the W - 1 live workers (a worker lost after some of its chunks arrived
still counts in its last round: they are in the sums), and so does every
round after; their every round still meets the threshold, and the lost
worker's rows deliver nothing (memif and UDP; the simulator's silent
member is tests/silent_member_test.py's).

The hostile frames (--hostile_per_round) are a test hook of the DPDK worker
only. Among them are genuine headers and tags re-sent from the worker's
pinned address with other floats (a header-tag replay): the default frame
tag (full) must refuse every one and leave the means bit for bit; under
--frame_auth=header they get in and this test fails, as it should; on UDP and in the simulator their counters are not checked. The
simulator has no frame tags (a modelled link has no observer).

Usage: memif_cluster_test.py BUILD_DIR [--transport=memif|udp|sim]
           [--server_lcores=N] [--worker_lcores=N] [--consistent] [--feedback]
           [--policy=fixed|dblp] [--resync=K] [--push_fill=zero|rescale]
           [--frame_auth=header|full|none (default: the apps')]
           [--bcast_frames=copy|shared (dblp-server's; memif only)]
           [--lose_worker] [--tx_payload=copy|extbuf] [--memif_zero_copy]

--tx_payload=extbuf: the workers send their chunks as external-buffer
segments over the gradient (no copy by the worker); --memif_zero_copy: the
workers' memif clients run zero-copy=yes (--single-file-segments). Both
memif only, with the same exact-mean checks.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dblp_testlib import (f32, free_port, hooked_app, integer_value,  # noqa: E402
                          kill_all, read_bits, read_f32)

WORKERS = 3
ITERATIONS = 12
FLOATS = 20000  # 56 chunks; sharded runs use more (see main)
DUMP_ITERS = 6
MTU = 1500
P_FIXED = 0.05
# --policy=dblp: a CLR check every 2 iterations; the integer gradients'
# norms move enough between checks to switch the regime both ways.
P_LOW = 0.02
P_HIGH = 0.3
CLR_FREQ = 2
CLR_ETA = 0.05
TIMEOUT_S = 240
LOST_AFTER = 3  # --lose_worker: iterations the last worker runs


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def parse_args():
    a = {"build": sys.argv[1], "transport": "memif", "lcores": 1,
         "worker_lcores": 1,
         "consistent": False, "feedback": False, "frame_auth": "",
         "policy": "fixed", "resync": 0, "push_fill": "zero",
         "lose_worker": False, "bcast_frames": "", "tx_payload": "",
         "memif_zero_copy": False}
    for arg in sys.argv[2:]:
        key, _, value = arg.lstrip("-").partition("=")
        if key in ("consistent", "feedback", "lose_worker", "memif_zero_copy"):
            a[key] = True
        elif key == "server_lcores":
            a["lcores"] = int(value)
        elif key == "worker_lcores":
            a["worker_lcores"] = int(value)
        elif key == "resync":
            a["resync"] = int(value)
        elif key in ("transport", "frame_auth", "policy", "push_fill",
                     "bcast_frames", "tx_payload"):
            a[key] = value
        else:
            fail("unknown argument " + arg)
    if a["transport"] not in ("memif", "udp", "sim"):
        fail("--transport=memif, udp or sim")
    if a["worker_lcores"] > 1 and a["transport"] != "memif":
        fail("--worker_lcores: memif only")
    if a["worker_lcores"] > a["lcores"]:
        fail("--worker_lcores=N needs --server_lcores >= N (a push side "
             "per server lcore to split)")
    if a["bcast_frames"] and a["transport"] != "memif":
        fail("--bcast_frames: memif only (dblp-server's flag)")
    if (a["tx_payload"] or a["memif_zero_copy"]) and a["transport"] != "memif":
        fail("--tx_payload, --memif_zero_copy: memif only")
    if a["lose_worker"] and a["transport"] == "sim":
        fail("--lose_worker: the simulator loses no worker")
    return a


def job_flags(a, tmp, dump, secret):
    """The flags of the job, the same for either transport."""
    common = ["--secret_file=" + secret, "--seed=11", "--loss=bernoulli:0.05",
              "--burst_iters=3", "--burst_loss=0.7", "--idle_sleep_us=50",
              "--round_timeout_ms=20000", "--dump_dir=" + dump,
              "--dump_iterations=%d" % DUMP_ITERS]
    policy = (["--policy=fixed", "--p_fixed=%g" % P_FIXED]
              if a["policy"] == "fixed" else
              ["--policy=dblp", "--p_low=%g" % P_LOW, "--p_high=%g" % P_HIGH,
               "--clr_freq=%d" % CLR_FREQ, "--clr_eta=%g" % CLR_ETA])
    server = ["--workers=%d" % WORKERS] + policy + [
        # The mean recomputed below: zero fill (sum / W) or rescale.
        "--push_fill=" + a["push_fill"], "--resync_every=%d" % a["resync"],
        "--bcast_tolerance=%s" % ("consistent" if a["consistent"] else "same"),
        "--push_feedback=%s" % ("true" if a["feedback"] else "false"),
        "--on_worker_loss=%s" % ("continue" if a["lose_worker"] else "abort"),
        ] + (["--frame_auth=" + a["frame_auth"]] if a["frame_auth"] else []
             ) + (["--bcast_frames=" + a["bcast_frames"]]
                  if a["bcast_frames"] else []) + common
    worker = ["--iterations=%d" % ITERATIONS, "--floats=%d" % FLOATS,
              "--gradient=integer"] + common
    return server, worker


def launch_sim(a, tmp, server_flags, worker_flags):
    """The whole job in dblp-sim: one process, the same flags and files."""
    sim = os.path.join(a["build"], "apps", "dblp-sim")
    if not os.access(sim, os.X_OK):
        fail("missing " + sim)
    flags = server_flags + [f for f in worker_flags if f not in server_flags]
    p = subprocess.run([sim, "--out_dir=" + tmp] + flags, capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    if p.returncode != 0:
        print(p.stdout[-2000:] + p.stderr[-2000:])
        fail("dblp-sim exited with %d" % p.returncode)
    return {"server": p.stdout}


def launch(a, tmp, server_flags, worker_flags):
    """Server, then the workers in rank order; their outputs by name."""
    if a["transport"] == "sim":
        return launch_sim(a, tmp, server_flags, worker_flags)
    server_flags = server_flags + ["--out_dir=" + os.path.join(tmp, "server")]
    build = a["build"]
    udp = a["transport"] == "udp"
    names = (("dblp-udp-server", "dblp-udp-worker") if udp else
             ("dblp-server", "dblp-worker"))
    server_bin = os.path.join(build, "apps", names[0])
    # The DPDK worker sends the hostile frames (--hostile_per_round): the
    # tests' twin (-Dtest_hooks=true); the UDP worker is the shipped one.
    worker_bin = (os.path.join(build, "apps", names[1]) if udp else
                  hooked_app(build, names[1]))
    for b in (server_bin, worker_bin):
        if not os.access(b, os.X_OK):
            fail("missing " + b)
    uniq = "t%d" % os.getpid()
    port = free_port()
    lcores = a["lcores"]
    procs = []
    try:
        if udp:
            server_cmd = [server_bin, "--control=127.0.0.1:%d" % port]
        else:
            server_cores = ",".join(str(i % max(1, os.cpu_count() or 1))
                                    for i in range(lcores))
            if lcores > 1:
                # Distinct EAL lcores even where the machine has fewer cores.
                server_cores = ",".join("%d@%d" % (i, i % (os.cpu_count() or 1))
                                        for i in range(lcores))
            eal = ["--lcores", server_cores, "--no-huge", "-m", "256",
                   "--no-pci", "--file-prefix=dblp-%s-srv" % uniq,
                   "--log-level=*:warning"]
            for w in range(WORKERS):
                eal.append("--vdev=net_memif%d,role=server,socket=%s/w%d.sock,"
                           "id=0" % (w, tmp, w))
            server_cmd = [server_bin] + eal + [
                "--", "--listen=127.0.0.1:%d" % port, "--stats_period=0"]
        server = subprocess.Popen(server_cmd + server_flags,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        procs.append(("server", server))
        time.sleep(1.0)
        cpu = "1" if os.cpu_count() and os.cpu_count() > 1 else "0"
        for w in range(WORKERS):
            own = ["--out_dir=" + os.path.join(tmp, "worker%d" % w)]
            if a["lose_worker"] and w == WORKERS - 1:
                own.append("--iterations=%d" % LOST_AFTER)
            if udp:
                cmd = [worker_bin, "--server=127.0.0.1:%d" % port,
                       "--name=w%d" % w] + own
            else:
                ncpu = os.cpu_count() or 1
                wl = a["worker_lcores"]
                # Distinct EAL lcores (lcore 0 on `cpu`) even on fewer cores.
                lflag = (["-l", cpu] if wl == 1 else
                         ["--lcores", ",".join(
                             "%d@%d" % (i, (int(cpu) + i) % ncpu)
                             for i in range(wl))])
                zc = a["memif_zero_copy"]
                weal = lflag + ["--no-huge", "-m", "256", "--no-pci",
                        "--file-prefix=dblp-%s-w%d" % (uniq, w),
                        "--log-level=*:warning",
                        "--vdev=net_memif0,role=client,socket=%s/w%d.sock,id=0%s"
                        % (tmp, w, ",zero-copy=yes" if zc else "")] + (
                    ["--single-file-segments"] if zc else [])
                cmd = [worker_bin] + weal + [
                    "--", "--server=127.0.0.1:%d" % port, "--stats_period=0",
                    "--hostile_per_round=4"] + own + (
                    ["--tx_payload=" + a["tx_payload"]]
                    if a["tx_payload"] else [])
            p = subprocess.Popen(cmd + worker_flags + own[1:],
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            procs.append(("worker%d" % w, p))
            time.sleep(0.2)  # join in rank order: rank == start order
        deadline = time.time() + TIMEOUT_S
        outputs = {}
        for name, p in procs:
            try:
                out, _ = p.communicate(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                fail(name + " did not finish in %d s" % TIMEOUT_S)
            outputs[name] = out
        for name, p in procs:
            if p.returncode != 0:
                for other, out in outputs.items():
                    print("---- %s (exit %s)" % (other, dict(
                        (n, q.returncode) for n, q in procs)[other]))
                    print(out[-2000:])
                fail("%s exited with %d" % (name, p.returncode))
        return outputs
    finally:
        kill_all([p for _, p in procs])


def check_worker_lcores(a, w, summary):
    """--worker_lcores=N: every lcore of the worker sent push frames (lcore
    k steps TX queue k's push side), not lcore 0 alone."""
    n = a["worker_lcores"]
    if n == 1:
        return None
    c = summary["counters"]
    per = [c.get("tx_frames_lcore%d" % k, 0) for k in range(n)]
    if any(x == 0 for x in per):
        fail("worker%d: not every lcore sent frames: %s" % (w, per))
    if sum(per) != c["tx_frames"]:
        fail("worker%d: per-lcore tx_frames %s do not add up to %d"
             % (w, per, c["tx_frames"]))
    return per


def stop_threshold(n, p):
    return n - math.floor(p * n * (1 + 1e-12))


def replay_clr(norms):
    """DBLP's CLR rule on the means' norms: the p of every iteration.

    Training starts critical; every CLR_FREQ iterations the norm of the
    window's last iteration is compared with the previous check's; a
    relative change of at least CLR_ETA makes the next window critical
    (P_LOW), otherwise it is not (P_HIGH). The first check has no
    reference and keeps the next window critical."""
    p = [P_LOW]
    critical, reference = True, None
    for it, norm in enumerate(norms):
        if it % CLR_FREQ == CLR_FREQ - 1:
            if reference is None:
                critical = True
            elif reference == 0:
                critical = norm != 0
            else:
                critical = abs(reference - norm) / reference >= CLR_ETA
            reference = norm
        p.append(P_LOW if critical else P_HIGH)
    return p


def train_step(it, every):
    """The training step of protocol iteration `it` (resync.h), or None for
    a re-synchronisation iteration."""
    if every == 0:
        return it
    if (it + 1) % (every + 1) == 0:
        return None
    return it - (it + 1) // (every + 1)


def main():
    global FLOATS
    a = parse_args()
    lcores = a["lcores"]
    consistent, feedback = a["consistent"], a["feedback"]
    frame_auth = a["frame_auth"]
    udp = a["transport"] == "udp"
    if lcores > 1:
        FLOATS = 60000  # 166 chunks: shard ranges [0, 128) and [128, 166)
    tmp = tempfile.mkdtemp(prefix="dblp-cluster-test-")
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump)
    secret = os.path.join(tmp, "job.secret")
    with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(os.urandom(32))
    server_flags, worker_flags = job_flags(a, tmp, dump, secret)
    outputs = launch(a, tmp, server_flags, worker_flags)

    # ---- the checks -------------------------------------------------------
    if a["bcast_frames"]:
        verb = "share" if a["bcast_frames"] == "shared" else "copy"
        if "broadcast frames %s the mean" % verb not in outputs["server"]:
            fail("the server did not run --bcast_frames=%s:\n%s" % (
                a["bcast_frames"], outputs["server"][-1500:]))
    tag = 0 if frame_auth == "none" or a["transport"] == "sim" else 16
    chunk_floats = (((MTU - 20 - 8 - 20) & ~3) - tag) // 4
    n_chunks = (FLOATS + chunk_floats - 1) // chunk_floats
    rescale = a["push_fill"] == "rescale"

    # Worker rank = join order; map names to ranks from the summaries.
    ranks = {}
    for w in range(WORKERS):
        with open(os.path.join(tmp, "worker%d" % w, "summary.json")) as f:
            summary = json.load(f)
        ranks[w] = summary["rank"]
        lcore_tx = check_worker_lcores(a, w, summary)
    if sorted(ranks.values()) != list(range(WORKERS)):
        fail("ranks %s" % ranks)
    # --lose_worker: the rank that stops after LOST_AFTER iterations.
    lost = ranks[WORKERS - 1] if a["lose_worker"] else None

    def gone(r, it):
        return r == lost and it >= LOST_AFTER

    def divisor(it):
        """What the zero fill divides by: every worker until the loss's
        iteration, to which the lost one sent nothing, the live ones from
        it on."""
        return WORKERS - 1 if lost is not None and it >= LOST_AFTER \
            else WORKERS

    # The server's rows: every iteration's push p and mean norm.
    # --iterations counts training steps; resyncs come on top.
    iterations = 0
    while sum(train_step(it, a["resync"]) is not None
              for it in range(iterations)) < ITERATIONS:
        iterations += 1
    rows = [json.loads(l) for l in open(os.path.join(tmp, "server",
                                                     "iterations.jsonl"))]
    if len(rows) != iterations * WORKERS:
        fail("server recorded %d rows, expected %d" % (len(rows),
                                                       iterations * WORKERS))
    push_p = {r["iteration"]: r["p"] for r in rows}
    norms = {r["iteration"]: r["grad_norm"] for r in rows}
    steps = [train_step(it, a["resync"]) for it in range(iterations)]
    training = [it for it in range(iterations) if steps[it] is not None]
    # The p the policy chose after each training step (the broadcast's) and
    # for each step's push.
    if a["policy"] == "dblp":
        replay = replay_clr([norms[it] for it in training])
        # The rule must have been exercised both ways: out of the critical
        # regime, and back into it (with rescale fill and resync rounds the
        # norms change by 0-3% or by 8-40% between checks here).
        trace = replay[:len(training)]
        left = P_HIGH in trace
        back = any(a == P_HIGH and b == P_LOW for a, b in zip(trace, trace[1:]))
        if not (left and back):
            fail("the CLR detector did not leave and re-enter the critical "
                 "regime (p per step %s): the test shows nothing" % trace)
    else:
        replay = [P_FIXED] * (len(training) + 1)
    want_p = {}
    for it in range(iterations):
        want_p[it] = 0.0 if steps[it] is None else replay[steps[it]]
        if push_p[it] != want_p[it]:
            fail("iteration %d: the server pushed under p=%r, DBLP's rule "
                 "says %r" % (it, push_p[it], want_p[it]))
    for row in rows:
        if gone(row["rank"], row["iteration"]):
            if row["delivered_fraction"] != 0:
                fail("a lost worker delivered: %s" % row)
            continue
        if (row["delivered_fraction"] * n_chunks + 1e-9 <
                stop_threshold(n_chunks, push_p[row["iteration"]])):
            fail("round below threshold: %s" % row)
        if row["resync"] != (steps[row["iteration"]] is None):
            fail("resync flag: %s" % row)

    checked_chunks = 0
    applied = [[0.0] * FLOATS for _ in range(WORKERS)]
    pushed = [0.0] * FLOATS
    carry = [[0] * FLOATS for _ in range(WORKERS)]  # --feedback
    ever_carried = False
    resyncs_checked = 0
    for it in range(DUMP_ITERS):
        step = steps[it]
        threshold = stop_threshold(n_chunks, want_p[it])
        # The broadcast's p: the policy's after this step (reliable for a
        # resync).
        bcast_threshold = (n_chunks if step is None else
                           stop_threshold(n_chunks, replay[step + 1]))
        mean = read_f32(os.path.join(dump, "mean_it%d.f32" % it))
        if len(mean) != FLOATS:
            fail("mean size")
        arrived = [read_bits(os.path.join(dump, "w%d_it%d_push.bits" % (r, it)),
                             n_chunks) for r in range(WORKERS)]
        for r in range(WORKERS):
            got = sum(arrived[r])
            if gone(r, it):
                if got:
                    fail("iteration %d: lost worker %d's chunks summed" % (it, r))
                continue
            if got < threshold:
                fail("iteration %d worker %d: %d of %d chunks < threshold %d"
                     % (it, r, got, n_chunks, threshold))
        for j in range(FLOATS):
            c = j // chunk_floats
            # A resync pushes the model: the integer source has none (zeros).
            sent = [(0.0 if step is None else integer_value(j, step, r)) +
                    carry[r][j] for r in range(WORKERS)]
            s = sum(sent[r] for r in range(WORKERS) if arrived[r][c])
            k = sum(1 for r in range(WORKERS) if arrived[r][c])
            if feedback and step is not None:
                for r in range(WORKERS):
                    carry[r][j] = 0 if arrived[r][c] else sent[r]
                    ever_carried = ever_carried or carry[r][j] != 0
            if rescale:
                expect = f32(s / k) if k else 0.0
            else:
                expect = f32(s / divisor(it))
            pushed[j] += expect
            if consistent:
                continue  # the sent mean holds the carry too: checked below
            if mean[j] != expect:
                fail("iteration %d float %d: server mean %r != expected %r"
                     % (it, j, mean[j], expect))
        avgs = []
        for r in range(WORKERS):
            if gone(r, it):
                continue
            avg = read_f32(os.path.join(dump, "w%d_it%d_avg.f32" % (r, it)))
            got = read_bits(os.path.join(dump, "w%d_it%d_bcast.bits" % (r, it)),
                            n_chunks)
            if sum(got) < bcast_threshold:
                fail("iteration %d worker %d: broadcast %d of %d chunks < "
                     "threshold %d" % (it, r, sum(got), n_chunks,
                                       bcast_threshold))
            for j in range(FLOATS):
                want = mean[j] if got[j // chunk_floats] else 0.0
                if avg[j] != want:
                    fail("iteration %d worker %d float %d: average %r != %r"
                         % (it, r, j, avg[j], want))
                applied[r][j] += avg[j]
            avgs.append(avg)
            checked_chunks += sum(got)
            if consistent:
                if r == 0:
                    subset = got
                elif got != subset:
                    fail("iteration %d: worker %d applied another subset "
                         "than worker 0" % (it, r))
                if sum(got) != threshold:
                    fail("iteration %d worker %d: %d broadcast chunks, the "
                         "consistent subset has %d" % (it, r, sum(got),
                                                       threshold))
        if step is None:
            # Every replica loads the same, whole average.
            if any(v != avgs[0] for v in avgs) or sum(got) != n_chunks:
                fail("resync iteration %d: the replicas loaded different or "
                     "partial averages" % it)
            resyncs_checked += 1
        if consistent and it == DUMP_ITERS - 1:
            # Conservation: applied + carried out of the last iteration.
            for r in range(WORKERS):
                for j in range(FLOATS):
                    left = 0.0 if subset[j // chunk_floats] else mean[j]
                    if abs(applied[r][j] + left - pushed[j]) > 1e-3:
                        fail("worker %d float %d: applied %r + carried %r != "
                             "pushed %r" % (r, j, applied[r][j], left,
                                            pushed[j]))
    if a["resync"] and not resyncs_checked:
        fail("--resync: no resync iteration among the dumped ones")

    with open(os.path.join(tmp, "server", "summary.json")) as f:
        srv = json.load(f)
    c = srv["counters"]
    if c["push_accepted"] > iterations * WORKERS * n_chunks:
        fail("more accepted than sent chunks: stale frames accepted?")
    if c["injected_drops"] == 0:
        fail("no loss was injected")
    if a["transport"] == "memif":
        # The DPDK worker's hostile frames (--hostile_per_round): stale,
        # foreign, future, forged and unpinned frames and bad DBLP bytes,
        # all counted and dropped while the means above matched bit for bit.
        if c["push_stale_round"] < 4 * (ITERATIONS - 1):
            fail("stale replays not all counted: %d" % c["push_stale_round"])
        for key in ("push_wrong_session", "push_future_round",
                    "push_out_of_range", "decode_short_buffer",
                    "decode_bad_magic"):
            if c[key] < ITERATIONS - 1:
                fail("%s not counted: %d" % (key, c[key]))
        # Forged tags and, under full tags, the header-tag replays.
        want = 4 * (ITERATIONS - 1) * (2 if frame_auth in ("", "full") else 1)
        if tag and c["push_bad_tag"] < want:
            fail("forged tags and tag replays not all counted: %d < %d"
                 % (c["push_bad_tag"], want))
        if c["frames_unpinned_source"] < 4 * (ITERATIONS - 1):
            fail("frames from an unpinned source not all counted: %d"
                 % c["frames_unpinned_source"])
        if c.get("push_misrouted", 0) != 0:
            fail("%d frames reached the wrong shard lcore" % c["push_misrouted"])
        # memif's queue k reaches queue k: only the hostile stale replays,
        # all sent on queue 0, land on another lcore's queue (and are
        # handed to it, which refuses them as stale).
        if c.get("frames_misrouted", 0) > c["push_stale_round"]:
            fail("%d frames landed on another lcore's queue over memif, "
                 "more than the %d stale replays" %
                 (c["frames_misrouted"], c["push_stale_round"]))
    if lcores > 1 and ("%d datapath lcore(s)" % lcores) not in outputs["server"]:
        fail("server did not run %d lcores:\n%s" % (lcores,
                                                     outputs["server"][-800:]))
    if lost is not None:
        if "continuing without worker %d" % lost not in outputs["server"]:
            fail("the server did not say it continues without worker %d:\n%s"
                 % (lost, outputs["server"][-800:]))
    if feedback and not ever_carried:
        fail("--feedback: nothing was ever carried, the test shows nothing")
    print("%s cluster (%d server lcores, %d worker lcores, policy %s%s%s%s%s): %d iterations, %d "
          "dumped iterations checked bit for bit (%d broadcast chunks, %d "
          "resyncs), stale=%d bad_tag=%d unpinned=%d (frame_auth=%s)"
          % (a["transport"], lcores, a["worker_lcores"], a["policy"],
             ", consistent broadcast" if consistent else "",
             ", push feedback" if feedback else "",
             ", %s fill" % a["push_fill"],
             ", worker %s lost after %d" % (lost, LOST_AFTER)
             if lost is not None else "", iterations, DUMP_ITERS,
             checked_chunks, resyncs_checked, c["push_stale_round"],
             c["push_bad_tag"], c["frames_unpinned_source"],
             "none" if a["transport"] == "sim" else frame_auth or "default"))
    if lcore_tx is not None:
        print("last worker's frames sent per lcore: %s" % lcore_tx)
    shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
