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


def memif_eal(socket_path, prefix, lcore=None, client=True, vdevs=None,
              claims=None):
    """EAL options of one process on the local memif cluster (no NIC, no
    hugepages, its own --file-prefix). Without `lcore`, the least-claimed
    CPU (_lcores.py); its claim goes into `claims`, for the caller to
    release when the process ends."""
    if lcore is None:
        claim = claim_lcore()
        if claims is not None:
            claims.append(claim)
        lcore = claim.cpu
    eal = ["-l", str(lcore), "--no-huge", "-m", "256", "--no-pci",
           f"--file-prefix={prefix}", "--log-level=*:warning"]
    if client:
        eal.append(f"--vdev=net_memif0,role=client,socket={socket_path},id=0")
    for v in vdevs or []:
        eal.append(v)
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
    # Where EAL puts it (src/eal_cleanup.cc says the same).
    if os.geteuid() == 0:
        base = "/var/run"
    else:
        base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    shutil.rmtree(os.path.join(base, "dpdk", prefix), ignore_errors=True)


class LocalServer:
    """A dblp-server (transport="dpdk": memif, one socket per worker, no NIC)
    or dblp-udp-server (transport="udp") on this host, with a fresh job
    secret, for `workers` trainers. Use as a context manager; each trainer
    gets its Worker arguments from worker_kwargs(rank)."""

    def __init__(self, workers, transport="dpdk", server_flags=(),
                 out_dir=None, ready_timeout=30.0, secret_file=None,
                 host="127.0.0.1", memory_mb=512, lcore=None,
                 timeout=1800.0, idle_deep_sleep_us=IDLE_DEEP_SLEEP_US):
        self.workers = workers
        self.transport = transport
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
        self.prefix = None
        self.host = host
        self.port = free_port(host)
        self.address = f"{host}:{self.port}"
        self.out_dir = out_dir
        flags = [f"--workers={workers}", f"--secret_file={self.secret_file}"]
        if not any(f.startswith("--round_timeout_ms") for f in server_flags):
            # A trainer may pause (evaluation, a checkpoint) as long as
            # gloo would wait for it: 30 minutes by default.
            flags.append(f"--round_timeout_ms={int(timeout * 1000)}")
        # Sleep through the trainers' steps (docs/PYTORCH.md, CPU).
        flags.append(f"--idle_deep_sleep_us={idle_deep_sleep_us}")
        if out_dir:
            flags.append(f"--out_dir={os.path.join(out_dir, 'server')}")
        flags += list(server_flags)
        if transport == "udp":
            cmd = [find_app("dblp-udp-server"),
                   f"--control={self.address}",
                   f"--data={host}:{free_port(host)}"] + flags
        else:
            vdevs = [f"--vdev=net_memif{i},role=server,"
                     f"socket={self.socket(i)},id=0" for i in range(workers)]
            self.prefix = f"dblp-{os.getpid()}-srv-{self.port}"
            eal = memif_eal(None, self.prefix, lcore=lcore, client=False,
                            vdevs=vdevs, claims=self._claims)
            eal[eal.index("-m") + 1] = str(memory_mb)
            cmd = [find_app("dblp-server")] + eal + ["--",
                                                     f"--listen={self.address}"]
            cmd += flags
        self.command = cmd
        self.log_path = os.path.join(out_dir or self.dir, "server.log")
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        try:
            self._await_listening(ready_timeout)
        except BaseException:
            self.close()  # no server left polling its lcore
            raise

    def socket(self, rank):
        return os.path.join(self.dir, f"w{rank}.sock")

    def _await_listening(self, timeout):
        host = self.host if self.host not in ("0.0.0.0", "") else "127.0.0.1"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode})"
                                   f": {self.log_tail()}")
            try:
                with socket.create_connection((host, self.port), 0.2):
                    pass
                # The probe is a stranger that said nothing; the server
                # closes it at its join deadline. No JOIN, no slot taken.
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the server did not listen in {timeout} s")

    def log_tail(self, lines=10):
        try:
            with open(self.log_path, "rb") as f:
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
        """The server's exit code once every worker ended."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise RuntimeError(f"the server did not exit in {timeout} s: "
                               f"{self.log_tail()}")

    def close(self):
        stop(self.proc)
        if self.prefix:
            remove_runtime_dir(self.prefix)
        for c in self._claims:
            c.release()
        self._cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
