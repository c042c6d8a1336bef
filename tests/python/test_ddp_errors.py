"""How DBLP's failures reach a DDP training script: as dblp.DblpError out of
loss.backward() (catchable, DDP left consistent), and at registration for a
model it cannot move."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import dblp  # noqa: E402
import dblp.distributed  # noqa: E402
import dblp.torch  # noqa: E402
import ddp_cases  # noqa: E402

W = 2


def crashing_rank(rank, port, kwargs, leave_rank, leave_at):
    """Rank `leave_rank` exits without a word at step `leave_at`; the other
    reports what its backward raised, and that DDP still runs a step."""
    ddp_cases.set_threads()
    ddp_cases.init_gloo(rank, W, port)
    model = ddp_cases.make_model("many")
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, **ddp_cases.DDP_OPTIONS["many"])
    w = dblp.Worker(model=model, **kwargs[rank])
    ddp.register_comm_hook(w, dblp.torch.comm_hook)
    t0 = time.monotonic()
    for step in range(100):
        if rank == leave_rank and step == leave_at:
            os._exit(0)
        x, y = ddp_cases.batch("many", 1, rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        try:
            loss.backward()
        except dblp.DblpError as e:
            # DDP finished its reduction: another backward runs (no DBLP
            # here: the hook raises at once, the worker being broken).
            try:
                x, y = ddp_cases.batch("many", 1, rank, step + 1)
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                second = "no error"
            except dblp.DblpError as e2:
                second = str(e2)
            return dict(step=step, error=str(e), second=second,
                        seconds=time.monotonic() - t0)
    return dict(step=None)


def test_peer_crash_is_a_dblp_error_out_of_backward():
    with dblp.LocalServer(W, "dpdk", ["--policy=reliable",
                                      "--resync_every=0"]) as srv:
        kw = [srv.worker_kwargs(r) for r in range(W)]
        res = ddp_cases.run_ranks(W, crashing_rank,
                                  (ddp_cases.free_port_pair(), kw, 1, 5),
                                  expect=[0])
    r = res[0]
    assert "trace" not in r, r.get("trace")
    assert r["step"] == 5, r
    assert "exited" in r["error"] and "w1" in r["error"], r["error"]
    assert "out of step" in r["second"] or "failed" in r["second"], r
    assert r["seconds"] < 30, r


class Half(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2).double()


def test_non_float32_model_refused_at_registration():
    with pytest.raises(TypeError, match=r"'b.weight' is torch.float64"):
        dblp.Worker(model=Half(), insecure=True, server="127.0.0.1:1")


def mismatched_rank(rank, port, kwargs):
    ddp_cases.set_threads()
    ddp_cases.init_gloo(rank, W, port)
    model = ddp_cases.make_model("one")
    t0 = time.monotonic()
    try:
        dblp.Worker(model=model, **kwargs[rank])
        out = dict(error=None)
    except dblp.DblpError as e:
        out = dict(message=str(e), seconds=time.monotonic() - t0)
    torch.distributed.barrier()  # rank 0 holds the store: leave together
    return out


def test_world_size_mismatch_fails_fast_naming_both():
    with dblp.LocalServer(W + 1, "dpdk", ["--policy=reliable"]) as srv:
        kw = [srv.worker_kwargs(r) for r in range(W)]
        res = ddp_cases.run_ranks(W, mismatched_rank,
                                  (ddp_cases.free_port_pair(), kw))
    for r in range(W):
        assert "message" in res[r], res[r]
        m = res[r]["message"]
        assert "expects 3 workers" in m and "has 2 ranks" in m, m
        assert res[r]["seconds"] < 10, res[r]


def pausing_rank(rank, port, kwargs, pause_s):
    ddp_cases.set_threads()
    ddp_cases.init_gloo(rank, W, port)
    model = ddp_cases.make_model("one")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    w = dblp.Worker(model=model, **kwargs[rank])
    ddp.register_comm_hook(w, dblp.torch.comm_hook)
    for step in range(6):
        if rank == 1 and step == 3:
            time.sleep(pause_s)  # an evaluation, a checkpoint
        x, y = ddp_cases.batch("one", 1, rank, step)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    w.close()
    return dict(steps=len(w.history))


def test_a_60s_pause_survives_the_default_timeout():
    with dblp.LocalServer(W, "dpdk", ["--policy=reliable"]) as srv:
        kw = [srv.worker_kwargs(r) for r in range(W)]
        res = ddp_cases.run_ranks(W, pausing_rank,
                                  (ddp_cases.free_port_pair(), kw, 60.0))
        assert srv.wait(60) == 0, srv.log_tail()
    for r in range(W):
        assert res[r].get("steps") == 6, res[r]


def odd_model_rank(rank, port, kwargs):
    """Rank 1 builds another model; through the hook (kwargs) or the dblp
    backend (kwargs None), every rank must fail at once, naming both. Under
    the backend DDP's own check (torch's) speaks first: no server starts."""
    ddp_cases.set_threads()
    t0 = time.monotonic()
    if kwargs is None:
        os.environ["DBLP_SERVER_FLAGS"] = "--policy=reliable"
        dblp.distributed.register()
        torch.distributed.init_process_group(
            "dblp", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
            world_size=W)
    else:
        ddp_cases.init_gloo(rank, W, port)
    model = ddp_cases.make_model("one" if rank == 0 else "several")
    try:
        if kwargs is None:
            torch.nn.parallel.DistributedDataParallel(model)
        else:
            dblp.Worker(model=model, **kwargs[rank])
        out = dict(error=None)
    except (dblp.DblpError, RuntimeError) as e:
        out = dict(message=str(e), seconds=time.monotonic() - t0,
                   kind=type(e).__name__)
    torch.distributed.barrier()
    return out


@pytest.mark.parametrize("path", ["hook", "backend"])
def test_model_mismatch_fails_fast_naming_both(path):
    port = ddp_cases.free_port_pair()
    if path == "hook":
        with dblp.LocalServer(W, "dpdk", ["--policy=reliable"]) as srv:
            kw = [srv.worker_kwargs(r) for r in range(W)]
            res = ddp_cases.run_ranks(W, odd_model_rank, (port, kw))
    else:
        res = ddp_cases.run_ranks(W, odd_model_rank, (port, None))
    for r in range(W):
        assert "message" in res[r], res[r]
        m = res[r]["message"]
        if path == "hook":
            assert res[r]["kind"] == "DblpError"
            assert "rank 0 has 27596" in m and "rank 1 329058" in m, m
        else:
            assert "6 params" in m and "8 params" in m, m
        assert res[r]["seconds"] < 10, res[r]
    assert not glob.glob("/dev/shm/dblp-[0-9]*")


CRASHING_RANK = r"""
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import dblp, dblp.distributed
dblp.distributed.register()
dist.init_process_group("dblp")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 4))
ddp = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(400):
    if rank == 1 and step == 3 and sys.argv[1] == "raise":
        raise ValueError("boom in the trainer")
    if rank == 1 and step == 3 and sys.argv[1] == "sigint":
        print("ready", flush=True)
        time.sleep(60)  # Ctrl-C arrives here
    opt.zero_grad()
    try:
        ddp(torch.randn(8, 64)).sum().backward()
    except dblp.DblpError as e:
        print("DBLPERROR", e, flush=True)
        sys.exit(3)
    opt.step()
