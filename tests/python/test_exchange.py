"""The whole exchange's set-up on a small host, and its benchmark:

- a server's lcore claim keeps a CPU of its own while there is one: the
  workers go to the other CPUs, and a second server to the CPU with the
  fewest servers (python/dblp/_lcores.py);
- LocalServer(shards=) refuses what it cannot start;
- tools/dblp-exchange-bench runs gloo, DBLP over memif with 1 and W server
  shards and over kernel UDP (allreduce_), small, and every
  DBLP mean it checks is exact; its table and "Done when" lines are
  printed from the numbers it measured.

Run by meson (suite python) like test_torch_worker.py.
"""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import dblp  # noqa: E402
from dblp import _lcores  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_a_server_keeps_a_cpu_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(_lcores, "CLAIM_DIR", str(tmp_path))
    monkeypatch.setattr(_lcores.os, "sched_getaffinity", lambda pid: {0, 1})
    claims = []
    try:
        server = _lcores.claim_lcore(server=True)
        claims.append(server)
        workers = [_lcores.claim_lcore() for _ in range(3)]
        claims += workers
        assert server.cpu == 0
        # Three workers on the other CPU rather than beside the server.
        assert [w.cpu for w in workers] == [1, 1, 1]
        second = _lcores.claim_lcore(server=True)
        claims.append(second)
        assert second.cpu == 1  # one server per CPU first
        third = _lcores.claim_lcore()
        claims.append(third)
        # Every CPU has a server now: the fewest claims.
        assert third.cpu == 0
    finally:
        for c in claims:
            c.release()
    assert os.listdir(tmp_path) in ([], [".lock"])


def test_local_server_shards_need_memif():
    with pytest.raises(ValueError, match="shards"):
        dblp.LocalServer(2, "udp", shards=2)
    with pytest.raises(ValueError, match="shards"):
        dblp.LocalServer(2, "dpdk", shards=0)


def test_exchange_bench_runs_every_configuration(tmp_path):
    out = tmp_path / "x.json"
    build = os.path.dirname(os.environ["DBLP_APPS"])
    r = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "dblp-exchange-bench"),
         "--workers", "1,2", "--shards", "1,W", "--size_mb", "1",
         "--iters", "3", "--warmup", "1", "--reps", "1", "--udp",
         "--modes", "allreduce_",
         "--build", build, "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    names = {(row["config"], row["workers"]) for row in res["rows"]}
    for W in (1, 2):
        assert ("gloo", W) in names
        assert ("dblp dpdk S=1 allreduce_", W) in names
        assert ("dblp udp S=1 allreduce_", W) in names
    assert ("dblp dpdk S=2 allreduce_", 2) in names
    for row in res["rows"]:
        assert row["ms"] > 0 and row["cpu_s"] > 0, row
        if row["config"] != "gloo":
            assert row["exact"] and row["max_abs_error"] == 0, row
            assert row["push_ms"] > 0 and row["bcast_ms"] > 0, row
            # /proc counts in clock ticks (10 ms): a 1 MiB run may show 0.
            assert row["server_cpu_s"] >= 0 and row["worker_cpu_s"] >= 0, row
    assert "exact means: every run" in r.stdout
    assert "at W=2 / gloo all_reduce" in r.stdout
    assert "broadcast at W=2 / at W=1" in r.stdout


def test_dblp_shards_env_is_checked(monkeypatch):
    import dblp.distributed as dd
    for bad in ("0", "-1", "two", ""):
        monkeypatch.setenv("DBLP_SHARDS", bad)
        with pytest.raises(dblp.DblpError, match="DBLP_SHARDS"):
            dd._shards_from_env()
    monkeypatch.setenv("DBLP_SHARDS", "3")
    assert dd._shards_from_env() == 3
    monkeypatch.delenv("DBLP_SHARDS")
    assert dd._shards_from_env() == 1
