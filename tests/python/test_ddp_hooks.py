"""PyTorch's habits on a `dblp` process group, against gloo.

- `import dblp` (any of its modules) changes nothing in torch: DDP's and
  the optimizers' constructors are torch's own, no backend is registered
  until dblp.distributed.register();
- a user's own comm hook (torch's allreduce hook, PowerSGD) registers on a
  DDP built on the dblp group, is called every step, and gives gloo's bits
  with the same hook (its collectives are exact, over the inner gloo
  group); no DBLP job is started for a model a hook of the user's carries;
- two DDP models train on one group, each its own DBLP job, each gloo's
  bits under `reliable`;
- dblp.distributed.hook_state + dblp.torch.HookState: DBLP under the
  user's hook (an inner hook's output moved by DBLP);
- the optimizer at a resync: without ResyncOptimizer the server's
  broadcast is the consistent one (the ranks' replicas stay identical
  with no resync), and a server told to resync refuses an unwrapped
  optimizer at the first step on every rank, naming the fix; wrapped, the
  momentum is identical on every rank after each resync.

Two ranks (two addends: see test_ddp_exact.py), forked.
"""

import glob
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import (  # noqa: E402
    default_hooks, powerSGD_hook)
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import dblp  # noqa: E402
import dblp.distributed  # noqa: E402
import dblp.torch  # noqa: E402
import ddp_cases  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

W = 2
STEPS = 24
RELIABLE = {"DBLP_SERVER_FLAGS": "--policy=reliable"}
# A lossy round on a clean memif: a fifth of the frames dropped each way.
LOSSY = "--policy=fixed --p_fixed=0.3 --loss=bernoulli:0.2"


def lossy(out, server_extra=""):
    return {"DBLP_SERVER_FLAGS": f"{LOSSY} {server_extra}".strip(),
            "DBLP_WORKER_FLAGS": "--loss=bernoulli:0.2",
            "DBLP_OUT": str(out)}


def test_import_changes_nothing_in_torch():
    code = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
before = (DDP.__init__, torch.optim.Optimizer.__init__,
          dict(dist.Backend._plugins), torch.optim.SGD.__init__)
import dblp, dblp.torch, dblp.distributed, dblp.worker, dblp.launch
after = (DDP.__init__, torch.optim.Optimizer.__init__,
         dict(dist.Backend._plugins), torch.optim.SGD.__init__)
assert before == after, (before, after)
assert not hasattr(DDP.__init__, "__wrapped__")
assert "DBLP" not in dist.Backend._plugins
dblp.distributed.register()
assert "DBLP" in dist.Backend._plugins
assert DDP.__init__ is before[0]
assert torch.optim.Optimizer.__init__ is before[1]
print("clean")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "clean" in r.stdout, r.stdout + r.stderr


# ---- one rank's run --------------------------------------------------------
def counting(hook, calls):
    def counted(state, bucket):
        calls[0] += 1
        return hook(state, bucket)
    return counted


