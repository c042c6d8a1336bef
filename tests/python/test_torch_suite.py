"""PyTorch's own distributed suite on the dblp backend (tools/dblp-torch-
suite; torch_suite.py): the DDP tests that pass on gloo on this host (the
committed full run with gloo beside dblp, docs/results/issue34/
torch-suite.json) run again, one per process, on dblp over memif; each
must pass, or be listed in the tool's KNOWN_DIFFERENCES with its reason.
gloo's own run and dblp over kernel UDP are the committed run (CI time:
tools/dblp-torch-suite --backends dblp-udp reruns UDP)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
BASELINE = os.path.join(REPO, "docs", "results", "issue34",
                        "torch-suite.json")


def ddp_tests_passing_on_gloo():
    with open(BASELINE) as f:
        tests = json.load(f)["tests"]
    return sorted(n for n, r in tests.items()
                  if r.get("gloo", {}).get("result") == "passed" and
                  ("ddp" in n.lower() or "DistributedDataParallel" in n))


def test_torch_ddp_tests_that_pass_on_gloo_pass_on_dblp(tmp_path):
    names = ddp_tests_passing_on_gloo()
    assert len(names) >= 5, names  # the baseline is a real run
    out = tmp_path / "suite.json"
    r = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "dblp-torch-suite"),
         "--select", "^(" + "|".join(names) + ")$", "--out", str(out),
         "--backends", "dblp-memif", "--timeout", "150"],
        capture_output=True, text=True, timeout=3000)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    with open(out) as f:
        got = json.load(f)["tests"]
    for name in names:
        for backend in ("dblp-memif",):
            res = got[name][backend]
            assert res["result"] == "passed", (name, backend, res["tail"])
