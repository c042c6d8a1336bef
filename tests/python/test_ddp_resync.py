"""The server's resync through DDP: every K steps the replicas that a lossy
broadcast drifted apart hold the same bytes again, parameters and the
optimizer's momentum alike (the momentum is averaged with them, else the
replicas drift apart again at once)."""

import pytest

torch = pytest.importorskip("torch")

import dblp  # noqa: E402
import dblp.torch  # noqa: E402
import ddp_cases  # noqa: E402

W = 2


def resync_rank(rank, port, kwargs):
    ddp_cases.set_threads()
    ddp_cases.init_gloo(rank, W, port)
    model = ddp_cases.make_model("many")
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, **ddp_cases.DDP_OPTIONS["many"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    w = dblp.Worker(model=model, optimizer=opt, **kwargs[rank])
    ddp.register_comm_hook(w, dblp.torch.comm_hook)
    seen = []
    average = w._average_optimizer_state

    def spy(params, optimizers):  # right after the parameters' resync
        before = [opt.state[p]["momentum_buffer"].clone() for p in params]
        average(params, optimizers)
        seen.append(dict(
            params=b"".join(p.detach().numpy().tobytes() for p in params),
            momentum=b"".join(opt.state[p]["momentum_buffer"].numpy()
                              .tobytes() for p in params),
            changed=any(not torch.equal(b, opt.state[p]["momentum_buffer"])
                        for b, p in zip(before, params))))

    w._average_optimizer_state = spy
    for step in range(8):
        x, y = ddp_cases.batch("many", 1, rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    delivered = min(i["delivered_fraction"] for i in w.history)
    w.close()
    return dict(seen=seen, delivered=delivered)


@pytest.mark.parametrize("transport", ["dpdk", "udp"])
def test_resync_makes_parameters_and_momentum_identical(transport):
    flags = ["--policy=fixed", "--p_fixed=0.3", "--resync_every=3",
             "--loss=bernoulli:0.2"]
    with dblp.LocalServer(W, transport, flags) as srv:
        kw = [srv.worker_kwargs(r) for r in range(W)]
        for k in kw:
            k["worker_flags"] = ["--loss=bernoulli:0.2"]
        res = ddp_cases.run_ranks(W, resync_rank,
                                  (ddp_cases.free_port_pair(), kw))
        assert srv.wait(60) == 0, srv.log_tail()
    for r in range(W):
        assert "trace" not in res[r], res[r]["trace"]
        assert len(res[r]["seen"]) == 2, len(res[r]["seen"])  # steps 3, 6
        assert res[r]["delivered"] < 1.0  # the broadcast really lost chunks
    for a, b in zip(res[0]["seen"], res[1]["seen"]):
        assert a["params"] == b["params"]
        assert a["momentum"] == b["momentum"]
        assert a["changed"] and b["changed"]  # they had drifted apart
