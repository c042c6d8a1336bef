"""DBLP as a DDP communication hook, for a hook you choose yourself.

On a ``dblp`` process group DDP reaches DBLP without one (its default
path, see dblp.distributed). The hook is for the other cases:

    # a dblp.Worker of your own, on any process group (gloo's):
    ddp.register_comm_hook(dblp.Worker(model=model, ...), dblp.torch.comm_hook)
    # on a dblp group, the group's job for this model:
    ddp.register_comm_hook(dblp.distributed.hook_state(ddp), dblp.torch.comm_hook)
    # another hook's output over DBLP (a local transformation: clipping,
    # noise, a hook that records the bucket and returns it):
    ddp.register_comm_hook(HookState(worker, inner_hook=h, inner_state=s),
                           dblp.torch.comm_hook)

Each DDP bucket is staged into the worker's shared gradient at the next
offset (one copy); the last bucket of the backward pass runs one DBLP
iteration over the whole gradient (so the policy sees the norm of the
whole mean, as the paper's does), and every bucket's future completes with
its slice of the mean, which DDP copies into the parameters' .grad.
"""

from .errors import DblpError

__all__ = ["comm_hook", "HookState"]


class HookState:
    """The state of comm_hook: the dblp.Worker that carries the buckets
    and, optionally, a hook whose output it carries instead of the bucket
    (`inner_hook(inner_state, bucket)` returning a future of one tensor of
    the bucket's size). The inner hook must not reduce across the ranks
    itself: the mean would then be exchanged twice."""

    def __init__(self, worker, inner_hook=None, inner_state=None):
        self.worker = worker
        self.inner_hook = inner_hook
        self.inner_state = inner_state
        self.inner_calls = 0


def _inner_output(state, bucket):
    state.inner_calls += 1
    out = state.inner_hook(state.inner_state, bucket).wait()
    if isinstance(out, (list, tuple)):
        out = out[0]
    if out.numel() != bucket.buffer().numel():
        raise ValueError(f"the inner hook returned {out.numel()} floats for "
                         f"a bucket of {bucket.buffer().numel()}: DBLP moves"
                         " the bucket's own size")
    return out


def comm_hook(state, bucket):
    """DDP communication hook; `state` is a dblp.Worker built on the same
    model (float32 parameters, checked when it was built), on the CPU or
    a CUDA device (staged through pinned host memory), or a HookState."""
    worker = getattr(state, "worker", state)
    flat, error = bucket.buffer(), None
    if getattr(state, "inner_hook", None) is not None:
        try:
            flat = _inner_output(state, bucket)
        except Exception as e:
            # Raised here, it would leave DDP's reducer mid-step: the step
            # fails through the worker, out of backward() once DDP is done.
            error = DblpError(f"the hook inside dblp.torch.HookState "
                              f"failed: {type(e).__name__}: {e}")
            flat = bucket.buffer()
    return worker.push_bucket(flat, bucket.is_last(), in_backward=True,
                              index=bucket.index(), error=error)
