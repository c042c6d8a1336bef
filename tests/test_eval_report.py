#!/usr/bin/env python3
"""Tests of tools/dblp-eval's guard against disturbed runs: the report
names the runs whose wall time other processes took more than 1.5% of,
and `run` does such a run again (at most --disturbed_retries times).

The report's fixtures are real run.json files of the committed evaluation
(docs/results/issue33/eval/runs), one of them edited as a busy host would
have recorded it. The retry loop runs on fake runs: no testbed, no root.

Run: python3 tests/test_eval_report.py   (or meson test --suite tools)
"""

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)
TOOLS_DIR = os.path.join(REPO, "tools")
RUNS = os.path.join(REPO, "docs", "results", "issue33", "eval", "runs")
sys.path.insert(0, TOOLS_DIR)

import dblp_eval_report as R  # noqa: E402


def load_eval():
    path = os.path.join(TOOLS_DIR, "dblp-eval")
    loader = importlib.machinery.SourceFileLoader("dblp_eval", path)
    spec = importlib.util.spec_from_loader("dblp_eval", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def committed(name):
    with open(os.path.join(RUNS, name, "run.json")) as f:
        return json.load(f)


def foreign_line(report):
    lines = [ln for ln in report.splitlines()
             if ln.startswith("- Other processes' CPU")]
    return lines[0] if lines else None


class DisturbedInReport(unittest.TestCase):
    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="dblp-eval-report-")
        self.addCleanup(shutil.rmtree, self.out)

    def write(self, run):
        d = os.path.join(self.out, "runs", R.run_name(run))
        os.makedirs(d)
        with open(os.path.join(d, "run.json"), "w") as f:
            json.dump(run, f)

    def render(self):
        # The plots are not what is tested: their absence (no matplotlib)
        # or presence changes nothing above them.
        with contextlib.redirect_stdout(io.StringIO()):
            return R.render(self.out)

    def test_a_busy_run_is_named_and_a_quiet_one_is_not(self):
        gloo = committed("resnet18-gloo-clean-s1")
        busy = committed("resnet18-reliable-clean-s1")
        # A build beside the run: 4% of its wall time.
        busy["foreign_cpu_s"] = 0.04 * busy["wall_s"]
        self.write(gloo)
        self.write(busy)
        line = foreign_line(self.render())
        self.assertIsNotNone(line)
        self.assertIn("1 over 1.5%", line)
        self.assertIn("`resnet18-reliable-clean-s1` 4.0%", line)
        self.assertNotIn("resnet18-gloo-clean-s1", line)

    def test_quiet_runs_say_none(self):
        for name in ("resnet18-gloo-burst-s3", "resnet18-dblp-burst-s3"):
            self.write(committed(name))
        line = foreign_line(self.render())
        self.assertIn("none over 1.5%", line)
        self.assertIn("2 of 2 runs", line)

    def test_runs_from_before_the_proc_scan_are_not_judged(self):
        # The CNN grid recorded /proc/stat's busy time less its own, which
        # went negative and positive by tens of seconds: not a measure.
        old = committed("cnn-gloo-tail3-s1")
        self.assertNotIn("kernel_threads_cpu_s", old)
        old["foreign_cpu_s"] = 0.5 * old["wall_s"]
        self.assertIsNone(R.foreign_share(old))
        self.write(old)
        self.write(committed("resnet18-gloo-burst-s3"))
        line = foreign_line(self.render())
        self.assertIn("1 of 2 runs", line)
        self.assertNotIn("cnn-gloo-tail3-s1", line)


class FakeRun:
    """What Run.execute returns, with the foreign CPU a busy host gave."""

    def __init__(self, shares, made):
        self.shares, self.made = shares, made

    def execute(self):
        share = self.shares[len(self.made)]
        self.made.append(share)
        if share is None:
            return None, "exit codes {'server': 1}"
        return {"wall_s": 100.0, "foreign_cpu_s": 100.0 * share,
                "kernel_threads_cpu_s": 1.0}, None


class RunAgainWhenDisturbed(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.E = load_eval()

    def attempt(self, shares, retries=2, limit_pct=1.5):
        made = []
        with contextlib.redirect_stdout(io.StringIO()) as said:
            out, err = self.E.execute_undisturbed(
                lambda: FakeRun(shares, made), retries, limit_pct, "m/s/e 1")
        return out, err, made, said.getvalue()

    def test_a_quiet_run_runs_once(self):
        out, err, made, said = self.attempt([0.006])
        self.assertEqual(made, [0.006])
        self.assertIsNone(err)
        self.assertEqual(said, "")

    def test_a_disturbed_run_runs_again_until_quiet(self):
        out, err, made, said = self.attempt([0.44, 0.02, 0.005])
        self.assertEqual(made, [0.44, 0.02, 0.005])
        self.assertAlmostEqual(out["foreign_cpu_s"], 0.5)
        self.assertEqual(said.count("running it again"), 2)
        self.assertIn("44.0%", said)

    def test_retries_are_bounded_and_the_last_is_kept(self):
        shares = [0.05, 0.04, 0.03, 0.001]
        out, err, made, said = self.attempt(shares, retries=2)
        self.assertEqual(made, shares[:3])
        self.assertAlmostEqual(out["foreign_cpu_s"], 3.0)
        self.assertIn("kept; the report lists it", said)

    def test_the_limit_is_a_flag(self):
        _, _, made, _ = self.attempt([0.02], limit_pct=3)
        self.assertEqual(made, [0.02])

    def test_a_failed_run_is_not_retried_as_disturbed(self):
        out, err, made, said = self.attempt([None, 0.001])
        self.assertEqual(made, [None])
        self.assertIn("exit codes", err)
        self.assertEqual(said, "")

    def test_bad_flags_are_refused_before_anything_runs(self):
        for flags, named in ((["--disturbed_retries", "-1"],
                              "--disturbed_retries=-1"),
                             (["--max_foreign", "0"], "--max_foreign=0.0"),
                             (["--max_foreign", "150"], "--max_foreign=150")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), \
                    self.assertRaises(SystemExit) as ex:
                # A cell that matches nothing: were the flag accepted,
                # `run` would stop at "matches no cell", start nothing,
                # and return 1 instead of exiting 2.
                self.E.main(["run", "--only", "none/none/none",
                             "--prefix", "evtst"] + flags)
            self.assertEqual(ex.exception.code, 2)
            self.assertIn(named, err.getvalue())


if __name__ == "__main__":
    unittest.main()
