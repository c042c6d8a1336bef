"""The ``dblp`` torch.distributed backend.

    import dblp.distributed                       # registers "dblp"
    dist.init_process_group("dblp")               # under torchrun
    ddp = DDP(model)                              # its gradients go over DBLP

A ``ProcessGroupDBLP`` holds an inner gloo group on the same store, and
every collective but DBLP's goes to it unchanged: DDP's parameter broadcast,
barriers, ``all_gather``, a loss averaged for logging. When a
``DistributedDataParallel`` is built on the group, the group joins a DBLP
job for that model (rank 0 starts the server unless ``DBLP_SERVER`` names
one) and registers ``dblp.torch.comm_hook``: from then on every DDP step is
one DBLP iteration, under the policy the server runs (bounded loss). Every
``all_reduce`` is exact, over gloo: a parameter average or a metric must
not be lossy. A gradient of your own goes over DBLP with
``group.allreduce_gradient_(flat)`` (the model's size, float32 CPU: the
SUM, as all_reduce's).

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
from torch.nn.parallel import DistributedDataParallel

from . import DblpError, Worker, check_same_model
from ._launch import LocalServer
from . import torch as _hook

__all__ = ["ProcessGroupDBLP", "BACKEND"]

BACKEND = "dblp"
_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)

# The collectives that go to the inner gloo group as they are.
_DELEGATED = ["allreduce_coalesced", "allgather", "_allgather_base",
              "allgather_coalesced", "broadcast", "barrier", "reduce",
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
        self.worker = None     # the Worker, once a DDP model is attached
        self._server = None    # rank 0's LocalServer
        # What to release (worker, server, secret copy): held apart from
        # self, so the finalizer can release it when the group is gone.
        self._res = {}
        weakref.finalize(self, ProcessGroupDBLP._release, self._res)

    def getBackendName(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def __repr__(self):
        return f"ProcessGroupDBLP(rank={self.rank()}, size={self.size()})"

    # ---- collectives -----------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """Exact, over gloo: DDP's gradients reach DBLP through the comm
        hook, and anything else (a parameter average, a metric) must not
        lose a float."""
        if opts is None:
            return self._gloo.allreduce(tensors)
        return self._gloo.allreduce(tensors, opts)

    def allreduce_gradient_(self, flat):
        """The SUM of every rank's `flat` (float32, CPU, the attached
        model's gradient size) over DBLP, under the server's policy: what
        the DDP hook does, for a gradient of your own."""
        w = self.worker
        if w is None:
            raise DblpError("no DBLP job yet: build a DistributedDataParallel"
                            " on this group first (that joins it)")
        w.allreduce_(flat)
        flat.mul_(self.size())
        return flat

    # ---- the DBLP job ----------------------------------------------------
    def attach(self, ddp):
        """Joins this group's DBLP job with `ddp`'s model and registers the
        comm hook. Called by DistributedDataParallel's constructor."""
        if self.worker is not None:
            raise DblpError("this dblp process group already carries a DDP "
                            "model's gradients: give the second model its "
                            "own group (dist.new_group(backend='dblp'))")
        model = ddp.module
        # Before rank 0 starts a server for a job that cannot run.
        check_same_model(model, self._gloo)
        kwargs = self._job(model)
        params = {id(p) for p in model.parameters() if p.requires_grad}
        self.worker = Worker(model=model, optimizer=lambda: _optimizers_of(
            params), state_group=self._gloo, check_ranks=False, **kwargs)
        self._res["worker"] = self.worker
        ddp.register_comm_hook(self.worker, _hook.comm_hook)

    def _job(self, model):
        """The Worker's arguments: the server (started here on rank 0 unless
        DBLP_SERVER names one), the secret and this rank's port."""
        env = os.environ
        transport = env.get("DBLP_TRANSPORT", "dpdk")
        if transport not in ("dpdk", "udp"):
            raise DblpError(f"DBLP_TRANSPORT={transport}: use dpdk or udp")
        rank = self.rank()
        timeout_s = max(1.0, self._timeout.total_seconds())
        timeout_flag = f"--round_timeout_ms={int(timeout_s * 1000)}"
        out = env.get("DBLP_OUT") or None
        server = env.get("DBLP_SERVER")
        if server and not env.get("DBLP_SECRET_FILE"):
            raise DblpError("DBLP_SERVER names a running dblp-server: give "
                            "its job secret in DBLP_SECRET_FILE (rank 0 "
                            "hands one out only for a server it starts)")
        if env.get("DBLP_EAL") and not server:
            raise DblpError("DBLP_EAL puts the workers on a NIC, and the "
                            "server rank 0 would start is on the memif "
                            "cluster: start a dblp-server on the NIC and "
                            "name it in DBLP_SERVER (with DBLP_SECRET_FILE)")
        if server is None and rank == 0:
            self._start_server(transport, model, timeout_flag, out)
        if server is None:
            # Rank 0 publishes once its server listens (or the error).
            info = self._store.get("server").decode()
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
        kw.update(self._secret())
        if transport == "dpdk":
            if env.get("DBLP_EAL"):
                local = env.get("LOCAL_RANK", str(rank))
                kw["eal"] = shlex.split(env["DBLP_EAL"].replace(
                    "{local_rank}", local))
            elif sockets:
                # One socket, or one per server shard joined by ";".
                mine = sockets.split(",")[rank]
                kw["memif_socket"] = mine.split(";") if ";" in mine else mine
            else:
                raise DblpError(
                    "DBLP_SERVER names a dblp-server: give this rank's port "
                    "in DBLP_EAL (e.g. '-l 3 -a 0000:3b:00.0'), or unset "
                    "DBLP_SERVER to let rank 0 start one on this host")
        return kw

    def _start_server(self, transport, model, timeout_flag, out):
        size = self.size()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        if transport == "dpdk":
            if local != size:
                msg = (f"the memif cluster is one host, and this job has "
                       f"{size} ranks of which {local} here: set "
                       "DBLP_TRANSPORT=udp, or DBLP_SERVER and DBLP_EAL for "
                       "a NIC")
                self._store.set("server", "error:" + msg)
                raise DblpError(msg)
        floats = sum(p.numel() for p in model.parameters() if p.requires_grad)
        flags = ["--rank_order=name", timeout_flag] + shlex.split(
            os.environ.get("DBLP_SERVER_FLAGS", ""))
        secret = os.environ.get("DBLP_SECRET_FILE")
        host = "127.0.0.1"
        if transport == "udp":
            host = _resolve(os.environ.get("MASTER_ADDR", "127.0.0.1"))
            if local != size and host.startswith("127."):
                msg = (f"MASTER_ADDR resolves to {host} on rank 0, which the "
                       "other hosts cannot reach: give MASTER_ADDR as this "
                       "host's address on their network")
                self._store.set("server", "error:" + msg)
                raise DblpError(msg)
        try:
            self._server = LocalServer(
                size, transport, flags, out_dir=out, secret_file=secret,
                host=host, memory_mb=_server_memory_mb(floats),
                timeout=self._timeout.total_seconds(),
                shards=_shards_from_env())
        except Exception as e:
            self._store.set("server", f"error:{e}")
            raise
        res = self._res
        res["server"] = self._server
        res["server_wait_s"] = min(300.0, self._timeout.total_seconds())
        if not secret:
            with open(self._server.secret_file, "rb") as f:
                self._store.set("secret", f.read())
        sockets = ",".join(
            ";".join(p) if isinstance(p, list) else p
            for p in (self._server.socket(r) for r in range(size))) \
            if transport == "dpdk" else ""
        self._store.set("server", f"{self._server.address} {sockets}")

    def _secret(self):
        path = os.environ.get("DBLP_SECRET_FILE")
        if path:
            return dict(secret_file=path)
        if self._server is not None:
            return dict(secret_file=self._server.secret_file)
        fd, tmp = tempfile.mkstemp(prefix="dblp-secret-")
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "wb") as f:
            f.write(self._store.get("secret"))
        self._res["secret"] = tmp
        return dict(secret_file=tmp)

    def shutdown(self):
        """Ends this rank's part of the DBLP job (also when the group is
        collected, or at exit)."""
        self.worker = None
        self._server = None
        ProcessGroupDBLP._release(self._res)

    @staticmethod
    def _release(res):
        """Each resource whatever became of the one before it."""
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


