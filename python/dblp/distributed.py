"""The ``dblp`` torch.distributed backend.

    import dblp.distributed
    dblp.distributed.register()             # or run under tools/dblp-run
    dist.init_process_group("dblp")         # under torchrun
    ddp = DDP(model)                        # its gradients go over DBLP
    opt = dblp.distributed.ResyncOptimizer(torch.optim.SGD(...), ddp)

Nothing happens on import: register() adds the backend's name to
torch.distributed (tools/dblp-run does it before the script runs, so a
script written for gloo needs only the backend's name).

A ``ProcessGroupDBLP`` holds an inner gloo group on the same store, and
every collective but DDP's gradient buckets goes to it unchanged: DDP's
parameter broadcast, barriers, ``all_gather``, a loss averaged for
logging, and every ``dist.all_reduce`` (a parameter average or a metric
must not lose a float).

Each ``DistributedDataParallel`` built on the group gets a DBLP job of its
own, started at its first backward pass (rank 0 starts its dblp-server
unless ``DBLP_SERVER`` names one). DDP's default path then carries each
step's buckets to it through the group: one DBLP iteration per step over
the whole gradient, under the policy the server runs (bounded loss).

A comm hook of your own (``ddp.register_comm_hook``: PowerSGD, fp16
compression, torch's allreduce hook) replaces that path, as on gloo: its
collectives go over the inner gloo group, exact, because they carry
compressed factors or halves whose every float matters and whose sizes
are not the model's gradient. To run DBLP under a hook of your own, wrap
it: ``ddp.register_comm_hook(dblp.torch.HookState(
dblp.distributed.hook_state(ddp).worker, inner_hook=h), dblp.torch.
comm_hook)`` moves what ``h`` returns. A gradient of your own goes over
DBLP with ``group.allreduce_gradient_(flat)`` (the first model's size,
float32 CPU: the SUM, as all_reduce's).

When the server re-synchronises the replicas (``--resync_every``, on by
default under a lossy policy), the optimizer's state is averaged too: wrap
the optimizer in ``ResyncOptimizer(opt, ddp)``; a resync of a model whose
optimizer is not wrapped fails, naming the fix.

Configuration, from the environment (torchrun's, plus):

  DBLP_TRANSPORT      dpdk (default: dblp-worker, the memif cluster on one
                      host, or a NIC with DBLP_EAL) | udp (kernel sockets)
  DBLP_SERVER         host:port of a running dblp-server; unset: rank 0
                      starts one on this host (one host only for dpdk)
  DBLP_SERVER_FLAGS   extra flags of the server rank 0 starts, e.g.
                      "--policy=reliable" (exact; the default is dblp)
  DBLP_SHARDS         server shards rank 0 starts (dpdk, one host): each
                      dblp-server adds and broadcasts 1/S of the chunks;
                      default 1 (docs/BENCHMARKS.md, "The whole exchange")
  DBLP_WORKER_FLAGS   extra dblp-worker flags
  DBLP_EAL            dblp-worker's EAL options ("{local_rank}" is
                      replaced), for a NIC
  DBLP_SECRET_FILE    the job secret, a file every rank can read; unset:
                      rank 0 makes one and hands it out through the c10d
                      store (docs/PYTORCH.md: the store is not encrypted)
  DBLP_OUT            where the apps write their rows and logs

The DBLP rank is the torch rank: the workers are named rank<r> and the
server ranks them by name. The pause a job survives is the group's timeout
(init_process_group(timeout=...), 30 minutes by default, as gloo's).
"""

import datetime
import os
import shlex
import socket
import stat
import tempfile
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import _ddp_job
from ._launch import LocalServer
from .errors import DblpError
from .torch import HookState
from .worker import raise_after_backward

__all__ = ["ProcessGroupDBLP", "BACKEND", "register", "ResyncOptimizer",
           "hook_state"]

BACKEND = "dblp"
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)

# The collectives that go to the inner gloo group as they are.
_DELEGATED = ["allreduce_coalesced", "allgather", "_allgather_base",
              "allgather_coalesced", "barrier", "reduce",
              "gather", "scatter", "reduce_scatter", "_reduce_scatter_base",
              "alltoall", "alltoall_base", "send", "recv", "recv_anysource",
              "monitored_barrier"]


