"""DDP integration: ``ddp_model.register_comm_hook(worker, comm_hook)``.

Each DDP bucket is staged into the worker's shared gradient at the next
offset (one copy); the last bucket of the backward pass runs one DBLP
iteration over the whole gradient (so the policy sees the norm of the
whole mean, as the paper's does), and every bucket's future completes with
its slice of the mean, which DDP copies into the parameters' .grad.
"""

import torch as _torch


def comm_hook(state, bucket):
    """DDP communication hook; `state` is a dblp.Worker built on the same
    model. Buckets must be float32 CPU tensors."""
    flat = bucket.buffer()
    if flat.dtype != _torch.float32 or flat.device.type != "cpu":
        raise TypeError("dblp.torch.comm_hook moves float32 CPU buckets (got "
                        f"{flat.dtype} on {flat.device}); docs/PYTORCH.md")
    return state.push_bucket(flat, bucket.is_last(), in_backward=True)
