"""DDP training runs the PyTorch tests compare: the same models, seeds and
data under gloo's allreduce and under DBLP (the comm hook, or the `dblp`
process-group backend), each rank a forked process.

The models are shaped so that DDP's bucketing is exercised as users meet
it: one bucket, several uneven ones, many with a rebuild after step 0 (the
first bucket is capped at 1 MiB, the rebuilt order is the gradients' ready
order), unused parameters, and gradients as bucket views.
"""

import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CTX = mp.get_context("fork")


class Branchy(nn.Module):
    """A trunk and two heads; the second head is used on odd steps only,
    so find_unused_parameters=True has work to do."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(64, 1024), nn.Tanh(),
                                   nn.Linear(1024, 512), nn.Tanh())
        self.head_a = nn.Linear(512, 10)
        self.head_b = nn.Linear(512, 10)
        self.use_b = False

    def forward(self, x):
        h = self.trunk(x)
        out = self.head_a(h)
        return out + self.head_b(h) if self.use_b else out


def make_model(kind):
    if kind == "one":  # 1 bucket: 27,018 floats
        return nn.Sequential(nn.Linear(64, 300), nn.ReLU(),
                             nn.Linear(300, 26), nn.ReLU(), nn.Linear(26, 10))
    if kind == "several":  # a CNN over 1x28x28, 331k floats, uneven buckets
        return nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 7 * 7, 200), nn.ReLU(),
            nn.Linear(200, 10))
    if kind == "many":  # 1.16M floats: > 1 MiB, so the buckets are rebuilt
        layers = [nn.Linear(64, 512), nn.ReLU()]
        for _ in range(4):
            layers += [nn.Linear(512, 512), nn.ReLU()]
        layers += [nn.Linear(512, 10)]
        return nn.Sequential(*layers)
    if kind == "unused":
        return Branchy()
    raise ValueError(kind)


# DDP options per case: bucket caps small enough for several buckets.
DDP_OPTIONS = {
    "one": dict(),
    "several": dict(bucket_cap_mb=0.1),
    "many": dict(bucket_cap_mb=0.5, gradient_as_bucket_view=True),
    "unused": dict(bucket_cap_mb=0.5, find_unused_parameters=True),
}


def batch(kind, seed, rank, step, size=16):
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + step)
    shape = (size, 1, 28, 28) if kind == "several" else (size, 64)
    x = torch.randn(shape, generator=g)
    y = torch.randint(0, 10, (size,), generator=g)
    return x, y


def train(kind, rank, world, steps, seed, attach=None, lr=0.05,
          device="cpu"):
    """`steps` DDP steps of model `kind` on this rank (the process group is
    up); returns the per-step losses, the final parameters and momentum
    buffers (as bytes: compared bit for bit) and 
    attach(ddp, model) wires DBLP in (the comm hook) or is None."""
    torch.manual_seed(seed)
    model = make_model(kind).to(device)
    ddp = DDP(model, **DDP_OPTIONS[kind])
    if attach is not None:
        attach(ddp, model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        if kind == "unused":
            model.use_b = step % 2 == 1
        x, y = batch(kind, seed, rank, step)
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = [p.detach().cpu().numpy().tobytes() for p in model.parameters()]
    momentum = [opt.state[p]["momentum_buffer"].cpu().numpy().tobytes()
                for p in model.parameters() if p in opt.state]
    return dict(losses=losses, params=state, momentum=momentum)


class Reports:
    """Where each rank process leaves its (rank, value): put() as a
    multiprocessing.Queue's, but one file each, written whole and then
    renamed. A Queue's reader blocks for ever on a message its writer did
    not finish, and the parent holds the pipe's write end too, so no EOF
    comes: one run hung so, both ranks killed by an abort ("terminate
    called ... Resource deadlock avoided") while they reported."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-ranks-")

    def put(self, item):
        rank, _ = item
        path = os.path.join(self.dir, "%s-%d.pkl" % (rank, os.getpid()))
        with open(path + ".tmp", "wb") as f:
            pickle.dump(item, f)
        os.replace(path + ".tmp", path)

    def close(self):  # the Queue calls the callers make: nothing to flush
        pass

    def join_thread(self):
        pass

    def take(self):
        """Every report written whole so far, oldest first."""
        items = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".pkl"):
                with open(os.path.join(self.dir, name), "rb") as f:
                    items.append(pickle.load(f))
        return items

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def run_ranks(world, target, args, timeout=300, expect=None, ctx=CTX):
    """Runs target(rank, *args) in `world` forked processes; returns
    {rank: result} once the ranks in `expect` (default: all) reported. A
    rank that raised reports its traceback. CUDA needs ctx=spawn (a
    forked child cannot initialise it again)."""
    q = Reports()
    procs = [ctx.Process(target=_guarded, args=(target, r, q) + tuple(args))
             for r in range(world)]
    return collect(procs, q, timeout,
                   set(range(world) if expect is None else expect))


def collect(procs, q, timeout=180, want=None):
    """Starts `procs` (process i reports as rank i); {rank: value} of the
    (rank, value) pairs they put on q (a Reports), once every rank in
    `want` (default: one per process) reported. A wanted process that
    ended without reporting, or any that a signal ended, fails the test
    naming it; so does a report that does not come in `timeout` s."""
    for p in procs:
        p.start()
    out = {}
    deadline = time.monotonic() + timeout
    want = set(range(len(procs))) if want is None else want
    try:
        while True:
            ended = {i: p.exitcode for i, p in enumerate(procs)
                     if p.exitcode is not None}
            for r, value in q.take():
                out.setdefault(r, value)
            if want <= set(out):
                break
            silent = {i: c for i, c in ended.items()
                      if i in want and i not in out}
            assert not silent, (
                "rank process(es) ended without reporting (exit code; "
                "negative: the signal, -6 an abort; their stderr is "
                "above): %s" % silent)
            assert time.monotonic() < deadline, (
                "ranks %s did not report in %d s" %
                (sorted(want - set(out)), timeout))
            time.sleep(0.05)
    finally:
        killed = set()
        for i, p in enumerate(procs):
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
                killed.add(i)
        q.remove()
    signalled = {i: p.exitcode for i, p in enumerate(procs)
                 if i not in killed and p.exitcode is not None and
                 p.exitcode < 0}
    assert not signalled, (
        "rank process(es) ended by a signal after reporting (negative exit "
        "code: the signal, -6 an abort; their stderr is above): %s" %
        signalled)
    return out


def _guarded(target, rank, q, *args):
    try:
        q.put((rank, target(rank, *args)))
    except BaseException as e:  # reported, not hung
        q.put((rank, dict(error=f"{type(e).__name__}: {e}",
                          trace=traceback.format_exc())))
    finally:
        q.close()
        q.join_thread()
        # Reported: the rank ends here, without the interpreter's teardown
        # of what the target left (torch 1.13 can abort tearing down a
        # gloo group from one of its own threads; the targets that test a
        # teardown do it before they return).
        os._exit(0)


def init_gloo(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)


def set_threads():
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def free_port_pair():
    """A free TCP port for a process group's store."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