class ProcessGroupDBLP(dist.ProcessGroup):
    """A process group whose DDP gradients go over DBLP; see the module's
    documentation."""

    def __init__(self, store, rank, size, timeout=_DEFAULT_TIMEOUT):
        super().__init__(rank, size)
        self._store = dist.PrefixStore("dblp/", store)
        self._timeout = timeout
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store),
                                           rank, size, timeout)
        self.exact_group = self._gloo  # what must never lose a float
        self.jobs = []         # one per DDP model built on the group
        self._stepping = None  # the job whose buckets are coming in
        # What to release, per job: held apart from self, so the finalizer
        # can release it when the group is gone.
        self._res = []
        weakref.finalize(self, ProcessGroupDBLP._release, self._res)

    def getBackendName(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def __repr__(self):
        return f"ProcessGroupDBLP(rank={self.rank()}, size={self.size()})"

    @property
    def worker(self):
        """The first model's Worker, once its job has started."""
        return self.jobs[0].worker if self.jobs else None

    @property
    def _server(self):
        return self.jobs[0].server if self.jobs else None

    # ---- collectives -----------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """A DDP gradient bucket (its default path) goes to its model's
        DBLP job; everything else is exact, over gloo."""
        # With no job yet too: DDP's buckets on a group that never saw the
        # DDP built fail naming why, never go exact unnoticed.
        if _ddp_job.from_ddp_reducer(_ddp_job.caller_file(1), tensors, opts):
            return _create_work_from_future(self._push_bucket(tensors[0]))
        if opts is None:
            return self._gloo.allreduce(tensors)
        return self._gloo.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        """gloo's; the first broadcast of a DDP's constructor also makes
        the model's job (the model checked on every rank before any
        server starts)."""
        ddp = _ddp_job.ddp_being_built(1)
        if ddp is not None and ddp.process_group is self:
            job = _ddp_job.ModelJob(self, ddp, len(self.jobs))
            self.jobs.append(job)
            self._res.append(job.res)
        if opts is None:
            return self._gloo.broadcast(tensors)
        return self._gloo.broadcast(tensors, opts)

    def _push_bucket(self, bucket):
        try:
            job = self._stepping
            if job is None or not job.in_step():
                job = self._stepping = self._job_for_step(bucket)
            fut = job.push(bucket)
        except DblpError as e:
            # Raised here, inside DDP's reducer, it would come out of
            # backward() as a RuntimeError with the reducer mid-step: the
            # bucket completes as it is, and backward() raises the
            # DblpError once DDP has finished.
            self._stepping = None
            fut = torch.futures.Future()
            fut.set_result(bucket)
            raise_after_backward(e)
            return fut
        if not job.in_step():
            self._stepping = None
        return fut

    def _job_for_step(self, bucket):
        """The model whose backward pass sent this, the first bucket of a
        step: the one model that ran a forward pass since its last step."""
        waiting = [j for j in self.jobs if j.wants_step()]
        if len(waiting) == 1:
            return waiting[0]
        if not waiting:
            raise DblpError(
                f"a DDP gradient bucket of {bucket.numel()} floats reached "
                "the dblp group, and no DDP model built on it ran a forward"
                " pass since its last step (a model built on another group,"
                " or a torch whose DDP this package does not recognise: see "
                "dblp/_ddp_job.py)")
        raise DblpError(
            f"{len(waiting)} DDP models on this dblp group ran forward "
            "passes since their last step, and their backward passes "
            "cannot be told apart on the group (one loss over both, or one "
            "of them under a comm hook of yours): register "
            "dblp.torch.comm_hook on each model DBLP should carry "
            "(dblp.distributed.hook_state), or give each model its own group")

    def allreduce_gradient_(self, flat):
        """The SUM of every rank's `flat` (float32, CPU, the first DDP
        model's gradient size) over DBLP, under the server's policy: what
        DDP's path does, for a gradient of your own."""
        if not self.jobs:
            raise DblpError("no DBLP job yet: build a DistributedDataParallel"
                            " on this group first")
        self.jobs[0].start().allreduce_(flat)
        flat.mul_(self.size())
        return flat

    # ---- the jobs --------------------------------------------------------
    def _job_kwargs(self, job):
        timeout_s = max(1.0, self._timeout.total_seconds())
        kw = _ddp_job.job_kwargs(self, job, self._store, timeout_s)
        kw.update(self._secret(job))
        return kw

    def _start_server(self, job, transport, timeout_flag, out, key):
        size = self.size()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        if transport == "dpdk":
            if local != size:
                msg = (f"the memif cluster is one host, and this job has "
                       f"{size} ranks of which {local} here: set "
                       "DBLP_TRANSPORT=udp, or DBLP_SERVER and DBLP_EAL for "
                       "a NIC")
                self._store.set(key, "error:" + msg)
                raise DblpError(msg)
        user_flags = shlex.split(os.environ.get("DBLP_SERVER_FLAGS", ""))
        flags = ["--rank_order=name", timeout_flag] + \
            _ddp_job.broadcast_flags(user_flags, job.optimizers) + user_flags
        secret = os.environ.get("DBLP_SECRET_FILE")
        host = "127.0.0.1"
        if transport == "udp":
            host = _resolve(os.environ.get("MASTER_ADDR", "127.0.0.1"))
            if local != size and host.startswith("127."):
                msg = (f"MASTER_ADDR resolves to {host} on rank 0, which the "
                       "other hosts cannot reach: give MASTER_ADDR as this "
                       "host's address on their network")
                self._store.set(key, "error:" + msg)
                raise DblpError(msg)
        try:
            job.server = LocalServer(
                size, transport, flags, out_dir=out, secret_file=secret,
                host=host, memory_mb=_server_memory_mb(job.floats),
                timeout=self._timeout.total_seconds(),
                shards=_shards_from_env())
        except Exception as e:
            self._store.set(key, f"error:{e}")
            raise
        job.res["server"] = job.server
        job.res["server_wait_s"] = min(300.0, self._timeout.total_seconds())
        if not secret:
            with open(job.server.secret_file, "rb") as f:
                self._store.set(f"secret/{job.index}", f.read())
        sockets = ",".join(
            ";".join(p) if isinstance(p, list) else p
            for p in (job.server.socket(r) for r in range(size))) \
            if transport == "dpdk" else ""
        self._store.set(key, f"{job.server.address} {sockets}")
        _ddp_job.print_notice(_ddp_job.policy_notice(flags))

    def _refuse_job(self, job, why):
        """Rank 0 tells the ranks waiting for its server that none comes."""
        if self.rank() == 0 and not os.environ.get("DBLP_SERVER"):
            self._store.set(f"server/{job.index}", "error:" + why)

    def _secret(self, job):
        path = os.environ.get("DBLP_SECRET_FILE")
        if path:
            return dict(secret_file=path)
        if job.server is not None:
            return dict(secret_file=job.server.secret_file)
        fd, tmp = tempfile.mkstemp(prefix="dblp-secret-")
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "wb") as f:
            f.write(self._store.get(f"secret/{job.index}"))
        job.res["secret"] = tmp
        return dict(secret_file=tmp)

    def shutdown(self):
        """Ends this rank's part of every DBLP job on the group (also when
        the group is collected, or at exit)."""
        for job in self.jobs:
            job.worker = None
            job.server = None
        ProcessGroupDBLP._release(self._res)

    @staticmethod
    def _release(res):
        """Every job's resources, whatever became of the one before."""
        errors = []
        while res:
            try:
                _ddp_job.release(res.pop(0))
            except Exception as e:  # the others are still released
                errors.append(e)
        if errors:
            raise errors[0]