# Every optimizer built in this process (weakly): the one over a DDP
# model's parameters has its state averaged at each resync, without the
# script naming it.
_optimizers = weakref.WeakSet()


def _optimizers_of(params):
    return [o for o in list(_optimizers)
            if any(id(p) in params for g in o.param_groups
                   for p in g["params"])]


def _remember_optimizers(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _optimizers.add(self)

    __init__.__wrapped__ = init
    return __init__


def _create(store, rank, size, timeout):
    return ProcessGroupDBLP(store, rank, size, timeout)


def _attach_after_ddp_init(init):
    def __init__(self, module, *args, **kwargs):
        init(self, module, *args, **kwargs)
        pg = self.process_group
        if isinstance(pg, ProcessGroupDBLP):
            pg.attach(self)

    __init__.__wrapped__ = init
    return __init__


def register():
    """Registers the "dblp" backend (done on import; idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create)
    if not hasattr(DistributedDataParallel.__init__, "__wrapped__"):
        DistributedDataParallel.__init__ = _attach_after_ddp_init(
            DistributedDataParallel.__init__)
    if not hasattr(torch.optim.Optimizer.__init__, "__wrapped__"):
        torch.optim.Optimizer.__init__ = _remember_optimizers(
            torch.optim.Optimizer.__init__)


register()
