"""dblp: PyTorch training over DBLP (bounded-loss, phase-aware gradient
exchange with a parameter server).

A training process gets a ``dblp.Worker``; the worker starts a poll-mode
``dblp-worker`` (DPDK, its own lcore) or ``dblp-udp-worker`` (kernel UDP,
``transport="udp"``) and hands it each gradient over POSIX shared memory:
the push reads the frames straight from ``worker.gradient`` and the mean
lands straight in ``worker.mean``; a futex per direction wakes the other
side. See docs/PYTORCH.md.

    w = dblp.Worker(server="127.0.0.1:9100", model=model,
                    secret_file="job.secret", memif_socket="/run/dblp/w0.sock")
    ddp.register_comm_hook(w, dblp.torch.comm_hook)   # DDP
    info = w.allreduce_(flat_grad)                    # or by hand
"""

from ._launch import LocalServer, find_app
from .errors import DblpError
from .worker import Worker, check_same_model

# The package's surface. Importing it (or any of its modules) changes
# nothing in torch: the torch.distributed backend is registered by
# dblp.distributed.register() (tools/dblp-run calls it), and DDP reaches
# DBLP through the process group it is built on or an explicit comm hook
# (dblp.torch).
__all__ = ["Worker", "DblpError", "LocalServer", "find_app",
           "check_same_model"]
