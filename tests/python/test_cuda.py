"""CUDA models through DBLP: buckets staged through the shared region
registered as pinned memory (dblp.worker._CudaStaging), against gloo on the same
GPU, bit for bit (two ranks, as test_ddp_exact.py), through the hook and
the `dblp` backend. Skipped where torch has no CUDA device (Debian's
python3-torch is built without CUDA)."""

import multiprocessing as mp
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (or a torch built without CUDA): the GPU "
                "path is checked where one is", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

import dblp  # noqa: E402
import dblp.distributed  # noqa: E402
import dblp.torch  # noqa: E402
import ddp_cases  # noqa: E402

W, STEPS = 2, 100
SPAWN = mp.get_context("spawn")


def gloo_rank(rank, port):
    ddp_cases.set_threads()
    ddp_cases.init_gloo(rank, W, port)
    try:
        return ddp_cases.train("many", rank, W, STEPS, 3, device="cuda:0")
    finally:
        dist.destroy_process_group()


def hook_rank(rank, port, kwargs):
    ddp_cases.set_threads()
    ddp_cases.init_gloo(rank, W, port)
    workers = []

    def attach(ddp, model):
        workers.append(dblp.Worker(model=model, **kwargs[rank]))
        ddp.register_comm_hook(workers[0], dblp.torch.comm_hook)

    try:
        out = ddp_cases.train("many", rank, W, STEPS, 3, attach=attach,
                              device="cuda:0")
        out["exchanges"] = len(workers[0].history)
        workers[0].close()
        return out
    finally:
        dist.destroy_process_group()


def backend_rank(rank, port):
    os.environ["DBLP_SERVER_FLAGS"] = "--policy=reliable --resync_every=0"
    ddp_cases.set_threads()
    dblp.distributed.register()
    dist.init_process_group("dblp", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=W)
    try:
        out = ddp_cases.train("many", rank, W, STEPS, 3, device="cuda:0")
        pg = dist.distributed_c10d._get_default_group()
        out["exchanges"] = len(pg.worker.history)
        pg.shutdown()
        return out
    finally:
        dist.destroy_process_group()


def check(got, ref):
    for r in range(W):
        assert "error" not in got[r], got[r].get("trace")
        assert got[r]["exchanges"] == STEPS
        assert got[r]["losses"] == ref[r]["losses"]
        assert got[r]["params"] == ref[r]["params"]
        assert got[r]["momentum"] == ref[r]["momentum"]


def test_cuda_hook_and_backend_equal_gloo():
    ref = ddp_cases.run_ranks(W, gloo_rank, (ddp_cases.free_port_pair(),),
                              ctx=SPAWN)
    with dblp.LocalServer(W, "dpdk", ["--policy=reliable",
                                      "--resync_every=0"]) as srv:
        kw = [srv.worker_kwargs(r) for r in range(W)]
        check(ddp_cases.run_ranks(W, hook_rank,
                                  (ddp_cases.free_port_pair(), kw),
                                  ctx=SPAWN), ref)
        assert srv.wait(60) == 0, srv.log_tail()
    check(ddp_cases.run_ranks(W, backend_rank,
                              (ddp_cases.free_port_pair(),), ctx=SPAWN), ref)
