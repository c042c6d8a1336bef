"""DDP integration: ``ddp_model.register_comm_hook(worker, comm_hook)``.

Each DDP bucket is staged into the worker's shared gradient at the next
offset (one copy); the last bucket of the backward pass runs one DBLP
iteration over the whole gradient (so the policy sees the norm of the
whole mean, as the paper's does), and every bucket's future completes with
its slice of the mean, which DDP copies into the parameters' .grad.
"""



def comm_hook(state, bucket):
    """DDP communication hook; `state` is a dblp.Worker built on the same
    model (float32 parameters, checked when it was built), on the CPU or
    a CUDA device (staged through pinned host memory)."""
    return state.push_bucket(bucket.buffer(), bucket.is_last(),
                             in_backward=True, index=bucket.index())
