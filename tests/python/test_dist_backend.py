"""The `dblp` torch.distributed backend: init_process_group("dblp") and an
unchanged DDP script, bit for bit against the same script on gloo (two
ranks: see test_ddp_exact.py), over memif and kernel UDP; the other
collectives exact through the inner gloo group; the DBLP rank is the
torch rank."""

import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import dblp  # noqa: E402
import dblp.distributed  # noqa: E402
import ddp_cases  # noqa: E402
from test_ddp_exact import STEPS, W, assert_same_bits, reference  # noqa

pytestmark = pytest.mark.filterwarnings("ignore")


def backend_rank(rank, kind, port, env):
    os.environ.update(env)
    ddp_cases.set_threads()
    dblp.distributed.register()
    dist.init_process_group("dblp", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=W)
    try:
        pg = dist.distributed_c10d._get_default_group()
        assert dist.get_backend() == "dblp", dist.get_backend()
        out = ddp_cases.train(kind, rank, W, STEPS, seed=3)
        w = pg.worker
        out["exchanges"] = len(w.history)
        out["delivered_min"] = min(i["delivered_fraction"] for i in w.history)
        out["dblp_rank"] = w.rank
        # The server shards rank 0 started (DBLP_SHARDS).
        if pg._server is not None:
            out["server_procs"] = len(pg._server.procs)
        # Other collectives: exact, through gloo.
        t = torch.tensor([rank + 1.0, 10.0 * rank])
        dist.all_reduce(t)
        out["small_sum"] = t.tolist()
        got = [torch.zeros(2) for _ in range(W)]
        dist.all_gather(got, torch.tensor([float(rank), 1.0]))
        out["gathered"] = [g.tolist() for g in got]
        b = torch.tensor([float(rank)])
        dist.broadcast(b, src=1)
        out["bcast"] = b.item()
        dist.barrier()
        # A gradient-sized all_reduce is exact too (a parameter average
        # must not be lossy); allreduce_gradient_ goes over DBLP.
        n = w.gradient.numel()
        before = len(w.history)
        g = torch.full((n,), float(rank + 1))
        dist.all_reduce(g)
        out["exact_over_dblp"] = len(w.history) - before
        out["exact_sum"] = (g.min().item(), g.max().item())
        g = torch.full((n,), float(rank + 1))
        pg.allreduce_gradient_(g)
        out["big_sum"] = (g.min().item(), g.max().item())
        out["big_over_dblp"] = len(w.history) - before
        pg.shutdown()
        return out
    finally:
        dist.destroy_process_group()


def skip_without(app):
    try:
        dblp.find_app(app)
    except FileNotFoundError:
        pytest.skip(app + " not built")


@pytest.mark.parametrize("transport,kind,shards", [("dpdk", "several", 1),
                                                   ("dpdk", "many", 1),
                                                   ("udp", "many", 1),
                                                   ("dpdk", "many", 2)])
def test_backend_reliable_equals_gloo(transport, kind, shards):
    if transport == "udp":
        skip_without("dblp-udp-worker")
    ref = reference(kind)
    env = {"DBLP_TRANSPORT": transport,
           "DBLP_SHARDS": str(shards),
           "DBLP_SERVER_FLAGS": "--policy=reliable" +
           (" --resync_every=0" if transport == "dpdk" else "")}
    got = ddp_cases.run_ranks(W, backend_rank,
                              (kind, ddp_cases.free_port_pair(), env))
    for r in range(W):
        assert "error" not in got[r], got[r].get("trace")
    assert_same_bits(got, ref, f"backend {transport}/{kind}/{shards}")
    assert got[0]["server_procs"] == shards
    for r in range(W):
        g = got[r]
        assert g["dblp_rank"] == r
        assert g["small_sum"] == [3.0, 10.0]
        assert g["gathered"] == [[0.0, 1.0], [1.0, 1.0]]
        assert g["bcast"] == 1.0
        assert g["exact_over_dblp"] == 0 and g["exact_sum"] == (3.0, 3.0)
        assert g["big_over_dblp"] == 1 and g["big_sum"] == (3.0, 3.0)
