#!/usr/bin/env python3
"""Tests of tools/dblp-experiments and tools/dblp_experiments_lib.py: the
iteration plans (early / middle+final phases), CLR spans from the server's
critical flags, CDFs, normalised training time, the summary tables, the
plots (skipped without matplotlib), and the runner end to end with fake
apps (no DPDK) through tools/dblp-cluster, {worker_dir} included.

Run: python3 tests/test_experiments.py   (or meson test --suite tools)
"""

import csv
import importlib.machinery
import importlib.util
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.join(os.path.dirname(TESTS_DIR), "tools")
sys.path.insert(0, TOOLS_DIR)

import dblp_experiments_lib as X  # noqa: E402

RUNNER = os.path.join(TOOLS_DIR, "dblp-experiments")
SYSTEM_PYTHON = "/usr/bin/python3"


def load_runner():
    loader = importlib.machinery.SourceFileLoader("dblp_experiments", RUNNER)
    spec = importlib.util.spec_from_loader("dblp_experiments", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def write_training(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "iteration", "train_loss", "test_accuracy",
                    "wall_s"])
        for r in rows:
            w.writerow(r)


# ---------------------------------------------------------------------------
# Iteration plans.
# ---------------------------------------------------------------------------

class Plans(unittest.TestCase):
    def test_iterations_per_epoch(self):
        self.assertEqual(X.iterations_per_epoch(3, 64), 312)  # 312.5
        self.assertEqual(X.iterations_per_epoch(1, 100), 600)  # exact
        self.assertEqual(X.iterations_per_epoch(7, 64), 133)   # 133.93
        self.assertEqual(X.iterations_per_epoch(3, 100), 200)  # exact
        self.assertEqual(X.iterations_per_epoch(3, 64, train_images=10), 1)
        with self.assertRaises(ValueError):
            X.iterations_per_epoch(0, 64)

    def test_total_iterations(self):
        self.assertEqual(X.total_iterations(3, 313), (939, False))
        self.assertEqual(X.total_iterations(3, 313, 60), (60, True))
        self.assertEqual(X.total_iterations(3, 313, 5000), (939, False))
        self.assertEqual(X.total_iterations(3, 313, 939), (939, False))

    def test_phase_ranges_full(self):
        ph = X.phase_ranges(939, 313, 3)
        self.assertEqual(ph["early"], (0, 312))   # epoch 0
        self.assertEqual(ph["late"], (313, 938))  # epochs 1..2 to the end
        # The paper's split: 3 early epochs of 9.
        ph = X.phase_ranges(900, 100, 9, early_epochs=3)
        self.assertEqual(ph, {"early": (0, 299), "late": (300, 899)})

    def test_phase_ranges_capped_keep_proportion(self):
        self.assertEqual(X.phase_ranges(60, 313, 2),
                         {"early": (0, 29), "late": (30, 59)})
        self.assertEqual(X.phase_ranges(61, 313, 3),
                         {"early": (0, 19), "late": (20, 60)})
        # Never an empty phase.
        ph = X.phase_ranges(2, 313, 3)
        self.assertEqual(ph, {"early": (0, 0), "late": (1, 1)})

    def test_phase_ranges_errors(self):
        with self.assertRaises(ValueError):
            X.phase_ranges(313, 313, 1)  # one epoch: no later phase
        with self.assertRaises(ValueError):
            X.phase_ranges(1, 313, 3)

    def test_early_late_runs(self):
        runs = X.early_late_runs(939, 313, 3)
        self.assertEqual([r["name"] for r in runs],
                         ["none", "late-40", "late-80", "early-40",
                          "early-80"])
        by = {r["name"]: r for r in runs}
        self.assertIsNone(by["none"]["zero_iters"])
        self.assertEqual(by["none"]["zero_fraction"], 0.0)
        self.assertEqual(by["late-40"]["zero_iters"], (313, 938))
        self.assertEqual(by["late-80"]["zero_fraction"], 0.8)
        self.assertEqual(by["early-80"]["zero_iters"], (0, 312))
        self.assertEqual(by["early-40"]["zero_fraction"], 0.4)
        self.assertEqual(len({r["label"] for r in runs}), 5)

    def test_default_burst_range(self):
        self.assertEqual(X.default_burst_range(939), (10, 938))
        self.assertEqual(X.default_burst_range(20), (5, 19))


# ---------------------------------------------------------------------------
# Latency, CLR spans, CDF.
# ---------------------------------------------------------------------------

