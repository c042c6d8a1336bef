#!/usr/bin/env python3
"""Multi-process memif cluster test: 1 dblp-server + 3 dblp-workers.

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
chunks are sharded over them (the workers get two memif queues), and the
same checks hold (bit-exact means, every round at or above the threshold
although its STOP is decided from two lcores' counts), plus: no frame
reached the wrong lcore.

With --consistent the server runs --bcast_tolerance=consistent: every
worker's broadcast bitmap is then the same subset of exactly the threshold's
size, and what the workers applied plus what the last iteration carried
equals the sum of the pushes' means (float tolerance: the carry adds in
float32; tests/test_broadcast_carry.cc checks it exactly).

With --feedback the server runs --push_feedback: each worker adds what the
server did not sum into its next push, so the expected mean is recomputed
from the gradients plus a carry the test tracks per worker (bit for bit).

Usage: memif_cluster_test.py BUILD_DIR [--server_lcores=N] [--consistent]
                             [--feedback]
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dblp_testlib import f32, free_port, integer_value, read_bits, read_f32  # noqa: E402

WORKERS = 3
ITERATIONS = 12
FLOATS = 20000  # 56 chunks; sharded runs use more (see main)
DUMP_ITERS = 6
MTU = 1500
P_FIXED = 0.05
TIMEOUT_S = 240


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)












def main():
    global FLOATS
    build = sys.argv[1]
    lcores = 1
    consistent = "--consistent" in sys.argv[2:]
    feedback = "--feedback" in sys.argv[2:]
    frame_auth = "header"
    for a in sys.argv[2:]:
        if a.startswith("--server_lcores="):
            lcores = int(a.split("=", 1)[1])
        if a.startswith("--frame_auth="):
            frame_auth = a.split("=", 1)[1]
    if lcores > 1:
        FLOATS = 60000  # 166 chunks: shard ranges [0, 128) and [128, 166)
    server_bin = os.path.join(build, "apps", "dblp-server")
    worker_bin = os.path.join(build, "apps", "dblp-worker")
    for b in (server_bin, worker_bin):
        if not os.access(b, os.X_OK):
            fail("missing " + b)
    tmp = tempfile.mkdtemp(prefix="dblp-memif-test-")
    uniq = "t%d" % os.getpid()
    port = free_port()
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump)
    secret = os.path.join(tmp, "job.secret")
    with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(os.urandom(32))
    common = ["--secret_file=" + secret, "--seed=11", "--loss=bernoulli:0.05", "--burst_iters=3",
              "--burst_loss=0.7", "--stats_period=0", "--idle_sleep_us=50",
              "--round_timeout_ms=20000"]
    procs = []
    try:
        server_cores = ",".join(str(i % max(1, os.cpu_count() or 1))
                                for i in range(lcores))
        if lcores > 1:
            # Distinct EAL lcores even where the machine has fewer cores.
            server_cores = ",".join("%d@%d" % (i, i % (os.cpu_count() or 1))
                                    for i in range(lcores))
        eal = ["--lcores", server_cores, "--no-huge", "-m", "256", "--no-pci",
               "--file-prefix=dblp-%s-srv" % uniq, "--log-level=*:warning"]
        for w in range(WORKERS):
            eal.append("--vdev=net_memif%d,role=server,socket=%s/w%d.sock,id=0"
                       % (w, tmp, w))
        server = subprocess.Popen(
            [server_bin] + eal + ["--", "--workers=%d" % WORKERS,
                                  "--listen=127.0.0.1:%d" % port,
                                  "--policy=fixed", "--p_fixed=%g" % P_FIXED,
                                  # The mean recomputed below is the
                                  # paper's (sum / W), no resync rounds.
                                  "--push_fill=zero", "--resync_every=0",
                                  "--bcast_tolerance=%s" % (
                                      "consistent" if consistent else "same"),
                                  "--push_feedback=%s" % (
                                      "true" if feedback else "false"),
                                  "--out_dir=" + os.path.join(tmp, "server"),
                                  "--dump_dir=" + dump,
                                  "--frame_auth=" + frame_auth,
                                  "--dump_iterations=%d" % DUMP_ITERS] + common,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(("server", server))
        time.sleep(1.0)
        cpu = "1" if os.cpu_count() and os.cpu_count() > 1 else "0"
        for w in range(WORKERS):
            weal = ["-l", cpu, "--no-huge", "-m", "256", "--no-pci",
                    "--file-prefix=dblp-%s-w%d" % (uniq, w),
                    "--log-level=*:warning",
                    "--vdev=net_memif0,role=client,socket=%s/w%d.sock,id=0"
                    % (tmp, w)]
            p = subprocess.Popen(
                [worker_bin] + weal + [
                    "--", "--server=127.0.0.1:%d" % port,
                    "--iterations=%d" % ITERATIONS, "--floats=%d" % FLOATS,
                    "--gradient=integer", "--hostile_per_round=4",
                    "--out_dir=" + os.path.join(tmp, "worker%d" % w),
                    "--dump_dir=" + dump,
                    "--dump_iterations=%d" % DUMP_ITERS] + common,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    # ---- the checks -------------------------------------------------------
    tag = 0 if frame_auth == "none" else 16
    chunk_floats = (((MTU - 20 - 8 - 20) & ~3) - tag) // 4
    n_chunks = (FLOATS + chunk_floats - 1) // chunk_floats
    threshold = n_chunks - math.floor(P_FIXED * n_chunks * (1 + 1e-12))

    # Worker rank = join order; map names to ranks from the summaries.
    ranks = {}
    for w in range(WORKERS):
        with open(os.path.join(tmp, "worker%d" % w, "summary.json")) as f:
            ranks[w] = json.load(f)["rank"]
    if sorted(ranks.values()) != list(range(WORKERS)):
        fail("ranks %s" % ranks)

    checked_chunks = 0
    applied = [[0.0] * FLOATS for _ in range(WORKERS)]
    pushed = [0.0] * FLOATS
    carry = [[0] * FLOATS for _ in range(WORKERS)]  # --feedback
    ever_carried = False
    for it in range(DUMP_ITERS):
        mean = read_f32(os.path.join(dump, "mean_it%d.f32" % it))
        if len(mean) != FLOATS:
            fail("mean size")
        arrived = [read_bits(os.path.join(dump, "w%d_it%d_push.bits" % (r, it)),
                             n_chunks) for r in range(WORKERS)]
        for r in range(WORKERS):
            got = sum(arrived[r])
            if got < threshold:
                fail("iteration %d worker %d: %d of %d chunks < threshold %d"
                     % (it, r, got, n_chunks, threshold))
        for j in range(FLOATS):
            c = j // chunk_floats
            sent = [integer_value(j, it, r) + carry[r][j]
                    for r in range(WORKERS)]
            s = sum(sent[r] for r in range(WORKERS) if arrived[r][c])
            if feedback:
                for r in range(WORKERS):
                    carry[r][j] = 0 if arrived[r][c] else sent[r]
                    ever_carried = ever_carried or carry[r][j] != 0
            expect = f32(s / WORKERS)
            pushed[j] += expect
            if consistent:
                continue  # the sent mean holds the carry too: checked below
            if mean[j] != expect:
                fail("iteration %d float %d: server mean %r != expected %r"
                     % (it, j, mean[j], expect))
        for r in range(WORKERS):
            avg = read_f32(os.path.join(dump, "w%d_it%d_avg.f32" % (r, it)))
            got = read_bits(os.path.join(dump, "w%d_it%d_bcast.bits" % (r, it)),
                            n_chunks)
            for j in range(FLOATS):
                want = mean[j] if got[j // chunk_floats] else 0.0
                if avg[j] != want:
                    fail("iteration %d worker %d float %d: average %r != %r"
                         % (it, r, j, avg[j], want))
                applied[r][j] += avg[j]
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
        if consistent and it == DUMP_ITERS - 1:
            # Conservation: applied + carried out of the last iteration.
            for r in range(WORKERS):
                for j in range(FLOATS):
                    left = 0.0 if subset[j // chunk_floats] else mean[j]
                    if abs(applied[r][j] + left - pushed[j]) > 1e-3:
                        fail("worker %d float %d: applied %r + carried %r != "
                             "pushed %r" % (r, j, applied[r][j], left,
                                            pushed[j]))

    with open(os.path.join(tmp, "server", "summary.json")) as f:
        srv = json.load(f)
    c = srv["counters"]
    rows = [json.loads(l) for l in open(os.path.join(tmp, "server",
                                                     "iterations.jsonl"))]
    if len(rows) != ITERATIONS * WORKERS:
        fail("server recorded %d rows, expected %d" % (len(rows),
                                                       ITERATIONS * WORKERS))
    for row in rows:
        if row["delivered_fraction"] * n_chunks + 1e-9 < threshold:
            fail("round below threshold: %s" % row)
    if c["push_stale_round"] < 4 * (ITERATIONS - 1):
        fail("stale replays not all counted: %d" % c["push_stale_round"])
    if c["push_accepted"] > ITERATIONS * WORKERS * n_chunks:
        fail("more accepted than sent chunks: stale frames accepted?")
    for key in ("push_wrong_session", "push_future_round", "push_out_of_range",
                "decode_short_buffer", "decode_bad_magic"):
        if c[key] < ITERATIONS - 1:
            fail("%s not counted: %d" % (key, c[key]))
    # The forged frames of this round (a key that is not the job's) and the
    # exact copies from an address the server did not pin: all dropped and
    # counted, while the means above matched bit for bit.
    if tag and c["push_bad_tag"] < 4 * (ITERATIONS - 1):
        fail("forged tags not all counted: %d" % c["push_bad_tag"])
    if c["frames_unpinned_source"] < 4 * (ITERATIONS - 1):
        fail("frames from an unpinned source not all counted: %d"
             % c["frames_unpinned_source"])
    if c["injected_drops"] == 0:
        fail("no broadcast loss was injected")
    if c.get("push_misrouted", 0) != 0:
        fail("%d frames reached the wrong shard lcore" % c["push_misrouted"])
    if lcores > 1 and ("%d datapath lcore(s)" % lcores) not in outputs["server"]:
        fail("server did not run %d lcores:\n%s" % (lcores,
                                                     outputs["server"][-800:]))
    if feedback and not ever_carried:
        fail("--feedback: nothing was ever carried, the test shows nothing")
    print("memif cluster (%d server lcores%s): %d iterations, %d dumped iterations checked bit for "
          "bit (%d broadcast chunks), stale=%d wrong_session=%d future=%d "
          "out_of_range=%d bad_tag=%d unpinned=%d (frame_auth=%s)" % (lcores, (", consistent broadcast" if consistent
                                else "") + (", push feedback" if feedback
                                            else ""), ITERATIONS, DUMP_ITERS, checked_chunks,
                               c["push_stale_round"], c["push_wrong_session"],
                               c["push_future_round"], c["push_out_of_range"],
                               c["push_bad_tag"], c["frames_unpinned_source"],
                               frame_auth))
    shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