"""


@pytest.mark.parametrize("how", ["raise", "sigint"])
def test_a_crashed_or_interrupted_rank_is_named_by_the_others(tmp_path, how):
    """A rank whose script raises (or gets Ctrl-C) ends its part of the job
    naming the exception; the other rank's backward() raises DblpError
    saying so, not that the ranks ran different numbers of steps."""
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_RANK)
    port = ddp_cases.free_port_pair()
    procs = []
    for rank in range(W):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(W),
                   LOCAL_WORLD_SIZE=str(W), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   DBLP_OUT=str(tmp_path / "out"))
        procs.append(subprocess.Popen(
            [sys.executable, str(script), how], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    t0 = time.monotonic()
    if how == "sigint":
        for line in procs[1].stdout:
            if "ready" in line:
                break
        procs[1].send_signal(signal.SIGINT)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert time.monotonic() - t0 < 60, outs
    assert procs[1].returncode != 0
    assert procs[0].returncode == 3, outs[0][-2000:]
    said = [line for line in outs[0].splitlines() if "DBLPERROR" in line]
    assert said, outs[0][-2000:]
    want = ("ValueError: boom in the trainer" if how == "raise"
            else "KeyboardInterrupt")
    assert "rank1" in said[0] and want in said[0], said[0]
    assert "same number of steps" not in said[0]
    assert not glob.glob("/dev/shm/dblp-[0-9]*")
    left = subprocess.run(["pgrep", "-f", str(tmp_path)],
                          capture_output=True, text=True).stdout.split()
    assert not left, left