class Latency(unittest.TestCase):
    def test_clr_spans(self):
        crit = {0: True, 1: True, 2: False, 3: True, 5: True, 6: True,
                7: False, 8: False}
        self.assertEqual(X.clr_spans(crit), [(0, 1), (3, 3), (5, 6)])
        self.assertEqual(X.clr_spans({}), [])
        self.assertEqual(X.clr_spans({i: False for i in range(9)}), [])
        self.assertEqual(X.clr_spans({i: True for i in range(9)}), [(0, 8)])
        # Insertion order does not matter; the last span is closed.
        crit = {9: True, 4: True, 8: True, 5: False, 3: True}
        self.assertEqual(X.clr_spans(crit), [(3, 4), (8, 9)])

    def test_critical_from_server_rows(self):
        # One row per worker and iteration; any critical row marks it.
        rows = []
        for i in range(30):
            for rank in range(3):
                rows.append({"iteration": i, "rank": rank,
                             "critical": i < 10 or (20 <= i < 25 and
                                                    rank == 1),
                             "p": 0.008 if i < 10 else 0.408})
        crit = X.critical_by_iteration(rows)
        self.assertEqual(len(crit), 30)
        self.assertEqual(X.clr_spans(crit), [(0, 9), (20, 24)])
        # Without `critical`: p below P_high means P_low.
        rows = [{"iteration": i, "p": 0.008 if i % 10 < 3 else 0.408}
                for i in range(20)]
        self.assertEqual(X.clr_spans(X.critical_by_iteration(rows, 0.408)),
                         [(0, 2), (10, 12)])
        self.assertEqual(X.critical_by_iteration(rows), {})

    def test_max_latency_by_iteration(self):
        w0 = [{"iteration": 0, "send_latency_us": 10.0},
              {"iteration": 1, "send_latency_us": 50.0},
              {"iteration": 2, "send_latency_us": None}]
        w1 = [{"iteration": 0, "send_latency_us": 30.0},
              {"iteration": 1, "send_latency_us": 20.0},
              {"iteration": 3, "send_latency_us": float("nan")}]
        self.assertEqual(X.max_latency_by_iteration([w0, w1]),
                         {0: 30.0, 1: 50.0})

    def test_ecdf(self):
        xs, fs = X.ecdf([3, 1, 2, 2])
        self.assertEqual(xs, [1.0, 2.0, 3.0])
        self.assertEqual(fs, [0.25, 0.75, 1.0])
        self.assertEqual(X.ecdf([]), ([], []))
        xs, fs = X.ecdf([None, float("nan"), True, 5])
        self.assertEqual((xs, fs), ([5.0], [1.0]))
        rng = random.Random(3)
        vals = [rng.choice([1, 2, 3, 5, 8]) * 1.5 for _ in range(200)]
        xs, fs = X.ecdf(vals)
        self.assertEqual(xs, sorted(set(vals)))
        for x, f in zip(xs, fs):  # brute force: fraction <= x
            self.assertAlmostEqual(f, sum(v <= x for v in vals) / len(vals))
        self.assertEqual(fs[-1], 1.0)
        self.assertTrue(all(a < b for a, b in zip(fs, fs[1:])))

    def test_microburst_table(self):
        base = {i: 100.0 for i in range(100)}
        other = {i: 80.0 for i in range(100)}
        base[20], other[20] = 1000.0, 200.0
        base[60], other[60] = 900.0, 900.0  # dblp inside a CLR
        t = X.microburst_table(base, other, [20, 60], {20: False, 60: True})
        self.assertEqual([b["iteration"] for b in t["bursts"]], [20, 60])
        self.assertAlmostEqual(t["bursts"][0]["ratio"], 5.0)
        self.assertAlmostEqual(t["bursts"][1]["ratio"], 1.0)
        self.assertIs(t["bursts"][1]["other_critical"], True)
        # p99 nearest rank of 100 values = the 99th smallest.
        self.assertEqual(t["p99"]["base"], 900.0)
        self.assertEqual(t["p99"]["other"], 200.0)
        self.assertAlmostEqual(t["p99"]["ratio"], 4.5)
        self.assertAlmostEqual(t["mean"]["base"], (98 * 100 + 1900) / 100)
        self.assertAlmostEqual(t["mean"]["other"], (98 * 80 + 1100) / 100)
        self.assertAlmostEqual(t["clean_p50"]["ratio"], 1.25)
        missing = X.microburst_table(base, {}, [20])
        self.assertIsNone(missing["bursts"][0]["ratio"])
        self.assertIsNone(missing["p99"]["ratio"])


# ---------------------------------------------------------------------------
# Training results.
# ---------------------------------------------------------------------------