def returns_bucket(state, bucket):
    """An inner hook that changes nothing: DBLP moves its output."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def attach_hook(name, ddp, calls):
    if name == "allreduce":
        ddp.register_comm_hook(None, counting(default_hooks.allreduce_hook,
                                              calls))
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=1,
            start_powerSGD_iter=3, use_error_feedback=True)
        ddp.register_comm_hook(state, counting(powerSGD_hook.powerSGD_hook,
                                               calls))
    elif name == "dblp_wrapping":
        state = dblp.torch.HookState(dblp.distributed.hook_state(ddp).worker,
                                     inner_hook=counting(returns_bucket,
                                                         calls))
        ddp.register_comm_hook(state, dblp.torch.comm_hook)


def init(rank, backend, port, env):
    os.environ.update(env)
    ddp_cases.set_threads()
    dblp.distributed.register()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=W)
    return dist.distributed_c10d._get_default_group()


def finish(pg, out):
    if isinstance(pg, dblp.distributed.ProcessGroupDBLP):
        out["jobs"] = [dict(started=j.worker is not None,
                            exchanges=len(j.worker.history)
                            if j.worker else 0) for j in pg.jobs]
        pg.shutdown()
    dist.destroy_process_group()
    return out


def params_bytes(model):
    return [p.detach().numpy().tobytes() for p in model.parameters()]


def hook_rank(rank, backend, hook, kind, port, env):
    pg = init(rank, backend, port, env)
    calls = [0]
    out = ddp_cases.train(
        kind, rank, W, STEPS, seed=5,
        attach=lambda ddp, model: attach_hook(hook, ddp, calls))
    out["calls"] = calls[0]
    return finish(pg, out)


def two_models_rank(rank, backend, port, env, first_hooked=False):
    """Two DDP models on one group, stepped one after the other; the first
    one under torch's allreduce hook if `first_hooked`, the second then
    under DBLP's, explicitly (the group cannot tell their default-path
    steps apart: dblp/_ddp_job.py)."""
    pg = init(rank, backend, port, env)
    torch.manual_seed(11)
    models = [ddp_cases.make_model(k) for k in ("one", "several")]
    ddps = [DDP(m, **ddp_cases.DDP_OPTIONS[k])
            for m, k in zip(models, ("one", "several"))]
    if first_hooked:
        attach_hook("allreduce", ddps[0], [0])
        if backend == "dblp":
            ddps[1].register_comm_hook(dblp.distributed.hook_state(ddps[1]),
                                       dblp.torch.comm_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
            for m in models]
    losses = []
    for step in range(STEPS):
        for kind, ddp, opt in zip(("one", "several"), ddps, opts):
            x, y = ddp_cases.batch(kind, 7, rank, step)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    out = dict(losses=losses, params=[params_bytes(m) for m in models])
    return finish(pg, out)


def resync_rank(rank, port, env, wrap):
    """The default (lossy) policy; returns what each resync left."""
    pg = init(rank, "dblp", port, env)
    torch.manual_seed(3)
    model = ddp_cases.make_model("many")
    ddp = DDP(model, **ddp_cases.DDP_OPTIONS["many"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if wrap:
        opt = dblp.distributed.ResyncOptimizer(opt, ddp)
    seen = []
    for step in range(STEPS):
        x, y = ddp_cases.batch("many", 1, rank, step)
        opt.zero_grad()
        try:
            nn.functional.cross_entropy(ddp(x), y).backward()
        except dblp.DblpError as e:
            finish(pg, {})
            return dict(refused=str(e), step=step)
        if step == 0:
            w = pg.worker
            average = w._average_optimizer_state

            def spy(params, optimizers):
                before = [opt.state[p]["momentum_buffer"].clone()
                          for p in params]
                average(params, optimizers)
                seen.append(dict(changed=any(
                    not torch.equal(m, opt.state[p]["momentum_buffer"])
                    for m, p in zip(before, params)), state=b"".join(
                    p.detach().numpy().tobytes() +
                    opt.state[p]["momentum_buffer"].numpy().tobytes()
                    for p in params)))
            w._average_optimizer_state = spy
        opt.step()
    out = dict(resyncs=seen, params=params_bytes(model),
               resync_every=pg.worker.resync_every,
               delivered_min=min(i["delivered_fraction"]
                                 for i in pg.worker.history))
    return finish(pg, out)


def run(target, *args):
    got = ddp_cases.run_ranks(W, target, (*args,), timeout=200)
    for r in range(W):
        assert "error" not in got[r], got[r].get("trace")
    return got


# ---- the tests ---------------------------------------------------------------
# PowerSGD on one bucket: with several, torch 1.13's hook waits inside a
# gloo callback for a collective the next bucket's may overtake, and hangs
# on plain gloo too (seen here); one bucket has nothing to overtake it.
@pytest.mark.parametrize("hook,kind", [("allreduce", "several"),
                                       ("powersgd", "one")])
def test_user_hook_on_dblp_group_is_called_and_equals_gloo(hook, kind):
    ref = run(hook_rank, "gloo", hook, kind, ddp_cases.free_port_pair(), {})
    got = run(hook_rank, "dblp", hook, kind, ddp_cases.free_port_pair(),
              RELIABLE)
    buckets = 2 if kind == "several" else 1
    for r in range(W):
        # DDP's first step is one bucket, then "several" has 2 or more.
        assert got[r]["calls"] >= buckets * STEPS - 1, got[r]["calls"]
        assert got[r]["calls"] == ref[r]["calls"]
        assert got[r]["losses"] == ref[r]["losses"], (hook, r)
        assert got[r]["params"] == ref[r]["params"], (hook, r)
        # The user's hook carries the model: no DBLP job was started.
        assert got[r]["jobs"] == [dict(started=False, exchanges=0)]


def test_dblp_under_a_wrapping_hook_state_equals_gloo():
    ref = run(hook_rank, "gloo", "none", "several",
              ddp_cases.free_port_pair(), {})
    got = run(hook_rank, "dblp", "dblp_wrapping", "several",
              ddp_cases.free_port_pair(), RELIABLE)
    for r in range(W):
        assert got[r]["calls"] >= 2 * STEPS - 1
        assert got[r]["losses"] == ref[r]["losses"]
        assert got[r]["params"] == ref[r]["params"]
        assert got[r]["jobs"] == [dict(started=True, exchanges=STEPS)]


@pytest.mark.parametrize("first_hooked", [False, True])
def test_two_models_on_one_group_each_their_own_job(first_hooked):
    ref = run(two_models_rank, "gloo", ddp_cases.free_port_pair(), {},
              first_hooked)
    got = run(two_models_rank, "dblp", ddp_cases.free_port_pair(), RELIABLE,
              first_hooked)
    first = dict(started=not first_hooked,
                 exchanges=0 if first_hooked else STEPS)
    for r in range(W):
        assert got[r]["losses"] == ref[r]["losses"], r
        assert got[r]["params"] == ref[r]["params"], r
        assert got[r]["jobs"] == [first, dict(started=True, exchanges=STEPS)]


def no_orphans(out):
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True,
                          text=True).stdout.split()
    assert not left, f"processes left behind: {left}"
    assert not glob.glob("/dev/shm/dblp-[0-9]*")


def test_unwrapped_optimizer_gets_the_consistent_broadcast(tmp_path):
    got = run(resync_rank, ddp_cases.free_port_pair(), lossy(tmp_path),
              False)
    # No resync, and none needed: every rank applied the same mean.
    assert got[0]["resync_every"] == got[1]["resync_every"] == 0
    assert got[0]["resyncs"] == []
    assert got[0]["delivered_min"] < 1.0
    assert got[0]["params"] == got[1]["params"]
    no_orphans(tmp_path)


def test_resync_refuses_an_unwrapped_optimizer_at_the_first_step(tmp_path):
    got = run(resync_rank, ddp_cases.free_port_pair(),
              lossy(tmp_path, "--resync_every=5"), False)
    for r in range(W):
        assert got[r]["step"] == 0, got[r]
        assert "every 5 steps" in got[r]["refused"], got[r]
        assert "dblp.distributed.ResyncOptimizer(opt, ddp)" in \
            got[r]["refused"]
    no_orphans(tmp_path)


def test_resync_optimizer_leaves_every_rank_the_same_momentum(tmp_path):
    got = run(resync_rank, ddp_cases.free_port_pair(),
              lossy(tmp_path, "--resync_every=5"), True)
    a, b = got[0]["resyncs"], got[1]["resyncs"]
    assert len(a) == len(b) >= STEPS // 6, (len(a), len(b))
    assert got[0]["delivered_min"] < 1.0
    for x, y in zip(a, b):
        assert x["state"] == y["state"]  # parameters and momentum
        assert x["changed"] and y["changed"]  # they had drifted apart
    no_orphans(tmp_path)


def float64_rank(rank, port, out):
    pg = init(rank, "dblp", port, {"DBLP_OUT": str(out)})
    ddp = DDP(nn.Linear(4, 2).double())  # built, as on gloo
    try:
        ddp(torch.randn(3, 4, dtype=torch.float64)).sum().backward()
        refused = None
    except dblp.DblpError as e:
        refused = str(e)
    return finish(pg, dict(refused=refused))


def test_a_model_dblp_cannot_move_is_refused_before_any_server(tmp_path):
    got = run(float64_rank, ddp_cases.free_port_pair(), tmp_path)
    for r in range(W):
        assert "float64" in got[r]["refused"], got[r]
        assert "model.float()" in got[r]["refused"]
        assert got[r]["jobs"] == [dict(started=False, exchanges=0)]
    assert not os.path.exists(tmp_path / "rank0")
    no_orphans(tmp_path)


def failing_inner_rank(rank, port, env):
    """The hook HookState wraps raises at step 2 on every rank."""
    pg = init(rank, "dblp", port, env)
    torch.manual_seed(5)
    model = ddp_cases.make_model("several")
    ddp = DDP(model, **ddp_cases.DDP_OPTIONS["several"])

    def inner(state, bucket):
        if step == 2:
            raise ValueError("the inner hook's own bug")
        return returns_bucket(state, bucket)

    ddp.register_comm_hook(dblp.torch.HookState(
        dblp.distributed.hook_state(ddp).worker, inner_hook=inner),
        dblp.torch.comm_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    refused, losses = [], []
    for step in range(5):
        x, y = ddp_cases.batch("several", 5, rank, step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        try:
            loss.backward()
        except dblp.DblpError as e:
            refused.append((step, str(e)))
            continue
        opt.step()
        losses.append(loss.item())
    return finish(pg, dict(refused=refused, steps=len(losses)))


def test_a_failing_wrapped_hook_fails_its_step_and_training_goes_on():
    got = run(failing_inner_rank, ddp_cases.free_port_pair(), RELIABLE)
    for r in range(W):
        assert [s for s, _ in got[r]["refused"]] == [2], got[r]
        assert "ValueError: the inner hook's own bug" in got[r]["refused"][0][1]
        assert got[r]["steps"] == 4
        assert got[r]["jobs"] == [dict(started=True, exchanges=4)]
