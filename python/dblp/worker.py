"""dblp.Worker: one training process's end of a DBLP job (its dblp-worker
process and the shared-memory hand-off), and the checks a model passes
before a job is started for it. See docs/PYTORCH.md."""

import atexit
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref

from . import _native
from .errors import DblpError
from ._launch import (IDLE_DEEP_SLEEP_US, remove_runtime_dir, stop,
                      worker_command, worker_prefix)

__all__ = ["Worker", "check_same_model"]

_SLICE_MS = 100
_names = itertools.count()


def _torch():
    import torch  # late: the package imports without torch for tooling

    return torch


def _layers_of(named_params):
    return [(name[:55], int(p.numel())) for name, p in named_params]


def _check_world_size(expect_workers):
    """A job for N workers joined by a torch.distributed job of M != N ranks
    would wait for the missing joins; say so now, naming both."""
    if expect_workers is None:
        return
    dist = _torch().distributed
    if dist.is_available() and dist.is_initialized():
        ranks = dist.get_world_size()
        if ranks != expect_workers:
            raise DblpError(
                f"the dblp-server expects {expect_workers} workers and this "
                f"torch.distributed job has {ranks} ranks: start the server "
                f"with --workers={ranks} (dblp.LocalServer({ranks}))")


def _exact_group(group=None):
    """`group`, or torch.distributed's default one when initialised (else
    None); never DBLP itself: the dblp backend's inner gloo group."""
    dist = _torch().distributed
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.distributed_c10d._get_default_group()
    return getattr(group, "exact_group", group)


def check_same_model(model, group=None):
    """Every rank of `group` (torch.distributed's default one) has the same
    trainable layout, or every rank raises DblpError naming both sides, at
    once: not a wait for the server's join, which would refuse the odd one
    out and leave the others waiting. A collective: every rank calls it."""
    torch = _torch()
    group = _exact_group(group)
    if group is None:
        return
    module = getattr(model, "module", model)
    shapes = [tuple(p.shape) for p in module.parameters() if p.requires_grad]
    floats = sum(int(torch.Size(s).numel()) for s in shapes)
    digest = hash(tuple(shapes)) & 0x7FFFFFFFFFFF  # ints: the same anywhere
    mine = torch.tensor([floats, len(shapes), digest], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(group.size())]
    group.allgather([every], [mine]).wait()
    for r, theirs in enumerate(every):
        if not torch.equal(theirs, every[0]):
            raise DblpError(
                f"the ranks' models differ: rank 0 has {int(every[0][0])} "
                f"trainable floats in {int(every[0][1])} tensors, rank {r} "
                f"{int(theirs[0])} in {int(theirs[1])}; every rank must build"
                " the same model")


def _check_params(named_params):
    """Refuses, at registration, a model whose gradient DBLP cannot move
    (rather than at the first backward)."""
    torch = _torch()
    devices = set()
    for name, p in named_params:
        if p.dtype != torch.float32 or p.device.type not in ("cpu", "cuda"):
            raise TypeError(
                f"parameter {name!r} is {p.dtype} on {p.device}: dblp moves "
                "float32 gradients of CPU or CUDA models (model.float())")
        devices.add(p.device)
    if len(devices) > 1:
        raise TypeError(f"the model's parameters are on {sorted(map(str, devices))}:"
                        " dblp moves one device's model per Worker")


