#!/usr/bin/env python3
"""tools/dblp-bench end to end, small: testpmd over memif, then a 1 MiB
push-only DBLP job over memif and over kernel UDP at 0% loss, under
Bernoulli loss with p = 0 and with p = 0.05, one pass.

What it checks is what the benchmark promises, not how fast this machine
is: every run produced every measured round; delivered fraction is 1 with
p = 0 (loss or not) and >= 1 - p with p = 0.05; the lossy p = 0 rounds
resent frames; the ratios in the report are computed from the numbers next
to them; the data-movement floor (dblp-floor) was measured for the size
and its ratios are the DBLP round over it; an old result without the
floor still renders (n/a); usage errors exit 2 naming the fix, and so do
dblp-floor's bad flags.

Run: python3 tests/bench_test.py BUILD_DIR
"""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(TESTS_DIR), "tools", "dblp-bench")

failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name)
    if not ok:
        failures.append(name)
        if detail:
            print("     " + str(detail)[-1500:])


def load_bench():
    loader = importlib.machinery.SourceFileLoader("dblp_bench", BENCH)
    spec = importlib.util.spec_from_loader("dblp_bench", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def main():
    build = os.path.abspath(sys.argv[1])
    b = load_bench()

    # Pure pieces first: percentiles and the per-pass combination.
    check("nearest-rank percentile",
          b.percentile([5, 1, 4, 2, 3], 50) == 3 and
          b.percentile([5, 1, 4, 2, 3], 99) == 5 and
          b.percentile([7], 99) == 7 and
          b.percentile(list(range(1, 11)), 50) == 5 and
          b.percentile(list(range(1, 11)), 99) == 10 and
          b.percentile(list(range(1, 101)), 99) == 99)
    passes = [({"pps": 2.0, "p50_us": 10.0, "delivered_min": 0.99}, 4.0),
              ({"pps": 3.0, "p50_us": 20.0, "delivered_min": 0.98}, 4.0),
              ({"pps": 1.0, "p50_us": 30.0, "delivered_min": 1.0}, 2.0)]
    c = b.combine(passes)
    check("combine: medians, within-pass ratios, worst delivered",
          c["pps"] == 2.0 and c["p50_us"] == 20.0 and c["ratio"] == 0.5 and
          c["ratio_min"] == 0.5 and c["ratio_max"] == 0.75 and
          c["delivered_min"] == 0.98 and c["reference_pps"] == 4.0, c)

    check("two link states are told apart, one state is not split",
          b.link_states([4e6, 3.9e6, 20e6, 21e6]) is not None and
          3.9e6 < b.link_states([4e6, 3.9e6, 20e6, 21e6]) < 20e6 and
          b.link_states([4e6, 3.9e6, 4.2e6]) is None)
    pairs = [[1.0, 4.0, 10.0], [2.0, 20.0, 5.0], [3.0, 4.0, 9.0]]
    check("ratio cell per state",
          b.split_ratio(pairs, None).startswith("0.25x [0.10-0.75] (3)") and
          b.split_ratio(pairs, 9.0) ==
          "fast 0.10x [0.10-0.10] (1) · slow 0.50x [0.25-0.75] (2)",
          b.split_ratio(pairs, 9.0))

    # dblp-floor alone: bad flags exit 2 naming the flag (gflags' own
    # errors included), and a tiny run reports positive times.
    floor = os.path.join(build, "apps", "dblp-floor")
    for bad, needle in ((["--size_mb=0"], "size_mb"),
                        (["--measure=both,copy"], "measure"),
                        (["--rounds=abc"], "rounds"),
                        (["--no_such_flag=1"], "no_such_flag"),
                        (["stray"], "stray")):
        r = subprocess.run([floor] + bad, capture_output=True, text=True,
                           timeout=60)
        check("dblp-floor %s exits 2 naming it" % bad,
              r.returncode == 2 and needle in r.stderr and
              "error" in r.stderr, "rc=%d %s" % (r.returncode, r.stderr))
    r = subprocess.run([floor, "--size_mb=0.25", "--rounds=3", "--json"],
                       capture_output=True, text=True, timeout=60)
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = {}
    check("dblp-floor --json: copy and add, positive, per round",
          r.returncode == 0 and j.get("chunks") == 181 and
          all(j[w]["median_ms"] > 0 and j[w]["min_ms"] > 0 and
              j[w]["chunks_per_s"] > 0 and len(j[w]["round_ms"]) == 3
              for w in ("copy", "add")), r.stdout + r.stderr)

    # Usage errors.
    for bad in (["--sizes_mb=abc"], ["--cpus=0"], ["--p=1"],
                ["--server_lcores=0"], ["--build=/nonexistent"]):
        r = subprocess.run([sys.executable, BENCH] + bad,
                           capture_output=True, text=True, timeout=60)
        check("usage error %s exits 2 with a message" % bad,
              r.returncode == 2 and "error" in r.stderr, r.stderr)

    with tempfile.TemporaryDirectory(prefix="dblp-bench-test-") as out:
        cmd = [sys.executable, BENCH, "--quick", "--build", build,
               "--p=0.05", "--loss=bernoulli:0.05", "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        check("dblp-bench --quick exits 0", r.returncode == 0,
              r.stdout[-800:] + r.stderr[-800:])
        if r.returncode != 0:
            return
        with open(os.path.join(out, "bench.json")) as f:
            res = json.load(f)
        tp = res["testpmd"]["pps"]
        check("testpmd reference measured", tp > 0, res["testpmd"])
        runs = {row["setting"]: row for row in res["runs"]}
        check("three settings, each over DPDK and kernel UDP",
              len(runs) == 3 and all("dpdk" in r and "udp" in r
                                     for r in runs.values()), list(runs))
        for label, row in runs.items():
            for t in ("dpdk", "udp"):
                s = row[t]
                check("%s %s: all 3 measured rounds" % (label, t),
                      s["rounds"] == 3, s)
                if label.endswith("p=0"):
                    check("%s %s: p = 0 delivers every chunk" % (label, t),
                          s["delivered_min"] == 1.0, s)
                else:
                    check("%s %s: delivered >= 1 - p every round" %
                          (label, t), s["delivered_min"] >= 0.95, s)
            ref = row["dpdk"]["reference_pps"]
            check("%s: ratio is DBLP pps / the testpmd run next to it" %
                  label, ref in res["testpmd"]["all"] and
                  abs(row["dpdk"]["ratio"] - row["dpdk"]["pps"] / ref) <
                  1e-9, row["dpdk"])
        lossy = runs["bernoulli:0.05, p=0"]
        check("5% loss with p = 0: frames were resent",
              lossy["dpdk"]["packets_per_round"] > 723 and
              lossy["udp"]["packets_per_round"] > 723, lossy)
        with open(os.path.join(out, "bench.md")) as f:
            md = f.read()
        check("report names the command and the reference",
              "dblp-bench" in md and "testpmd" in md and "kernel UDP" in md)

        floors = res.get("floor", [])
        f = floors[0] if floors else {}
        check("floor measured for the size: copy and add positive",
              len(floors) == 1 and f["size_mb"] == 1.0 and
              f["chunks"] == 723 and
              all(f[k] > 0 for k in (
                  "copy_ms", "copy_min_ms", "copy_chunks_per_s", "add_ms",
                  "add_min_ms", "add_chunks_per_s")) and
              f["copy_min_ms"] <= f["copy_ms"] and
              f["add_min_ms"] <= f["add_ms"], floors)
        p50_ms = runs["0%, p=0"]["dpdk"]["p50_us"] / 1e3
        check("floor ratios are the DBLP round p50 over the floor",
              bool(f) and abs(f["dblp_p50_ms"] - p50_ms) < 1e-9 and
              abs(f["dblp_over_copy"] - p50_ms / f["copy_ms"]) < 1e-9 and
              abs(f["dblp_over_copy_add"] -
                  p50_ms / (f["copy_ms"] + f["add_ms"])) < 1e-9, f)
        check("report shows the floor and the server's lcores",
              "floor copy ms" in md and "DBLP / (copy + add) floor" in md
              and res.get("server_lcores") == 1 and
              "Server: 1 datapath lcore(s) (EAL `--lcores 0@0`)" in md, md)

        # The full iteration: push and broadcast of the same job.
        it = res.get("iteration") or {}
        b = {x["label"]: x for x in it.get("builds", [])}.get(
            "this build", {})
        check("full iteration: push and broadcast rounds, their ratio",
              it.get("size_mb") == 1.0 and b.get("push_p50_us", 0) > 0 and
              (b.get("bcast_p50_us") or 0) > 0 and
              (b.get("worker_wait_p50_us") or 0) > 0 and
              (b.get("bcast_frames_per_round") or 0) >= 723 and
              abs(b["ratio"] - b["bcast_p50_us"] / b["push_p50_us"]) < 1e-9,
              it)
        check("report shows broadcast / push and the Done-when lines",
              "broadcast / push" in md and "## Done when (issue #23)" in md
              and "Broadcast round / push round (1 MiB, 1 worker): "
              "this build %.2fx" % b.get("ratio", 0) in md, md[-2500:])

        # A result dir from before the floor still renders, with n/a.
        old = dict(res)
        for k in ("floor", "server_lcores", "server_eal_lcores",
                  "iteration", "baseline_label"):
            old.pop(k)
        old_dir = os.path.join(out, "old")
        os.makedirs(old_dir)
        with open(os.path.join(old_dir, "bench.json"), "w") as fh:
            json.dump(old, fh)
        r = subprocess.run([sys.executable, BENCH, "--render", old_dir],
                           capture_output=True, text=True, timeout=60)
        floor_rows = [line for line in r.stdout.splitlines()
                      if line.startswith("| 1 MiB | n/a |")]
        check("--render of a result without the floor prints n/a",
              r.returncode == 0 and len(floor_rows) == 1 and
              floor_rows[0].count("n/a") == 5, r.stdout[-1500:] + r.stderr)

    print("%d failed" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
