"""One DDP model's DBLP job inside a ``dblp`` process group: found when
the model's DistributedDataParallel is built on the group, started at its
first backward pass (rank 0 starts its dblp-server), fed by DDP's default
path (the group's allreduce of each gradient bucket) or by an explicit
comm hook, released with the group.

How the group sees a DDP without patching DistributedDataParallel:
torch 1.13 has no callback for "a DDP was built on this process group",
so the group recognises the two calls DDP makes on it:
  - at construction, DDP checks its parameters' shapes across the ranks
    with a broadcast made from torch.distributed.utils.
    _verify_param_shape_across_processes, called by DDP's __init__ (whose
    frame holds the DDP);
  - at each step, DDP's reducer allreduces every gradient bucket from C++
    inside the autograd engine, so the group's allreduce is entered from
    torch/autograd/__init__.py, never from torch.distributed's own
    all_reduce (a metric, a parameter average, a user's comm hook).
tests/python/test_ddp_hooks.py checks both on the torch installed; if a
torch release moves them, DDP's buckets reach a group that knows no model
and the step fails with a DblpError saying so, never silently exact.
"""

import os
import shlex
import sys
import weakref

import torch
import torch.distributed.utils as dist_utils
from torch.nn.parallel import DistributedDataParallel

from .errors import DblpError
from .worker import Worker, _check_params, check_same_model

_AUTOGRAD_FILE = torch.autograd.__file__
_VERIFY_SHAPES = dist_utils._verify_param_shape_across_processes.__code__