class Worker:
    """One training process's DBLP worker.

    server:       dblp-server's (or dblp-udp-server's) control address.
    model:        an nn.Module (or DDP's): the gradient is its parameters with
                  requires_grad, flattened in named_parameters() order; also
                  used for the server's parameter re-synchronisation.
    check_ranks:  with model= under torch.distributed, first compare the
                  model across the ranks (a collective: every rank builds
                  its Worker), so a mismatch fails at once on all of them.
    optimizer:    the model's optimizer (or a list, or a callable returning
                  them): at each of the server's resyncs its per-parameter
                  state (momentum, Adam's moments) is averaged too, exactly,
                  over torch.distributed's group (or state_group=).
    floats:       the gradient size when there is no model (no resync then).
    transport:    "dpdk" (dblp-worker, poll-mode) or "udp" (dblp-udp-worker,
                  kernel sockets: where DPDK cannot run).
    memif_socket: dpdk: join a local memif cluster through this socket (the
                  EAL options are built for you), or these sockets, one per
                  server shard (LocalServer(shards=).worker_kwargs gives
                  them); or give `eal` yourself.
    eal:          dpdk: EAL arguments (e.g. ["-l", "1", "-a", "0000:3b:00.0"]).
    secret_file / insecure: the job secret (docs/SECURITY.md).
    worker_flags: extra dblp-worker flags (e.g. ["--bcast_fill=prev"]).
    out_dir:      the worker's rows (iterations.jsonl) and its log.
    shm:          create the hand-off under this name and start no process:
                  start `dblp-worker --gradient=shm --shm=NAME` yourself
                  (e.g. as root, under systemd) once this constructor runs;
                  it waits join_timeout seconds for the join.
    """

    def __init__(self, server="127.0.0.1:9100", *, model=None, floats=None,
                 transport="dpdk", memif_socket=None, eal=None,
                 secret_file=None, insecure=False, name=None, worker_flags=(),
                 out_dir=None, shm=None, join_timeout=60.0,
                 answer_timeout=1800.0, lcore=None, expect_workers=None,
                 round_timeout=None, optimizer=None, state_group=None,
                 check_ranks=True):
        torch = _torch()
        _check_world_size(expect_workers)
        if transport not in ("dpdk", "udp"):
            raise ValueError(f"transport={transport!r}: use 'dpdk' or 'udp'")
        self._model = model
        self._optimizer = optimizer
        self._state_group = state_group
        params = self._params()
        if params is not None:
            _check_params(params)
            if check_ranks:
                check_same_model(model, state_group)
            layers = _layers_of(params)
            n = sum(f for _, f in layers)
            if floats is not None and floats != n:
                raise ValueError(f"floats={floats}, but the model has {n} "
                                 "trainable floats: drop floats=")
            floats = n
        else:
            layers = []
        if not floats or floats <= 0:
            raise ValueError("give model= (an nn.Module) or floats=N")
        if not insecure and not secret_file and shm is None:
            raise ValueError("give secret_file= (the job secret, 0600) or "
                             "insecure=True (docs/SECURITY.md)")
        self.name = name or f"trainer-{os.getpid()}"
        self.transport = transport
        self.answer_timeout = answer_timeout
        self.history = []      # one info dict per exchange
        self._pid = os.getpid()  # a fork()ed child must not end our job
        self._broken = None    # why exchanges can no longer be trusted
        self._tmp_log_dir = None
        self._proc = None
        self._own_prefix = None  # the --file-prefix this Worker made
        self._claims = []        # its dblp-worker's lcore claim
        self._log_path = None
        self._closed = False
        self._iteration = 0    # protocol iteration (resyncs included)
        self._bucket_offset = 0
        self._pending = []
        self._copy_s = 0.0
        self._step_error = None  # the DDP step's failure, until its end
        self._staging = None   # CUDA models: _CudaStaging
        shm_name = shm or f"/dblp-{os.getpid()}-{next(_names)}"
        self._ch = _native.Channel(shm_name, floats, layers)
        try:
            self.gradient = torch.frombuffer(self._ch.gradient(),
                                             dtype=torch.float32)
            self.mean = torch.frombuffer(self._ch.mean(), dtype=torch.float32)
            if shm is None:
                flags = [f"--join_timeout_ms={int(join_timeout * 1000)}",
                         "--round_timeout_ms=%d" % int(
                             (round_timeout or answer_timeout) * 1000)]
                if eal is None:
                    # memif or kernel UDP: sleep through the trainer's step.
                    # Not on a NIC, whose RX ring a 500 us nap at 25 Gb/s
                    # could overflow.
                    flags.append(f"--idle_deep_sleep_us={IDLE_DEEP_SLEEP_US}")
                self._spawn(server, transport, memif_socket, eal, secret_file,
                            insecure, flags + list(worker_flags), out_dir,
                            lcore)
            self._await_join(join_timeout)
            # Both ends hold their mappings now: the name can go, so no
            # crash of either leaves an object in /dev/shm.
            self._ch.unlink()
            if self.resync_every and self._model is None:
                raise DblpError(
                    f"the server re-synchronises parameters every "
                    f"{self.resync_every} steps, and this Worker has no "
                    "model: give dblp.Worker(model=...), or run the server "
                    "with --resync_every=0")
        except BaseException:
            self._teardown()
            raise
        # A script that never calls close() still ends the job cleanly
        # (BYE): otherwise the server would count it as lost.
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref()._close_quietly())

    # ---- set-up --------------------------------------------------------
    def _params(self):
        if self._model is None:
            return None
        module = getattr(self._model, "module", self._model)  # DDP wraps
        return [(n, p) for n, p in module.named_parameters()
                if p.requires_grad]

    def _spawn(self, server, transport, memif_socket, eal, secret_file,
               insecure, worker_flags, out_dir, lcore):
        cmd = worker_command(
            transport, server=server, shm=self._ch.name, name=self.name,
            memif_socket=memif_socket, eal=eal, secret_file=secret_file,
            insecure=insecure, out_dir=out_dir, extra=worker_flags,
            lcore=lcore, claims=self._claims)
        log_dir = out_dir
        if not log_dir:
            log_dir = self._tmp_log_dir = tempfile.mkdtemp(
                prefix="dblp-worker-")
        os.makedirs(log_dir, exist_ok=True)
        self._log_path = os.path.join(log_dir, f"{self.name}.log")
        self.command = cmd
        if transport == "dpdk" and eal is None:
            self._own_prefix = worker_prefix(self._ch.name)
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(cmd, stdout=log,
                                          stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)

    def _log_tail(self, lines=8):
        if not self._log_path or not os.path.exists(self._log_path):
            return ""
        with open(self._log_path, "rb") as f:
            tail = f.read().decode(errors="replace").strip().splitlines()
        return "\n  ".join(tail[-lines:])

    def _worker_gone(self):
        """Why the dblp-worker cannot answer any more, or None."""
        if self._proc is not None:
            rc = self._proc.poll()
            if rc is None:
                return None
            return (f"dblp-worker ({self.name}) exited with code {rc}; its "
                    f"log ({self._log_path}) ends:\n  {self._log_tail()}")
        pid = self._ch.worker_pid
        if pid and not _native.process_alive(pid):
            return f"dblp-worker (pid {pid}) is gone"
        return None

    def _failure(self):
        if self._ch.state == _native.STATE_FAILED:
            return f"dblp-worker ({self.name}) failed: {self._ch.error}"
        return self._worker_gone()

    def _await_join(self, timeout):
        deadline = time.monotonic() + timeout
        while self._ch.state == _native.STATE_STARTING:
            self._ch.wait_state(_native.STATE_STARTING, _SLICE_MS)
            why = self._worker_gone()
            if why and self._ch.state == _native.STATE_STARTING:
                raise DblpError(why)
            if time.monotonic() > deadline:
                raise DblpError(
                    f"dblp-worker ({self.name}) did not join within "
                    f"{timeout:.0f} s (is the server up and expecting this "
                    f"many workers?); log:\n  {self._log_tail()}")
        if self._ch.state != _native.STATE_JOINED:
            raise DblpError(self._failure() or "dblp-worker ended at join")
        self.rank = self._ch.rank
        self.num_workers = self._ch.num_workers
        self.resync_every = self._ch.resync_every

    # ---- the exchange --------------------------------------------------
    def _is_resync(self, it):
        k = self.resync_every
        return k != 0 and (it + 1) % (k + 1) == 0

    def _post_and_wait(self, kind):
        if self._closed:
            raise DblpError("this dblp.Worker is closed")
        if self._broken:
            raise DblpError("this dblp.Worker is out of step after an earlier"
                            f" failure ({self._broken}); start a new one")
        try:
            return self._post_and_wait_once(kind)
        except BaseException as e:
            # An answer may still be on its way (Ctrl-C, a timeout): a
            # retry would take it for its own.
            self._broken = str(e) or type(e).__name__
            raise

    def _post_and_wait_once(self, kind):
        it = self._iteration
        seen = self._ch.answers
        self._ch.post(kind, it)
        deadline = time.monotonic() + self.answer_timeout
        while not self._ch.wait_answer(seen, _SLICE_MS):
            why = self._worker_gone()
            if why:
                raise DblpError(why)
            if time.monotonic() > deadline:
                raise DblpError(
                    f"no mean for iteration {it} in {self.answer_timeout:.0f}"
                    " s (another worker stalled? raise answer_timeout=)")
        woke = _native.monotonic_ns()
        why = self._failure() if self._ch.state != _native.STATE_JOINED \
            else None
        if why:
            raise DblpError(why)
        info = self._ch.info()
        if info["iteration"] != it:
            raise DblpError(f"dblp-worker answered iteration "
                            f"{info['iteration']} for {it}")
        info["rank"] = self.rank
        info["trainer_wake_ns"] = woke
        # Both wake-ups: trainer -> worker, and worker -> trainer.
        info["handoff_us"] = ((info["worker_wake_ns"] -
                               info["trainer_post_ns"]) +
                              (woke - info["worker_post_ns"])) / 1e3
        self._iteration += 1
        self.history.append(info)
        return info

    def _resync(self):
        """The server's parameter re-synchronisation: push the parameters,
        load the average. The gradient already in place is kept aside."""
        torch = _torch()
        params = self._params()
        if params is None:
            raise DblpError(
                f"the server re-synchronises parameters every "
                f"{self.resync_every} steps, and this Worker has no model: "
                "give dblp.Worker(model=...), or run the server with "
                "--resync_every=0")
        # Before anything moves: a job that cannot average its optimizer's
        # state says so while every rank is still in step.
        optimizers = self._optimizers()
        saved = self.gradient.clone()
        with torch.no_grad():
            # Copies, never views: a parameter must not alias the mean,
            # which the next exchange overwrites.
            off = 0
            for _, p in params:
                n = p.numel()
                self.gradient[off:off + n].copy_(p.reshape(-1))
                off += n
            self._post_and_wait(_native.POST_MODEL)
            off = 0
            for _, p in params:
                n = p.numel()
                p.copy_(self.mean[off:off + n].view_as(p))
                off += n
            self.gradient.copy_(saved)
            self._average_optimizer_state([p for _, p in params],
                                          optimizers)

    def _optimizers(self):
        opt = self._optimizer
        if opt is None:
            return []
        if callable(opt) and not hasattr(opt, "state"):
            opt = opt()
        return list(opt) if isinstance(opt, (list, tuple)) else [opt]

    def _average_optimizer_state(self, params, optimizers):
        """After a resync every replica holds the same parameters; the
        optimizer's per-parameter state (SGD's momentum, Adam's moments)
        must be the same too, or the replicas drift apart again at once
        (measured in docs/PYTORCH.md). Averaged exactly, over the process
        group (torch.distributed's default one unless state_group=), once
        per resync: one all_reduce of the state's floats."""
        torch = _torch()
        # Every rank must add the same tensors in the same order: parameters
        # in the model's order, optimizers by their first parameter there
        # (not the order they are found in), each tensor once.
        where = {id(p): i for i, p in enumerate(params)}
        opts = sorted(optimizers, key=lambda o: min(
            (where.get(id(q), len(where)) for g in o.param_groups
             for q in g["params"]), default=len(where)))
        tensors, seen = [], set()
        for opt in opts:
            for p in params:
                for key in sorted(opt.state.get(p, {}), key=str):
                    v = opt.state[p][key]
                    if (torch.is_tensor(v) and v.is_floating_point() and
                            v.shape == p.shape and id(v) not in seen):
                        seen.add(id(v))
                        tensors.append(v)
        group = _exact_group(self._state_group)
        if group is None:
            if not tensors:
                return
            raise DblpError(
                "optimizer= needs torch.distributed initialised (or "
                "state_group=) to average its state at a resync")
        # The ranks agree on what they average, or all say so: never a sum
        # of unlike tensors.
        sig = torch.tensor([len(tensors), sum(t.numel() for t in tensors)],
                           dtype=torch.int64)
        every = [torch.zeros_like(sig) for _ in range(group.size())]
        group.allgather([every], [sig]).wait()
        if any(not torch.equal(e, every[0]) for e in every):
            raise DblpError(
                "the ranks' optimizer states differ at the resync "
                f"(tensors, floats per rank: {[e.tolist() for e in every]}):"
                " give every rank the same optimizer over the same model")
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        group.allreduce([flat]).wait()
        flat.div_(group.size())
        off = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[off:off + n].view_as(t))
            off += n

    def exchange(self):
        """Push what is in `self.gradient`, return `self.mean` (a view:
        valid until the next exchange) and the iteration's info dict
        (delivered_fraction, p, critical, send_latency_us, handoff_us, ...).
        No copy on either side: write the gradient into self.gradient."""
        if self._is_resync(self._iteration):
            try:
                self._resync()
            except BaseException as e:
                # Half a resync (the parameters, not the optimizer's state)
                # leaves this rank out of step with the others.
                self._broken = self._broken or str(e) or type(e).__name__
                raise
        info = self._post_and_wait(_native.POST_GRADIENT)
        return self.mean, info

    def allreduce_(self, tensor):
        """Replace `tensor` (float32, CPU, as many elements as the
        gradient) by the DBLP mean of every worker's; returns the info.
        One copy each way unless `tensor` is self.gradient."""
        torch = _torch()
        flat = self._check(tensor)
        if flat.data_ptr() != self.gradient.data_ptr():
            self.gradient.copy_(flat)
        _, info = self.exchange()
        with torch.no_grad():
            flat.copy_(self.mean)
        return info

    def _check(self, tensor):
        torch = _torch()
        if tensor.device.type not in ("cpu", "cuda") or \
                tensor.dtype != torch.float32:
            raise TypeError("dblp moves float32 CPU or CUDA tensors (got "
                            f"{tensor.dtype} on {tensor.device})")
        if tensor.numel() != self.gradient.numel():
            raise ValueError(f"tensor of {tensor.numel()} floats; this job "
                             f"moves {self.gradient.numel()}")
        if not tensor.is_contiguous():
            raise ValueError("give a contiguous tensor")
        return tensor.view(-1)

    # ---- DDP buckets (dblp.torch.comm_hook) ----------------------------
    def push_bucket(self, flat, is_last, in_backward=False, index=None,
                    scale=1.0, error=None):
        """Stage one DDP bucket at the next offset; the last bucket of the
        step runs the exchange. Returns a Future completed with the
        bucket's slice of the mean. `index`: DDP's bucket index (0 starts
        a step, whatever happened to the one before). `scale`: what the
        whole gradient is multiplied by before the exchange (DDP's default
        path divides each bucket by the world size before its allreduce;
        the policy must see the gradient's own norm). `error`: this bucket
        could not be made (a wrapped hook failed): the step fails with it.

        If the step fails, the futures are failed with the DblpError; with
        in_backward=True (DDP's comm hook) they complete with their own
        buckets instead and the DblpError is raised by the backward pass
        once DDP has finished it, so `except dblp.DblpError` around
        loss.backward() catches it and DDP is left consistent."""
        torch = _torch()
        if index == 0 and self._pending:
            self._end_step()  # a step that never reached its last bucket
        if error is not None and self._step_error is None:
            self._step_error = error
        n = flat.numel()
        off = self._bucket_offset
        fut = torch.futures.Future()
        self._pending.append((fut, off, n, flat))
        self._bucket_offset += n
        if self._step_error is None:
            try:
                if off + n > self.gradient.numel():
                    raise DblpError(
                        f"DDP's buckets hold more than the gradient's "
                        f"{self.gradient.numel()} floats: give dblp.Worker "
                        "the same model as DDP")
                t0 = time.perf_counter()
                staging = self._staging_for(flat)
                if staging is not None:
                    staging.to_host(self.gradient[off:off + n], flat)
                else:
                    self.gradient[off:off + n].copy_(flat.view(-1))
                self._copy_s += time.perf_counter() - t0
            except Exception as e:
                self._step_error = e
        if not is_last:
            return fut
        pending = self._pending
        if self._step_error is None:
            try:
                if off + n != self.gradient.numel():
                    raise DblpError(f"DDP's buckets hold {off + n} floats, "
                                    f"the gradient {self.gradient.numel()}: "
                                    "give dblp.Worker the same model as DDP")
                if self._staging is not None:
                    self._staging.wait()  # every bucket is in the region
                if scale != 1.0:
                    self.gradient.mul_(scale)
                _, info = self.exchange()
                info["copy_in_us"] = self._copy_s * 1e6
                info["buckets"] = len(pending)
                # Tensors of their own storage, each starting at its slice:
                # DDP reads a hook's result with as_strided(offset) counted
                # from the storage's start, so a view into self.mean
                # (storage offset o) would hand every bucket but the first
                # another part of the mean. No copy: DDP copies the result
                # into .grad before the next step.
                results = [self.mean_slice(o, k) for _, o, k, _ in pending]
                if self._staging is not None:
                    results = [self._staging.to_device(m, b)
                               for m, (_, _, _, b) in zip(results, pending)]
            except Exception as e:
                self._step_error = e
        if self._step_error is not None:
            self._fail_pending(self._step_error, in_backward)
            return fut
        self._pending = []
        self._end_step()
        for (f, _, _, _), r in zip(pending, results):
            f.set_result(r)
        return fut

    def _end_step(self):
        stale = [f for f, _, _, _ in self._pending if not f.done()]
        self._pending, self._bucket_offset, self._copy_s = [], 0, 0.0
        self._step_error = None
        for f in stale:
            f.set_exception(DblpError("the DDP step ended before its last "
                                      "bucket"))

    def _staging_for(self, tensor):
        if tensor.device.type != "cuda":
            return None
        if self._staging is None:
            self._staging = _CudaStaging(self, tensor.device)
        elif self._staging.device != tensor.device:
            raise DblpError(f"a bucket on {tensor.device}, the model on "
                            f"{self._staging.device}: one device per Worker")
        return self._staging

    def mean_slice(self, offset, count):
        """self.mean[offset:offset + count] as a tensor whose storage starts
        at `offset` (storage_offset() == 0); valid until the next
        exchange."""
        return _torch().frombuffer(self._ch.mean(), dtype=_torch().float32,
                                   offset=4 * offset, count=count)

    def _fail_pending(self, error, in_backward):
        """Ends the step's staged buckets with `error`; the next step starts
        from the first offset."""
        pending, self._pending = self._pending, []
        self._end_step()
        if not isinstance(error, DblpError):
            error = DblpError(f"{type(error).__name__}: {error}")
        if not in_backward:
            for f, _, _, _ in pending:
                if not f.done():
                    f.set_exception(error)
            return
        # DDP's C++ reducer cannot take an exception from a hook's future
        # (it would report "Unable to cast ... to Tensor") and a hook that
        # raises leaves it mid-reduction. So the buckets complete as they
        # are, and a callback queued behind DDP's own (a callback that
        # queues another runs after every callback already queued) raises
        # the error out of backward(). The gradients are this rank's own:
        # the backward pass raises, so no step takes them for the mean.
        # Called once per failed step, at its last bucket.
        for f, _, _, flat in pending:
            if not f.done():
                f.set_result(flat)
        raise_after_backward(error)

    # ---- the end ---------------------------------------------------------
    def close(self, timeout=30.0):
        """End the job for this worker (BYE) and wait for its dblp-worker.
        Raises DblpError if it failed."""
        if self._closed or os.getpid() != self._pid:
            return
        why = None
        if self._ch.state == _native.STATE_JOINED:
            self._ch.post(_native.POST_END, self._iteration)
            deadline = time.monotonic() + timeout
            while self._ch.state == _native.STATE_JOINED and \
                    time.monotonic() < deadline and not self._worker_gone():
                self._ch.wait_state(_native.STATE_JOINED, _SLICE_MS)
            if self._ch.state == _native.STATE_FAILED:
                why = self._failure()
        if self._proc is not None:
            try:
                rc = self._proc.wait(timeout=timeout)
                if rc != 0 and why is None:
                    why = self._worker_gone()
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
                why = why or f"dblp-worker ({self.name}) did not exit"
        self._teardown()
        if why:
            raise DblpError(why)

    def abort(self, why, timeout=10.0):
        """Ends this worker's part of the job on the trainer's error `why`:
        its dblp-worker fails the job naming it, and the server tells the
        other workers (a BYE would read as a finish with fewer steps)."""
        if self._closed or os.getpid() != self._pid:
            return
        if self._ch.state == _native.STATE_JOINED:
            self._ch.post_abort(str(why), self._iteration)
            deadline = time.monotonic() + timeout
            while self._ch.state == _native.STATE_JOINED and \
                    time.monotonic() < deadline and not self._worker_gone():
                self._ch.wait_state(_native.STATE_JOINED, _SLICE_MS)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass  # _teardown stops it
        self._teardown()

    def _close_quietly(self):
        """At exit: a BYE, or an abort naming the uncaught exception the
        interpreter is ending on (Ctrl-C's KeyboardInterrupt included)."""
        why = _uncaught_exception()
        try:
            if why is not None:
                self.abort(why)
            else:
                self.close()
        except DblpError as e:
            print(f"dblp: {e}", file=sys.stderr)

    def _teardown(self):
        if os.getpid() != self._pid:
            return  # a fork()ed child: the process and the object are not ours
        self._closed = True
        if self._proc is not None:
            stop(self._proc)
            if self._own_prefix:
                remove_runtime_dir(self._own_prefix)
        for c in self._claims:
            c.release()
        if self._staging is not None:
            self._staging.close()
            self._staging = None
        if self._ch is not None:
            self._ch.unlink()  # idempotent: gone already once joined
        if self._tmp_log_dir and self._proc is not None and \
                self._proc.returncode == 0:
            shutil.rmtree(self._tmp_log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self._teardown()
        return False

    def __del__(self):
        # Dropped without close() (DDP and the process group freed at the
        # end of a script): end the job with a BYE, as at exit, so the
        # server does not count this worker as lost.
        try:
            if not self._closed:
                try:
                    self.close(timeout=10.0)
                except Exception:
                    self._teardown()
        except Exception:
            pass



def _uncaught_exception():
    """The exception the interpreter is exiting on, as text, or None: an
    uncaught exception's traceback is printed before the atexit handlers
    run, and leaves it in sys.last_value."""
    e = getattr(sys, "last_value", None)
    if e is None:
        return None
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def raise_after_backward(error):
    """Raises `error` out of the backward pass under way, once DDP's own
    end-of-backward callback has run (a callback that queues another runs
    after every callback already queued): DDP is left consistent, and
    `except dblp.DblpError` around loss.backward() catches it."""
    engine = _torch().autograd.Variable._execution_engine

    def raise_error():
        raise error

    engine.queue_callback(lambda: engine.queue_callback(raise_error))


class _CudaStaging:
    """CUDA buckets through the shared region. The region (gradient and
    mean) is registered as pinned host memory (cudaHostRegister), so each
    bucket's device-to-host copy is a DMA on a side stream that overlaps the
    backward pass of the buckets after it; the mean goes back to the device
    one bucket at a time on the current stream. GPUDirect (the NIC reading
    GPU memory: DPDK gpudev) would remove both copies; it is not built."""

    def __init__(self, worker, device):
        torch = _torch()
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._cudart = torch.cuda.cudart()
        self._registered = []
        for t in (worker.gradient, worker.mean):
            ptr, nbytes = t.data_ptr(), t.numel() * 4
            rc = self._cudart.cudaHostRegister(ptr, nbytes, 0)
            if int(rc) != 0:
                self.close()
                raise DblpError(f"cudaHostRegister of the shared region "
                                f"failed ({rc}): the bucket copies would not "
                                "be DMA; is the CUDA driver loaded?")
            self._registered.append(ptr)

    def to_host(self, dst, bucket):
        torch = _torch()
        # The bucket is ready on the current stream: copy it after that.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(bucket.view(-1), non_blocking=True)
        bucket.record_stream(self.stream)

    def wait(self):
        self.stream.synchronize()

    def to_device(self, mean, like):
        # The next exchange rewrites the region only after the next step's
        # copies, which wait for this stream's work (to_host).
        out = _torch().empty_like(like)
        out.view(-1).copy_(mean, non_blocking=True)
        return out

    def close(self):
        for ptr in self._registered:
            self._cudart.cudaHostUnregister(ptr)
        self._registered = []
