#!/usr/bin/env python3
"""One DDP trainer of a tools/dblp-eval run, in its testbed host namespace.

The model, the data and their order are examples/ddp_fashion_mnist.py's.
gloo's allreduce (--backend gloo) or DBLP's comm hook (--backend dblp, a
dblp-worker on this host's port) moves the gradients; both cross the
testbed's switch. Rank 0 measures test accuracy every --eval_every steps on
--curve_images test images (the time it takes is not training time: every
rank waits at a barrier and leaves it out of the clock) and on all 10,000
at the end. Rank 0 appends "step seconds" to --progress after each step, so
the driver can put a microburst into a chosen step.

Writes <out>/trainer<rank>.json: per-step times, losses, the accuracy curve
(training seconds, step, accuracy) and the DBLP exchanges' history."""

import argparse
import importlib.util
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def example():
    spec = importlib.util.spec_from_file_location(
        "ddp_fashion_mnist", os.path.join(REPO, "examples",
                                          "ddp_fashion_mnist.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="rank 0's IP:port")
    ap.add_argument("--backend", choices=["gloo", "dblp"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--iterations", type=int, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval_every", type=int, default=0)
    ap.add_argument("--curve_images", type=int, default=2000)
    ap.add_argument("--worker_json", default="{}")
    ap.add_argument("--progress", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    return ap.parse_args(argv)


def accuracy(torch, model, x, y):
    # Off the clock, with every rank idle at the barrier: both cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, os.cpu_count() or 1))
    was = model.training
    model.eval()
    with torch.no_grad():
        correct = 0
        for i in range(0, x.shape[0], 500):
            correct += int((model(x[i:i + 500]).argmax(1) ==
                            y[i:i + 500]).sum())
    model.train(was)
    torch.set_num_threads(threads)
    return correct / x.shape[0]


def main(argv=None):
    a = parse_args(argv)
    ex = example()
    if os.path.isdir(os.path.join(REPO, "build", "python", "dblp")):
        sys.path.insert(0, os.path.join(REPO, "build", "python"))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}",
                            rank=a.rank, world_size=a.world)
    x, y = ex.load_split(torch, a.data_dir, "train")
    model = ex.make_model(torch, a.model)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    worker = None
    if a.backend == "dblp":
        import dblp
        import dblp.torch
        worker = dblp.Worker(model=model, optimizer=opt,
                             **json.loads(a.worker_json))
        ddp.register_comm_hook(worker, dblp.torch.comm_hook)
    tx = ty = None
    if a.rank == 0:
        tx, ty = ex.load_split(torch, a.data_dir, "t10k")
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed * 1000 + a.rank)
    shard = torch.arange(a.rank, x.shape[0], a.world)
    order = shard[torch.randperm(shard.numel(), generator=g)]
    pos, losses, times, curve = 0, [], [], []
    progress = open(a.progress, "a", buffering=1) if a.progress else None
    train_s = 0.0
    for it in range(a.iterations):
        if pos + a.batch > order.numel():
            order = shard[torch.randperm(shard.numel(), generator=g)]
            pos = 0
        idx = order[pos:pos + a.batch]
        pos += a.batch
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ddp(x[idx]), y[idx])
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        train_s += dt
        times.append(dt)
        losses.append(loss.item())
        if progress:
            progress.write(f"{it} {train_s:.6f}\n")
        if a.eval_every and (it + 1) % a.eval_every == 0 and \
                it + 1 < a.iterations:
            if a.rank == 0:
                curve.append([train_s, it + 1, accuracy(
                    torch, model, tx[:a.curve_images], ty[:a.curve_images])])
            dist.barrier()
    result = {"rank": a.rank, "losses": losses, "times_s": times,
              "train_s": train_s}
    if worker is not None:
        worker.close()
        result["dblp"] = worker.history
    if a.rank == 0:
        result["test_accuracy"] = accuracy(torch, model, tx, ty)
        curve.append([train_s, a.iterations, accuracy(
            torch, model, tx[:a.curve_images], ty[:a.curve_images])])
        result["curve"] = curve
    dist.destroy_process_group()
    with open(os.path.join(a.out, f"trainer{a.rank}.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