def ddp_being_built(depth):
    """The DistributedDataParallel whose constructor made the broadcast
    `depth` frames above the caller (checking its parameters' shapes), or
    None."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:  # from C++, no Python frame: not DDP's constructor
        return None
    if frame.f_code is not _VERIFY_SHAPES or frame.f_back is None:
        return None
    ddp = frame.f_back.f_locals.get("self")
    return ddp if isinstance(ddp, DistributedDataParallel) else None


def caller_file(depth):
    """The file of the Python code `depth` frames above the caller, or None
    when the call came from C++ on a thread with no Python frames (the
    autograd engine's CUDA device threads run DDP's reducer there)."""
    try:
        return sys._getframe(depth + 1).f_code.co_filename
    except ValueError:
        return None


def from_ddp_reducer(caller, tensors, opts):
    """Whether an allreduce is DDP's default path for one gradient bucket:
    entered from C++ inside the autograd engine (`caller`: caller_file of
    the allreduce), one dense floating-point tensor, a sum. Any float
    dtype: a float64 model's buckets must reach its job to be refused
    there, not go exact unnoticed; the reducer's own integer allreduce
    (find_unused_parameters' map of used parameters) stays exact."""
    if caller not in (_AUTOGRAD_FILE, None) or len(tensors) != 1:
        return False
    if tensors[0].is_sparse or not tensors[0].is_floating_point():
        return False
    return opts is None or opts.reduceOp == torch.distributed.ReduceOp.SUM


def _flag(flags, name, default=None):
    value = default
    for flag in flags:
        if flag.startswith(f"--{name}="):
            value = flag.split("=", 1)[1]
    return value


def broadcast_flags(user_flags, optimizers):
    """The server's broadcast for a model whose optimizer is not wrapped in
    ResyncOptimizer: `consistent` (every rank applies the same mean, the
    chunks it lacks carried to the next step), so the replicas never drift
    apart and no resync (which must average the optimizer's state) is
    needed. The server's default (each rank its own share of the mean,
    resynced every 10 steps) once the optimizer is wrapped, or whatever
    DBLP_SERVER_FLAGS says."""
    if optimizers or _flag(user_flags, "policy", "dblp") == "reliable":
        return []
    if any(f.startswith(("--bcast_tolerance=", "--resync_every="))
           for f in user_flags):
        return []
    return ["--bcast_tolerance=consistent"]


def policy_notice(server_flags):
    """What rank 0 prints when it starts the server: the policy, and what
    a lossy one means."""
    policy = _flag(server_flags, "policy", "dblp")
    if policy == "reliable":
        return ("dblp: DDP's gradients go over DBLP under --policy=reliable:"
                " every float arrives; the mean is gloo's")
    bcast = _flag(server_flags, "bcast_tolerance", "same")
    return (f"dblp: DDP's gradients go over DBLP under --policy={policy} "
            f"(broadcast: {bcast}): a round may close with a bounded share "
            "of its chunks missing, so the ranks' gradients (and losses) "
            "differ slightly from an exact allreduce's; for exact, set "
            "DBLP_SERVER_FLAGS=--policy=reliable (docs/PYTORCH.md)")


class ModelJob:
    """One DDP model's DBLP job, the `index`-th model built on `group`."""

    def __init__(self, group, ddp, index):
        module = ddp.module
        # The ranks' models compared at once, at DDP's construction.
        check_same_model(module, group.exact_group)
        self.group = group
        self.index = index
        self.ddp = weakref.ref(ddp)
        self.floats = sum(int(p.numel()) for p in module.parameters()
                          if p.requires_grad)
        self.worker = None
        self.server = None
        self.failed = None      # why the job could not start
        self.resync_every = 0   # the server's, told at the join
        self.optimizers = []    # what ResyncOptimizer registered
        self.hooked = False     # an explicit comm hook carries it
        self.reduced_at = 0     # ddp.num_iterations at its last step
        self._offset = 0        # floats staged in the step under way
        self._step_iteration = None
        self.res = {}           # what _release frees (worker, server, ...)

    # ---- the job -------------------------------------------------------
    def start(self):
        """The Worker (rank 0 starts the server first); every rank calls
        it at the same step."""
        if self.worker is not None:
            return self.worker
        if self.failed is not None:
            raise self.failed  # never a second server for a failed job
        try:
            return self._start()
        except DblpError as e:
            self.failed = e
            raise

    def _start(self):
        ddp = self.ddp()
        if ddp is None:
            raise DblpError("the DistributedDataParallel of this DBLP job "
                            "is gone")
        try:
            # A model DBLP cannot move may still be built (as on gloo: for
            # inference, its logging data); training it is refused here,
            # before rank 0 starts a server.
            _check_params([(n, p) for n, p in ddp.module.named_parameters()
                           if p.requires_grad])
        except TypeError as e:
            self.group._refuse_job(self, str(e))
            raise DblpError(str(e)) from None
        kwargs = self.group._job_kwargs(self)
        worker = Worker(model=ddp.module, optimizer=self._optimizers,
                        state_group=self.group.exact_group,
                        check_ranks=False, **kwargs)
        self.res["worker"] = worker
        self.resync_every = worker.resync_every
        if self.resync_every and not self.optimizers:
            # Every rank knows it at the join: fail at the first step, not
            # at the first resync.
            self._optimizers()
        self.worker = worker
        return worker

    def _optimizers(self):
        if self.optimizers:
            return list(self.optimizers)
        raise DblpError(
            f"the dblp-server re-synchronises the replicas' parameters every"
            f" {self.resync_every} steps, and their optimizer's state"
            " (momentum, Adam's moments) must be averaged with them, or the "
            "replicas drift apart again at once: wrap the optimizer, "
            "opt = dblp.distributed.ResyncOptimizer(opt, ddp), or run "
            "without resyncs (DBLP_SERVER_FLAGS=--resync_every=0, or "
            "--policy=reliable)")

    # ---- DDP's default path --------------------------------------------
    def wants_step(self):
        """Whether this model ran a forward pass whose gradient it has not
        reduced yet (DDP counts its forward passes that will reduce). A
        model under a comm hook of the user's never sends buckets to the
        group, yet counts its forward passes too: torch has no way to ask
        a DDP for its hook during a backward pass (the logging data that
        names it waits for the reducer's lock, held there)."""
        ddp = self.ddp()
        return (ddp is not None and not self.hooked and
                ddp.num_iterations != self.reduced_at)

    def in_step(self):
        """Whether a step of this model has buckets in and more to come
        (not one a later forward pass abandoned)."""
        ddp = self.ddp()
        return (self._offset != 0 and ddp is not None and
                ddp.num_iterations == self._step_iteration)

    def push(self, bucket):
        """One bucket of DDP's default path: its future completes with the
        bucket's slice of the mean once the step's last bucket is in. The
        reducer has divided the bucket by the world size (it expects the
        allreduce to sum); DBLP's server averages the gradients themselves,
        so they go in multiplied back."""
        worker = self.start()
        ddp = self.ddp()
        iteration = ddp.num_iterations if ddp is not None else None
        first = self._offset == 0 or iteration != self._step_iteration
        if first:
            self._offset, self._step_iteration = 0, iteration
        n = bucket.numel()
        self._offset += n
        is_last = self._offset >= self.floats
        if is_last:
            self._offset = 0
            self.reduced_at = iteration
        return worker.push_bucket(bucket, is_last, in_backward=True,
                                  index=0 if first else None,
                                  scale=float(self.group.size()))


def job_kwargs(group, job, store, timeout_s):
    """The Worker's arguments for `job`: its server (started here on rank 0
    unless DBLP_SERVER names one), the secret and this rank's port."""
    env = os.environ
    transport = env.get("DBLP_TRANSPORT", "dpdk")
    if transport not in ("dpdk", "udp"):
        raise DblpError(f"DBLP_TRANSPORT={transport}: use dpdk or udp")
    rank = group.rank()
    out = env.get("DBLP_OUT") or None
    if out and job.index:
        out = os.path.join(out, f"model{job.index}")
    server = env.get("DBLP_SERVER")
    if server and job.index:
        raise DblpError("DBLP_SERVER names one running dblp-server, and a "
                        "second DDP model on this group needs a job of its "
                        "own: unset DBLP_SERVER (rank 0 starts one server "
                        "per model) or give the model its own group")
    if server and not env.get("DBLP_SECRET_FILE"):
        raise DblpError("DBLP_SERVER names a running dblp-server: give its "
                        "job secret in DBLP_SECRET_FILE (rank 0 hands one out"
                        " only for a server it starts)")
    if env.get("DBLP_EAL") and not server:
        raise DblpError("DBLP_EAL puts the workers on a NIC, and the server "
                        "rank 0 would start is on the memif cluster: start a "
                        "dblp-server on the NIC and name it in DBLP_SERVER "
                        "(with DBLP_SECRET_FILE)")
    key = f"server/{job.index}"
    timeout_flag = f"--round_timeout_ms={int(timeout_s * 1000)}"
    if server is None and rank == 0:
        group._start_server(job, transport, timeout_flag, out, key)
    if server is None:
        # Rank 0 publishes once its server listens (or the error).
        info = store.get(key).decode()
        if info.startswith("error:"):
            raise DblpError("rank 0 could not start the dblp-server: " +
                            info[6:])
        server, sockets = info.split(" ", 1)
    else:
        sockets = ""
    kw = dict(server=server, transport=transport, name=f"rank{rank}",
              answer_timeout=timeout_s, round_timeout=timeout_s,
              out_dir=out and os.path.join(out, f"rank{rank}"),
              worker_flags=shlex.split(env.get("DBLP_WORKER_FLAGS", "")))
    if transport == "dpdk":
        if env.get("DBLP_EAL"):
            local = env.get("LOCAL_RANK", str(rank))
            kw["eal"] = shlex.split(env["DBLP_EAL"].replace("{local_rank}",
                                                            local))
        elif sockets:
            # One socket, or one per server shard joined by ";".
            mine = sockets.split(",")[rank]
            kw["memif_socket"] = mine.split(";") if ";" in mine else mine
        else:
            raise DblpError(
                "DBLP_SERVER names a dblp-server: give this rank's port in "
                "DBLP_EAL (e.g. '-l 3 -a 0000:3b:00.0'), or unset DBLP_SERVER"
                " to let rank 0 start one on this host")
    return kw


def release(res):
    """Each resource of one job, whatever became of the one before it."""
    w = res.pop("worker", None)
    s = res.pop("server", None)
    tmp = res.pop("secret", None)
    try:
        if w is not None:
            w.close()
    finally:
        try:
            if s is not None:
                try:
                    # The slowest rank's BYE ends the server.
                    s.wait(timeout=res.get("server_wait_s", 300))
                finally:
                    s.close()
        finally:
            if tmp:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass


def print_notice(text):
    print(text, file=sys.stderr, flush=True)
