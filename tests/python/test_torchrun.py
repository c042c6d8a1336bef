"""torchrun (through tools/dblp-run, torchrun with the backend registered
and the flags Debian's needs) runs examples/ddp_torchrun.py, which has no
line of DBLP's, unchanged but for the backend name:
with 3 ranks under the default policy it trains; with 2 ranks and
--policy=reliable every printed number equals gloo's (two addends: the
float sums do not depend on their order, test_ddp_exact.py)."""

import glob
import json
import os
import subprocess

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def run(tmp_path, backend, env=None, ranks=3, iterations=150):
    if not glob.glob("/usr/share/datasets/fashion-mnist/*.gz"):
        pytest.skip("dataset-fashion-mnist not installed")
    out = tmp_path / f"{backend}-{ranks}-{len(env or {})}"
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(
        [os.path.join(REPO, "tools", "dblp-run"), "--standalone",
         "--nproc-per-node", str(ranks), os.path.join(REPO, "examples",
                                               "ddp_torchrun.py"),
         "--backend", backend, "--iterations", str(iterations),
         "--eval_images", "2000", "--out", str(out)],
        capture_output=True, text=True, timeout=400, env=e)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(out / "result.json") as f:
        result = json.load(f)
    result["output"] = r.stdout + r.stderr
    return result


def test_torchrun_three_ranks_default_policy_trains(tmp_path):
    # 60 steps: 0.46 of the first loss and 0.78 accuracy on the 2-core VM
    # (150 steps took 28 s of CI's time for the same two checks).
    s = run(tmp_path, "dblp", iterations=60)
    assert s["world_size"] == 3 and s["backend"] == "dblp"
    # Rank 0 says what the default policy means, and how to get exact.
    assert "under --policy=dblp (broadcast: consistent)" in s["output"]
    assert "DBLP_SERVER_FLAGS=--policy=reliable" in s["output"]
    assert s["loss_last"] < 0.6 * s["loss_first"], s
    assert s["test_accuracy"] > 0.65, s
    # Nothing left behind by the apps on a clean exit.
    assert not glob.glob("/dev/shm/dblp-[0-9]*")


def test_torchrun_dblp_reliable_equals_gloo(tmp_path):
    # 40 steps: equality holds at every step, and CI time is short.
    gloo = run(tmp_path, "gloo", ranks=2, iterations=40)
    dblp = run(tmp_path, "dblp", {"DBLP_SERVER_FLAGS": "--policy=reliable"},
               ranks=2, iterations=40)
    for k in ("loss_first", "loss_last", "test_accuracy"):
        assert dblp[k] == gloo[k], (k, dblp[k], gloo[k])
    assert "every float arrives" in dblp["output"]
