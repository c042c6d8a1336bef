"""Command lines for the dblp apps, and a local server for examples and
tests (a dblp-server over memif, or a dblp-udp-server)."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import weakref

from ._lcores import claim_lcore

try:
    from . import _paths
except ImportError:  # running from the source tree without meson
    _paths = None


def find_app(name):
    """The app `name`: $DBLP_APPS, the build tree this package was built
    in, the install prefix, then PATH."""
    dirs = [os.environ.get("DBLP_APPS")]
    if _paths is not None:
        dirs += [_paths.BUILD_APPS, _paths.INSTALL_BINDIR]
    for d in dirs:
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        f"{name} not found: build it (ninja -C build) or set DBLP_APPS to "
        "the directory that holds it")


def _secret_flags(secret_file, insecure):
    return ["--insecure"] if insecure else [f"--secret_file={secret_file}"]


MEMIF_LOG2_RING = 12


def memif_eal(socket_path, prefix, lcore=None, client=True, vdevs=None,
              claims=None):
    """EAL options of one process on the local memif cluster (no NIC, no
    hugepages, its own --file-prefix). Without `lcore`, the CPU _lcores.py
    picks (fewest servers, then fewest claims; `client=False` claims as a
    server); its claim goes into `claims`, for the caller to release when
    the process ends. `socket_path`: one path, or a list (a port per server
    shard, in shard order)."""
    if lcore is None:
        claim = claim_lcore(server=not client)
        if claims is not None:
            claims.append(claim)
        lcore = claim.cpu
    eal = ["-l", str(lcore), "--no-huge", "-m", "256", "--no-pci",
           f"--file-prefix={prefix}", "--log-level=*:warning"]
    if client:
        # One port per server shard, in shard order (port k to shard k).
        paths = [socket_path] if isinstance(socket_path, str) else socket_path
        for k, path in enumerate(paths):
            eal.append(f"--vdev=net_memif{k},role=client,socket={path},id=0")
    for v in vdevs or []:
        eal.append(v)
    # Rings of 2^12 frames (1024 by default): where the poll-mode processes
    # outnumber the cores, a receiver that is not running leaves its sender
    # waiting on a full ring. W = 2 on two cores, exchange of 25 MiB:
    # 36.2-36.3 ms, 2^14 35.7-36.7 ms, the default 39.7-48.5 ms
    # (docs/BENCHMARKS.md "The whole exchange"). The memory is the
    # client's: 16 MiB of shared memory per port (2 rings of 2^12 2-KiB
    # buffers), whose pages fault in at first use: the first 5 exchanges of
    # a 1 MiB gradient take 11 ms instead of 0.8 here (22 with 2^14).
    eal = [e + f",rsize={MEMIF_LOG2_RING}"
           if e.startswith("--vdev=net_memif") else e for e in eal]
    return eal


def worker_command(transport, *, server, shm, name, memif_socket=None,
                   eal=None, secret_file=None, insecure=False, out_dir=None,
                   extra=(), lcore=None, claims=None):
    """The dblp-worker (dpdk) or dblp-udp-worker (udp) command line that
    serves a trainer over `shm` (memif_eal's `claims`)."""
    app = [f"--server={server}", "--gradient=shm", f"--shm={shm}",
           f"--name={name}"] + _secret_flags(secret_file, insecure)
    if out_dir:
        app.append(f"--out_dir={out_dir}")
    app += list(extra)
    if transport == "udp":
        return [find_app("dblp-udp-worker")] + app
    if eal is None:
        if memif_socket is None:
            raise ValueError("transport='dpdk' needs eal=[...] (the port) or "
                             "memif_socket= (the local memif cluster)")
        # The shm name is unique on this host (pid and a counter).
        eal = memif_eal(memif_socket, worker_prefix(shm), lcore,
                        claims=claims)
    return [find_app("dblp-worker")] + list(eal) + ["--"] + app


# The poll loops' second idle stage for processes started by this package:
# a trainer's forward and backward keep the CPU, for at most this much
# delay at a round's first frame (measured in docs/PYTORCH.md).
IDLE_DEEP_SLEEP_US = 500


def worker_prefix(shm):
    """The --file-prefix of the dblp-worker this package starts for `shm`."""
    return "dblp-w" + shm.strip("/").replace("/", "-")


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop(proc, grace=5):
    """Ends `proc` (SIGTERM, then SIGKILL after `grace` seconds)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def remove_runtime_dir(prefix):
    """DPDK's runtime directory of --file-prefix=`prefix`, once its process
    is gone: an app killed by a signal it cannot catch leaves it behind.
    Only for prefixes this package made (dblp-...): never one a user named,
    which another process may share, and never a path."""
    if not prefix.startswith("dblp-") or "/" in prefix or ".." in prefix:
        return
    # Where EAL puts it (src/dpdk/runtime/eal_cleanup.cc says the same).
    if os.geteuid() == 0:
        base = "/var/run"
    else:
        base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    shutil.rmtree(os.path.join(base, "dpdk", prefix), ignore_errors=True)


class LocalServer:
    """A dblp-server (transport="dpdk": memif, one socket per worker, no NIC)
    or dblp-udp-server (transport="udp") on this host, with a fresh job
    secret, for `workers` trainers. Use as a context manager; each trainer
    gets its Worker arguments from worker_kwargs(rank).

    shards: dpdk only: this many dblp-server processes, each adding and
    broadcasting its slice of the chunks (--shards), each on a core of its
    own where the host has one; a worker then has one memif port per shard."""

    def __init__(self, workers, transport="dpdk", server_flags=(),
                 out_dir=None, ready_timeout=30.0, secret_file=None,
                 host="127.0.0.1", memory_mb=512, lcore=None,
                 timeout=1800.0, idle_deep_sleep_us=IDLE_DEEP_SLEEP_US,
                 shards=1):
        if shards < 1 or (shards > 1 and transport != "dpdk"):
            raise ValueError(f"shards={shards}: a local server has 1 shard, "
                             "or more with transport='dpdk'")
        self.workers = workers
        self.transport = transport
        self.shards = shards
        self.dir = tempfile.mkdtemp(prefix="dblp-job-")
        # Whatever ends this process short of SIGKILL removes the directory
        # (and the secret in it).
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir,
                                         ignore_errors=True)
        if secret_file:
            self.secret_file = secret_file
        else:
            self.secret_file = os.path.join(self.dir, "job.secret")
            fd = os.open(self.secret_file,
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
        self._claims = []
        self.prefixes = []
        self.procs = []
        self.host = host
        self.out_dir = out_dir
        flags = [f"--workers={workers}", f"--secret_file={self.secret_file}"]
        if not any(f.startswith("--round_timeout_ms") for f in server_flags):
            # A trainer may pause (evaluation, a checkpoint) as long as
            # gloo would wait for it: 30 minutes by default.
            flags.append(f"--round_timeout_ms={int(timeout * 1000)}")
        # Sleep through the trainers' steps (docs/PYTORCH.md, CPU).
        flags.append(f"--idle_deep_sleep_us={idle_deep_sleep_us}")
        flags += list(server_flags)
        self.commands = []
        self.log_paths = []
        try:
            for k in range(shards):
                # `lcore` pins the first shard; the others claim their own.
                self._start_shard(k, flags, lcore if k == 0 else None,
                                  memory_mb)
                # Shard 0 is the directory the others register with.
                self._await_listening(self.procs[k], self.ports[k],
                                      self.log_paths[k], ready_timeout)
        except BaseException:
            self.close()  # no server left polling its lcore
            raise

    def _start_shard(self, k, flags, lcore, memory_mb):
        host = self.host
        port = free_port(host)
        if k == 0:
            self.ports = []
            self.port = port
            self.address = f"{host}:{port}"
        self.ports.append(port)
        name = "server" if k == 0 else f"server-shard{k}"
        flags = list(flags)
        if self.out_dir:
            flags.append(f"--out_dir={os.path.join(self.out_dir, name)}")
        if self.shards > 1:
            flags += [f"--shards={self.shards}", f"--shard_index={k}"]
            if k:
                flags.append(f"--directory={self.address}")
        if self.transport == "udp":
            cmd = [find_app("dblp-udp-server"),
                   f"--control={self.address}",
                   f"--data={host}:{free_port(host)}"] + flags
        else:
            vdevs = [f"--vdev=net_memif{i},role=server,"
                     f"socket={self._socket(k, i)},id=0"
                     for i in range(self.workers)]
            prefix = f"dblp-{os.getpid()}-srv-{port}"
            self.prefixes.append(prefix)
            eal = memif_eal(None, prefix, lcore=lcore, client=False,
                            vdevs=vdevs, claims=self._claims)
            eal[eal.index("-m") + 1] = str(memory_mb)
            cmd = [find_app("dblp-server")] + eal + ["--",
                                                     f"--listen={host}:{port}"]
            cmd += flags
        log_path = os.path.join(self.out_dir or self.dir, name + ".log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        self.commands.append(cmd)
        self.log_paths.append(log_path)
        self.procs.append(proc)
        if k == 0:
            self.command, self.log_path, self.proc = cmd, log_path, proc

    def _socket(self, shard, rank):
        if shard == 0:
            return os.path.join(self.dir, f"w{rank}.sock")
        return os.path.join(self.dir, f"s{shard}w{rank}.sock")

    def socket(self, rank):
        """Worker `rank`'s memif socket: one path, or with shards a list
        (shard order)."""
        if self.shards == 1:
            return self._socket(0, rank)
        return [self._socket(k, rank) for k in range(self.shards)]

    def _await_listening(self, proc, port, log_path, timeout):
        host = self.host if self.host not in ("0.0.0.0", "") else "127.0.0.1"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode})"
                                   f": {self._tail(log_path)}")
            try:
                with socket.create_connection((host, port), 0.2):
                    pass
                # The probe is a stranger that said nothing; the server
                # closes it at its join deadline. No JOIN, no slot taken.
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the server did not listen in {timeout} s")

    def log_tail(self, lines=10):
        return "\n".join(self._tail(p, lines) for p in self.log_paths)

    @staticmethod
    def _tail(log_path, lines=10):
        try:
            with open(log_path, "rb") as f:
                text = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def worker_kwargs(self, rank):
        kw = dict(server=self.address, transport=self.transport,
                  secret_file=self.secret_file, name=f"w{rank}",
                  expect_workers=self.workers)
        if self.transport == "dpdk":
            kw["memif_socket"] = self.socket(rank)
        if self.out_dir:
            kw["out_dir"] = os.path.join(self.out_dir, f"worker{rank}")
        return kw

    def wait(self, timeout=60.0):
        """The server's exit code once every worker ended (with shards, the
        first nonzero one)."""
        deadline = time.monotonic() + timeout
        try:
            rcs = [p.wait(timeout=max(0.0, deadline - time.monotonic()))
                   for p in self.procs]
            return next((rc for rc in rcs if rc), 0)
        except subprocess.TimeoutExpired:
            self.close()
            raise RuntimeError(f"the server did not exit in {timeout} s: "
                               f"{self.log_tail()}")

    def close(self):
        for proc in self.procs:
            stop(proc)
        for prefix in self.prefixes:
            remove_runtime_dir(prefix)
        for c in self._claims:
            c.release()
        self._cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
