#!/usr/bin/env python3
"""tools/dblp-bench end to end, small: testpmd over memif, then a 1 MiB
push-only DBLP job over memif and over kernel UDP at 0% loss, under
Bernoulli loss with p = 0 and with p = 0.05, one pass.

What it checks is what the benchmark promises, not how fast this machine
is: every run produced every measured round; delivered fraction is 1 with
p = 0 (loss or not) and >= 1 - p with p = 0.05; the lossy p = 0 rounds
resent frames; the ratios in the report are computed from the numbers next
to them; usage errors exit 2 naming the fix.

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

    # Usage errors.
    for bad in (["--sizes_mb=abc"], ["--cpus=0"], ["--p=1"],
                ["--build=/nonexistent"]):
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

    print("%d failed" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