def _job_of(ddp):
    group = getattr(ddp, "process_group", None)
    if not isinstance(group, ProcessGroupDBLP):
        raise DblpError(f"this DistributedDataParallel is on a "
                        f"{type(group).__name__}, not on a dblp group "
                        "(dist.init_process_group('dblp') or "
                        "dist.new_group(backend='dblp'))")
    for job in group.jobs:
        if job.ddp() is ddp:
            return job
    raise DblpError("this DistributedDataParallel is not one the dblp group "
                    "saw being built")


def hook_state(ddp):
    """The state for ``ddp.register_comm_hook(state, dblp.torch.comm_hook)``
    on a DDP built on a dblp group: its job, started now (every rank calls
    it), carried by the hook from then on instead of DDP's default path.
    A collective."""
    job = _job_of(ddp)
    job.hooked = True
    return HookState(job.start())


class ResyncOptimizer(torch.optim.Optimizer):
    """`optim`, as it is, for a DDP model on a dblp group: at each of the
    server's parameter re-synchronisations its per-parameter state (SGD's
    momentum, Adam's moments) is averaged over the ranks too, exactly, so
    the replicas leave the resync identical. In the style of torch's
    PostLocalSGDOptimizer: use it wherever the optimizer was used."""

    def __init__(self, optim, ddp):
        self.optim = optim
        self.param_groups = optim.param_groups
        self.defaults = optim.defaults
        self.state = optim.state
        self._job = weakref.ref(_job_of(ddp))
        self._job().optimizers.append(optim)

    def __repr__(self):
        return f"ResyncOptimizer({self.optim!r})"

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def step(self, closure=None):
        return self.optim.step(closure)

    def zero_grad(self, set_to_none=False):
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

def _delegate(name):
    def method(self, *args, **kwargs):
        return getattr(self._gloo, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"{name}: the inner gloo group's."
    return method


for _name in _DELEGATED:
    setattr(ProcessGroupDBLP, _name, _delegate(_name))


def _shards_from_env():
    text = os.environ.get("DBLP_SHARDS", "1")
    try:
        shards = int(text)
    except ValueError:
        shards = 0
    if shards < 1:
        raise DblpError(f"DBLP_SHARDS={text}: give the number of server "
                        "shards, 1 or more (more with DBLP_TRANSPORT=dpdk)")
    return shards


def _resolve(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _server_memory_mb(floats):
    # The server holds about three copies of the gradient (sum, mean, the
    # broadcast's), plus its mbufs.
    return max(512, int(3 * 4 * floats / 2**20) + 384)


def _create(store, rank, size, timeout):
    return ProcessGroupDBLP(store, rank, size, timeout)


def register():
    """Adds the "dblp" backend to torch.distributed (idempotent): the one
    change this package makes to torch, and only when called."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create)