class Training(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-exp-test-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_csv_fraction_and_percent(self):
        p = os.path.join(self.dir, "a", "training.csv")
        write_training(p, [(0, 312, 0.6, 0.81, 10.5), (1, 625, 0.4, 0.855,
                                                         21.0)])
        rows = X.read_training_csv(p)
        self.assertAlmostEqual(rows[0]["test_accuracy"], 81.0)
        self.assertAlmostEqual(rows[1]["test_accuracy"], 85.5)
        self.assertEqual(rows[1]["wall_s"], 21.0)
        q = os.path.join(self.dir, "b", "training.csv")
        write_training(q, [(0, 312, 0.6, 81.0, 10.5), (1, 625, "nan", 85.5,
                                                        "")])
        rows = X.read_training_csv(q)
        self.assertEqual(rows[1]["test_accuracy"], 85.5)
        self.assertIsNone(rows[1]["train_loss"])
        self.assertIsNone(rows[1]["wall_s"])

    def test_csv_names(self):
        d = os.path.join(self.dir, "worker0")
        write_training(os.path.join(d, "training-w2.csv"),
                       [(0, 9, 1.0, 0.5, 1.0)])
        self.assertEqual([os.path.basename(p) for p in X.training_csvs(d)],
                         ["training-w2.csv"])
        write_training(os.path.join(d, "training.csv"),
                       [(0, 9, 1.0, 0.5, 1.0)])
        self.assertEqual([os.path.basename(p) for p in X.training_csvs(d)],
                         ["training.csv"])
        os.makedirs(os.path.join(self.dir, "worker10"))
        os.makedirs(os.path.join(self.dir, "server"))
        self.assertEqual([os.path.basename(p)
                          for p in X.worker_dirs(self.dir)],
                         ["worker0", "worker10"])
        self.assertEqual(len(X.load_training(self.dir)), 1)

    def test_curve_final_time(self):
        w0 = [{"epoch": 0.0, "test_accuracy": 70.0, "wall_s": 10.0},
              {"epoch": 1.0, "test_accuracy": 80.0, "wall_s": 20.0},
              {"epoch": 2.0, "test_accuracy": 84.0, "wall_s": 31.0}]
        w1 = [{"epoch": 0.0, "test_accuracy": 72.0, "wall_s": 11.0},
              {"epoch": 1.0, "test_accuracy": 79.0, "wall_s": 22.0},
              {"epoch": 1.0, "test_accuracy": 82.0, "wall_s": 25.0},
              {"epoch": 2.0, "test_accuracy": 86.0, "wall_s": 33.5}]
        curve = X.accuracy_curve([w0, w1])
        self.assertEqual([e for e, _ in curve], [0.0, 1.0, 2.0])
        self.assertAlmostEqual(curve[0][1], 71.0)
        self.assertAlmostEqual(curve[1][1], 81.0)  # w1's last row of epoch 1
        self.assertAlmostEqual(curve[2][1], 85.0)
        acc = X.final_accuracy([w0, w1])
        self.assertEqual((acc["mean"], acc["min"], acc["max"],
                          acc["workers"]), (85.0, 84.0, 86.0, 2))
        self.assertEqual(X.training_time([w0, w1], 99.0),
                         (33.5, "training.csv wall_s (slowest worker)"))
        t, src = X.training_time([], 12.5)
        self.assertEqual(t, 12.5)
        self.assertIn("process", src)
        self.assertEqual(X.training_time([], None), (None, "unavailable"))
        self.assertEqual(X.final_accuracy([])["mean"], None)

    def test_normalized_time(self):
        n = X.normalize({"fixed": 120.0, "dblp": 100.0})
        self.assertEqual(n, {"fixed": 1.2, "dblp": 1.0})
        n = X.normalize({"fixed": 120.0, "dblp": None})
        self.assertEqual(n, {"fixed": None, "dblp": None})
        n = X.normalize({"fixed": 3.0, "dblp": 0.0})
        self.assertIsNone(n["fixed"])
        # The paper's "23.86% speedup": 1 - t_dblp / t_fixed.
        self.assertAlmostEqual(X.speedup_percent(120.0, 100.0), 100 / 6)
        self.assertAlmostEqual(X.speedup_percent(100.0, 76.14), 23.86)
        self.assertAlmostEqual(X.speedup_percent(100.0, 110.0), -10.0)
        self.assertIsNone(X.speedup_percent(None, 1.0))
        self.assertIsNone(X.speedup_percent(0.0, 1.0))


class Tables(unittest.TestCase):
    def test_md_table(self):
        t = X.md_table(["a", "b"], [["x|y", 1.5], ["z", None]])
        self.assertEqual(t, "| a | b |\n|:---|---:|\n| x\\|y | 1.5 |\n"
                            "| z | None |\n")
        with self.assertRaises(ValueError):
            X.md_table(["a", "b"], [["only one"]])
        self.assertEqual(X.fmt(None), "-")
        self.assertEqual(X.fmt(float("nan")), "-")
        self.assertEqual(X.fmt(2.345, "{:.2f}x"), "2.35x")

    def test_accuracy_table_rows(self):
        R = load_runner()
        acc = lambda m: {"mean": m, "min": m, "max": m, "workers": 3}  # noqa
        results = {
            ("cnn", "bursts"): {
                "fixed": {"acc": acc(88.0), "time": 120.0, "src": "s"},
                "dblp": {"acc": acc(87.12), "time": 100.0, "src": "s"}},
            ("cnn", "clean"): {
                "fixed": {"acc": acc(88.5), "time": 110.0, "src": "s"},
                "dblp": {"acc": acc(88.5), "time": 110.0, "src": "s"}},
        }
        rows = R.accuracy_table_rows(results, ["cnn", "mlp"])
        self.assertEqual(len(rows), 4)
        self.assertEqual(rows[0], ["cnn", "with bursts", "fixed", "88.00",
                                   "100.00%", "120.0", "1.200", ""])
        self.assertEqual(rows[1], ["cnn", "with bursts", "dblp", "87.12",
                                   "99.00%", "100.0", "1.000", "16.7%"])
        self.assertEqual(rows[3][5:], ["110.0", "1.000", "0.0%"])
        self.assertEqual(rows[2][6], "1.000")


# ---------------------------------------------------------------------------
# Plots.
# ---------------------------------------------------------------------------

@unittest.skipUnless(X.have_matplotlib(), "matplotlib not installed")
class Plots(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-exp-plot-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def assertPng(self, path):
        with open(path, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(path), 5000)

    def test_all_plots(self):
        p = X.plot_accuracy_curves(
            {"no loss": [(0, 70.0), (1, 80.0), (2, 84.0)],
             "80% early": [(0, 50.0), (1, 70.0), (2, 78.0)],
             "empty": []}, os.path.join(self.dir, "acc.png"), title="t")
        self.assertPng(p)
        lat = {i: 400.0 + (3000.0 if i in (20, 45) else 0) for i in range(60)}
        p = X.plot_latency({"fixed": lat, "dblp": {i: v / 2 for i, v in
                                                   lat.items()}},
                           os.path.join(self.dir, "lat.png"),
                           spans=[(0, 9), (30, 39)], bursts=[20, 45])
        self.assertPng(p)
        p = X.plot_cdf({"fixed": list(lat.values()), "dblp": []},
                       os.path.join(self.dir, "cdf.png"))
        self.assertPng(p)
        p = X.plot_normalized_times(
            {"cnn\nbursts": {"fixed": 1.2, "dblp": 1.0},
             "cnn\nno bursts": {"fixed": None, "dblp": 1.0}},
            os.path.join(self.dir, "bars.png"))
        self.assertPng(p)


# ---------------------------------------------------------------------------
# The runner: command lines, analysis of fixture runs, a fake-app job.
# ---------------------------------------------------------------------------

class RunnerCommands(unittest.TestCase):
    def test_quick_defaults_and_overrides(self):
        R = load_runner()
        a = R.parse_args(["all", "--quick"])
        self.assertEqual((a.model, a.model_list, a.epochs,
                          a.early_late_epochs, a.max_iterations),
                         ("mlp", ["mlp"], 1, 2, 60))
        a = R.parse_args(["early-late", "--quick", "--epochs", "3",
                          "--model", "cnn"])
        self.assertEqual((a.model, a.early_late_epochs), ("cnn", 3))
        a = R.parse_args(["accuracy"])
        self.assertEqual((a.model_list, a.epochs, a.bursts, a.p_high),
                         (["cnn", "mlp"], 3, 2, 0.408))

    def test_usage_errors(self):
        for bad in (["early-late", "--epochs", "1"],
                    ["microburst", "--model", "vgg"],
                    ["accuracy", "--p_low", "0.7"],
                    ["early-late", "--fractions", "0,0.4"],
                    []):
            p = subprocess.run([sys.executable, RUNNER, *bad, "--dry_run"]
                               if bad else [sys.executable, RUNNER],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, (bad, p.stderr))

    def test_cluster_argv(self):
        R = load_runner()
        a = R.parse_args(["microburst", "--link_gbps", "2.5", "--workers",
                          "3", "--batch", "32"])
        run = R.Run("cluster", "/o/cluster", policies=["fixed", "dblp"],
                    iterations=939, floats=80602, bursts=2,
                    server_flags=["--zero_fraction=0.4", "--zero_iters=0,9"],
                    worker_flags=R.training_worker_flags(a, "cnn"))
        argv = R.cluster_argv(a, run)
        self.assertEqual(argv[-3:], ["--", "--link_gbps=2.5",
                                     "--round_timeout_ms=300000"])
        for want in ("--burst_random", "--burst_seed", "--p_fixed"):
            self.assertIn(want, argv)
        i = argv.index("--p_high")
        self.assertEqual(argv[i + 1], "0.408")
        wf = [x for x in argv if x.startswith("--worker_flags=")][0]
        self.assertIn("--train_log_dir={worker_dir}", wf)
        self.assertIn("--gradient=train --model=cnn", wf)
        self.assertIn("--batch=32", wf)
        sf = [x for x in argv if x.startswith("--server_flags=")][0]
        self.assertEqual(sf, "--server_flags=--zero_fraction=0.4 "
                             "--zero_iters=0,9")
        run.bursts = 0
        self.assertIn("--burst_iters=", R.cluster_argv(a, run))
        self.assertIn("--no_realtime", argv)  # training: no SCHED_FIFO
        a = R.parse_args(["microburst", "--gradient", "synthetic"])
        self.assertEqual(R.training_worker_flags(a, "cnn"),
                         ["--gradient=synthetic"])
        self.assertNotIn("--no_realtime", R.cluster_argv(a, run))
        a = R.parse_args(["microburst", "--realtime"])
        self.assertNotIn("--no_realtime", R.cluster_argv(a, run))
        a = R.parse_args(["microburst", "--gradient", "synthetic",
                          "--no_realtime"])
        self.assertIn("--no_realtime", R.cluster_argv(a, run))

    def test_dry_run_early_late(self):
        p = subprocess.run([sys.executable, RUNNER, "early-late", "--dry_run",
                            "--out", "/nonexistent/x"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 5)
        self.assertNotIn("zero_fraction", lines[0])
        self.assertIn("--zero_fraction=0.4 --zero_iters=312,935", lines[1])
        self.assertIn("--zero_fraction=0.8 --zero_iters=312,935", lines[2])
        self.assertIn("--zero_fraction=0.4 --zero_iters=0,311", lines[3])
        self.assertIn("--zero_fraction=0.8 --zero_iters=0,311", lines[4])
        for ln in lines:
            self.assertIn("--policies reliable", ln)
            self.assertIn("--iterations 936", ln)  # 3 epochs x 312
        self.assertFalse(os.path.exists("/nonexistent/x"))


def make_fake_build(root):
    apps = os.path.join(root, "build", "apps")
    os.makedirs(apps)
    for role in ("server", "worker"):
        path = os.path.join(apps, f"dblp-{role}")
        with open(path, "w") as f:
            f.write(FAKE_APP.format(python=sys.executable, role=role))
        os.chmod(path, 0o755)
    return os.path.join(root, "build")


def fixture_policy(pdir, policy, iterations, *, bursts=(), clr=(),
                   lat_clean=1000.0, lat_burst=5000.0, lat_burst_clr=None,
                   acc=(70.0, 80.0), wall=(50.0, 60.0), norm=lambda i: 5.0,
                   workers=2):
    """One policy's output as the apps write it (2 workers)."""
    for w in range(workers):
        rows = []
        for i in range(iterations):
            b = i in bursts
            lat = lat_clean
            if b:
                lat = lat_burst_clr if (lat_burst_clr and i in clr) else \
                    lat_burst
            rows.append({"iteration": i, "rank": w,
                         "send_latency_us": lat + 100.0 * w,
                         "passes": 3 if b else 1, "packets_sent": 100,
                         "p": 0.408, "critical": False, "grad_norm": 0.0,
                         "burst": b})
        write_jsonl(os.path.join(pdir, f"worker{w}", "iterations.jsonl"),
                    rows)
        write_training(os.path.join(pdir, f"worker{w}", "training.csv"),
                       [(e, (e + 1) * 10 - 1, 0.5, a + w, wall[w] * (e + 1)
                         / len(acc)) for e, a in enumerate(acc)])
    srows = [{"iteration": i, "rank": w, "critical": i in clr,
              "grad_norm": norm(i), "p": 0.008 if i in clr else 0.408}
             for i in range(iterations) for w in range(workers)]
    write_jsonl(os.path.join(pdir, "server", "iterations.jsonl"), srows)


def fixture_launch(run_dir, policies, seconds=30.0, failed=False):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "launch.json"), "w") as f:
        json.dump({"params": {"command": f"tools/dblp-cluster --out {run_dir}"},
                   "status": {p: {"failed": failed, "seconds": seconds}
                              for p in policies}}, f)
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write("# DBLP local cluster report\nfixture\n")


class RunnerAnalysis(unittest.TestCase):
    """Fixture runs on disk + --resume: the runner only analyses."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-exp-runner-")
        self.build = make_fake_build(self.dir)
        self.out = os.path.join(self.dir, "out")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_runner(self, *args):
        env = dict(os.environ, DBLP_EXPERIMENTS_REEXEC="1")
        return subprocess.run(
            [sys.executable, RUNNER, *args, "--build", self.build, "--out",
             self.out, "--resume", "--workers", "2", "--max_iterations",
             "40"], capture_output=True, text=True, timeout=120, env=env)

    def read(self, *parts):
        with open(os.path.join(self.out, *parts)) as f:
            return f.read()

    def test_microburst_summary(self):
        run = os.path.join(self.out, "microburst", "runs", "cluster")
        fixture_launch(run, ["fixed", "dblp"])
        clr = set(range(0, 10)) | set(range(28, 34))
        fixture_policy(os.path.join(run, "fixed"), "fixed", 40,
                       bursts=(15, 30), lat_burst=5000.0,
                       acc=(70.0, 80.0), wall=(100.0, 120.0))
        fixture_policy(os.path.join(run, "dblp"), "dblp", 40,
                       bursts=(15, 30), clr=clr, lat_clean=800.0,
                       lat_burst=2000.0, lat_burst_clr=5000.0,
                       acc=(69.0, 79.0), wall=(90.0, 100.0))
        p = self.run_runner("microburst", "--link_gbps", "2.5", "--epochs",
                            "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = self.read("microburst", "summary.md")
        self.assertIn("tools/dblp-experiments microburst --link_gbps 2.5 "
                      "--epochs 1 --build", s)
        self.assertIn("link rate: 2.5 Gb/s", s)
        self.assertIn("| 15 | 5100.0 | 2100.0 | 2.43x | no (P_high) |", s)
        self.assertIn("| 30 | 5100.0 | 5100.0 | 1.00x | yes (P_low) |", s)
        self.assertIn("| spike (worst burst) latency | 5100.0 | 5100.0 | "
                      "1.00x |", s)
        self.assertIn("| clean p50 | 1100.0 | 900.0 | 1.22x |", s)
        self.assertIn("dblp spent 16 of 40 iterations (40.0%) in a CLR "
                      "(2 span(s))", s)
        self.assertIn("| fixed | 80.50 (80.00-81.00) | 120.0 |", s)
        self.assertIn("| dblp | 79.50 (79.00-80.00) | 100.0 |", s)
        self.assertIn("tools/dblp-cluster --out", s)
        self.assertEqual(self.read("microburst", "report.md"),
                         "# DBLP local cluster report\nfixture\n")
        with open(os.path.join(self.out, "microburst",
                               "latency_per_iteration.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 40)
        self.assertEqual(rows[15]["burst"], "1")
        self.assertEqual(rows[29]["dblp_critical"], "1")
        self.assertEqual(rows[15]["fixed_us"], "5100.0")
        if X.have_matplotlib():
            for png in ("latency.png", "cdf.png"):
                self.assertTrue(os.path.isfile(
                    os.path.join(self.out, "microburst", png)))
                self.assertIn(f"]({png})", s)

    def test_accuracy_summary(self):
        for cond, walls in (("bursts", ((100.0, 120.0), (90.0, 100.0))),
                            ("clean", ((100.0, 110.0), (100.0, 110.0)))):
            run = os.path.join(self.out, "accuracy", "runs", f"mlp-{cond}")
            fixture_launch(run, ["fixed", "dblp"])
            fixture_policy(os.path.join(run, "fixed"), "fixed", 40,
                           acc=(70.0, 80.0), wall=walls[0])
            fixture_policy(os.path.join(run, "dblp"), "dblp", 40,
                           acc=(70.0, 79.2), wall=walls[1])
        p = self.run_runner("accuracy", "--models", "mlp")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = self.read("accuracy", "summary.md")
        self.assertIn("| mlp | with bursts | fixed | 80.50 (80.00-81.00) | "
                      "100.00% | 120.0 | 1.200 |  |", s)
        self.assertIn("| mlp | with bursts | dblp | 79.70 (79.20-80.20) | "
                      "99.01% | 100.0 | 1.000 | 16.7% |", s)
        self.assertIn("| mlp | no bursts | dblp | 79.70 (79.20-80.20) | "
                      "99.01% | 110.0 | 1.000 | 0.0% |", s)
        self.assertIn("training.csv wall_s (slowest worker)", s)
        self.assertIn("link rate: 1 Gb/s", s)
        with open(os.path.join(self.out, "accuracy", "accuracy.csv")) as f:
            self.assertEqual(len(list(csv.reader(f))), 5)

    def test_tradeoff_summary(self):
        # reliable, fixed and consistent, seeds 1 and 2, with and without
        # bursts.
        for cond in ("bursts", "clean"):
            for seed, top in ((1, 80.0), (2, 82.0)):
                for config, policy, dacc, wall, lat in (
                        ("reliable", "reliable", 1.0, (110.0, 130.0), 9000.0),
                        ("fixed", "fixed", 0.0, (100.0, 120.0), 5000.0),
                        ("consistent", "dblp", -0.5, (80.0, 90.0), 2000.0)):
                    run = os.path.join(self.out, "tradeoff", "runs",
                                       f"mlp-{cond}-s{seed}-{config}")
                    fixture_launch(run, [policy])
                    pdir = os.path.join(run, policy)
                    fixture_policy(pdir, policy, 40,
                                   bursts=(15,) if cond == "bursts" else (),
                                   lat_burst=lat, acc=(70.0, top + dacc),
                                   wall=wall)
                    # The server's broadcast rounds; a resync row whose
                    # latency must stay out of the statistics.
                    srows = [{"iteration": i, "rank": w,
                              "bcast_latency_us": 300.0 + i,
                              "resync": False}
                             for i in range(40) for w in range(2)]
                    srows.append({"iteration": 40, "rank": 0,
                                  "bcast_latency_us": 1e9, "resync": True})
                    write_jsonl(os.path.join(pdir, "server",
                                             "iterations.jsonl"), srows)
        p = self.run_runner("tradeoff", "--models", "mlp", "--configs",
                            "reliable,fixed,consistent", "--seeds", "1,2",
                            "--long_epochs", "0")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = self.read("tradeoff", "summary.md")
        # Accuracy: seed means 81.5 and 83.5 (reliable), 80.5 and 82.5
        # (fixed), 80.0 and 82.0; the 95% interval of two seeds 2 apart:
        # t(1) = 12.71 times sd / sqrt(2) = 1.
        # Push mean: 39 clean iterations at 1100 us and the burst (5100,
        # 2100); bcast: 300 + i (the resync row's 1e9 left out), its spike
        # at the burst iteration 15.
        self.assertIn("| with bursts | fixed | 81.50 ± 12.71 (80.50-82.50) "
                      "|  | -1.00 ± 0.00 | 120.0 | 1.000 | 1200 | 5100 | 5100 | 1.00x | 320 | "
                      "339 | 315 |", s)
        self.assertIn("| with bursts | consistent | "
                      "81.00 ± 12.71 (80.00-82.00) | -0.50 | -1.50 ± 0.00 | 90.0 | "
                      "0.750 | 1125 | "
                      "2100 | 2100 | 2.43x | 320 | 339 | 315 |", s)
        self.assertIn("| no bursts | consistent | "
                      "81.00 ± 12.71 (80.00-82.00) | -0.50 | -1.50 ± 0.00 | 90.0 | "
                      "0.750 | 1100 | "
                      "1100 | 1100 | 1.00x |", s)
        self.assertIn("| no bursts | reliable | 82.50 ± 12.71 (81.50-83.50) "
                      "| +1.00 |  | 130.0 | 1.083 |", s)
        self.assertIn("`--push_fill=rescale --bcast_tolerance=consistent`",
                      s)
        self.assertTrue(os.path.isfile(os.path.join(
            self.out, "tradeoff", "tradeoff_mlp.csv")))
        if X.have_matplotlib():
            self.assertIn("](tradeoff_mlp.png)", s)

    def test_early_late_summary(self):
        # --epochs 2 --max_iterations 40: early 0-19, late 20-39.
        base = lambda i: 10.0 - i * 0.1  # noqa: E731
        for name, f, rng in (("none", 0, None), ("late-40", 0.4, (20, 39)),
                             ("late-80", 0.8, (20, 39)),
                             ("early-40", 0.4, (0, 19)),
                             ("early-80", 0.8, (0, 19))):
            run = os.path.join(self.out, "early-late", "runs", name)
            fixture_launch(run, ["reliable"])
            norm = (lambda i, f=f, rng=rng: base(i) * (
                math.sqrt(1 - f) if rng and rng[0] <= i <= rng[1] else 1.0))
            final = {"none": 85.0, "late-40": 84.5, "late-80": 84.0,
                     "early-40": 80.0, "early-80": 75.0}[name]
            fixture_policy(os.path.join(run, "reliable"), "reliable", 40,
                           acc=(final - 10, final), norm=norm)
        p = self.run_runner("early-late", "--epochs", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = self.read("early-late", "summary.md")
        self.assertIn("phases: early = iterations 0-19 (epoch 0), "
                      "middle+final = 20-39", s)
        self.assertIn("| no loss | 0% | - | 85.50 (85.00-86.00) |", s)
        self.assertIn("| 80% zeroed, early only | 80% | 0-19 | "
                      "75.50 (75.00-76.00) | 60.0 | 0.447 (sqrt(1-F) = "
                      "0.447) | ok |", s)
        self.assertIn("| 40% zeroed, middle+final | 40% | 20-39 |", s)
        self.assertIn("0.775 (sqrt(1-F) = 0.775)", s)
        with open(os.path.join(self.out, "early-late",
                               "accuracy_per_epoch.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 10)  # 5 runs x 2 epochs
        self.assertEqual(rows[0]["run"], "none")
        self.assertEqual(rows[1]["test_accuracy_pct"], "85.5")
        self.assertEqual(self.read("early-late", "final_accuracy.md")
                         .count("\n"), 7)

    def test_failed_run_is_reported(self):
        run = os.path.join(self.out, "microburst", "runs", "cluster")
        fixture_launch(run, ["fixed", "dblp"], failed=True)
        fixture_policy(os.path.join(run, "fixed"), "fixed", 40)
        fixture_policy(os.path.join(run, "dblp"), "dblp", 40)
        # --resume re-runs a failed run: the fake apps make it succeed,
        # and the failed attempt is kept aside.
        p = self.run_runner("microburst", "--epochs", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.isdir(run + ".failed-1"))
        self.assertIn("`cluster` (ok;", self.read("microburst", "summary.md"))

    def test_refuses_existing_out_without_resume(self):
        os.makedirs(os.path.join(self.out, "accuracy", "x"))
        p = subprocess.run([sys.executable, RUNNER, "accuracy", "--build",
                            self.build, "--out", self.out],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--resume", p.stderr)


# Fake dblp-server / dblp-worker: the server writes rows with CLR flags, a
# worker writes iterations and, given --train_log_dir, its training CSV
# there (named like the real worker's).
FAKE_APP = textwrap.dedent(r'''
    #!{python}
    import json, os, sys, time
    role = "{role}"
    argv = sys.argv[1:]
    app = argv[argv.index("--") + 1:]
    flags = dict(a[2:].split("=", 1) for a in app if "=" in a)
    out = flags["out_dir"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "argv.json"), "w") as f:
        json.dump(argv, f)
    if role == "server":
        print("dblp-server: waiting for %s workers on %s" %
              (flags["workers"], flags["listen"]), flush=True)
        root = os.path.dirname(out)
        n = int(flags["workers"])
        for _ in range(400):
            if all(os.path.exists(os.path.join(root, "worker%d" % i,
                                               "summary.json"))
                   for i in range(n)):
                break
            time.sleep(0.05)
        its = max(len(open(os.path.join(root, "worker%d" % i,
                                        "iterations.jsonl")).readlines())
                  for i in range(n))
        with open(os.path.join(out, "iterations.jsonl"), "w") as f:
            for i in range(its):
                for r in range(n):
                    crit = flags["policy"] == "dblp" and i < 10
                    f.write(json.dumps({{"iteration": i, "rank": r,
                        "critical": crit, "grad_norm": 3.0,
                        "p": 0.008 if crit else 0.408}}) + "\n")
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump({{"counters": {{}}, "info": {{"chunks": "56"}}}}, f)
        sys.exit(0)
    burst = 12 if flags.get("burst_random") else -1
    its = int(flags["iterations"])
    with open(os.path.join(out, "iterations.jsonl"), "w") as f:
        for i in range(its):
            f.write(json.dumps({{"iteration": i, "rank": 0,
                "send_latency_us": 4000.0 if i == burst else 500.0,
                "passes": 3 if i == burst else 1, "packets_sent": 56,
                "p": 0.408, "burst": i == burst}}) + "\n")
    if "train_log_dir" in flags:
        os.makedirs(flags["train_log_dir"], exist_ok=True)
        with open(os.path.join(flags["train_log_dir"], "training-w0.csv"),
                  "w") as f:
            f.write("epoch,iteration,train_loss,test_accuracy,wall_s\n")
            f.write("0,%d,0.7,0.%d,%s\n" % (its - 1, 70 + len(out) % 7,
                                             12.5))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({{"us_per_packet_clean": 1.0, "control_rtt_us": 20.0,
                   "counters": {{}}, "info": {{"chunks": "56"}}}}, f)
''').lstrip()


class RunnerEndToEnd(unittest.TestCase):
    """dblp-experiments -> dblp-cluster -> fake apps: {worker_dir} reaches
    each worker, training.csv lands in its own dir, the summary reads it."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-exp-e2e-")
        self.build = make_fake_build(self.dir)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_microburst_with_fake_apps(self):
        out = os.path.join(self.dir, "out")
        env = dict(os.environ, DBLP_EXPERIMENTS_REEXEC="1")
        p = subprocess.run(
            [sys.executable, RUNNER, "microburst", "--build", self.build,
             "--out", out, "--workers", "2", "--epochs", "1",
             "--max_iterations", "30", "--model", "cnn", "--no_realtime"],
            capture_output=True, text=True, timeout=180, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        run = os.path.join(out, "microburst", "runs", "cluster")
        for pol in ("fixed", "dblp"):
            for w in range(2):
                wd = os.path.join(run, pol, f"worker{w}")
                self.assertTrue(os.path.isfile(
                    os.path.join(wd, "training-w0.csv")))
                with open(os.path.join(wd, "argv.json")) as f:
                    argv = json.load(f)
                self.assertIn(f"--train_log_dir={wd}", argv)
                self.assertFalse(any(a.startswith("--floats") for a in argv))
                self.assertIn("--gradient=train", argv)
                self.assertIn("--model=cnn", argv)
                self.assertIn("--link_gbps=1", argv)
            with open(os.path.join(run, pol, "server", "argv.json")) as f:
                srv = json.load(f)
            self.assertFalse(any("log_dir" in a for a in srv))
            self.assertIn("--link_gbps=1", srv)
        with open(os.path.join(out, "microburst", "summary.md")) as f:
            s = f.read()
        self.assertIn("| 12 | 4000.0 | 4000.0 | 1.00x | no (P_high) |", s)
        self.assertIn("dblp spent 10 of 30 iterations", s)
        self.assertIn("training.csv wall_s", s)
        self.assertIn("| fixed |", s)
        self.assertTrue(os.path.isfile(os.path.join(out, "microburst",
                                                    "report.md")))


if __name__ == "__main__":
    # Under a python3 without matplotlib (a pyenv shim, say), re-run with
    # Debian's, which has python3-matplotlib, so the plot tests run too.
    if (not X.have_matplotlib() and os.path.isfile(SYSTEM_PYTHON)
            and not os.environ.get("DBLP_TEST_REEXEC")
            and os.path.realpath(sys.executable)
            != os.path.realpath(SYSTEM_PYTHON)
            and subprocess.run([SYSTEM_PYTHON, "-c", "import matplotlib"],
                               capture_output=True).returncode == 0):
        os.execve(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)]
                  + sys.argv[1:], dict(os.environ, DBLP_TEST_REEXEC="1"))
    unittest.main(verbosity=2)
