#!/usr/bin/env python3
"""A plain torchrun DDP script on Fashion-MNIST: the backend is its only
DBLP-specific part.

  tools/dblp-run --nproc-per-node 3 examples/ddp_torchrun.py --backend gloo
  tools/dblp-run --nproc-per-node 3 examples/ddp_torchrun.py --backend dblp
  DBLP_SERVER_FLAGS=--policy=reliable tools/dblp-run --nproc-per-node 3 \\
      examples/ddp_torchrun.py --backend dblp          # exact, as gloo

tools/dblp-run is torchrun with the dblp backend registered in each
process and the flags Debian's needs (--redirects 1 --tee 1;
docs/PYTORCH.md): nothing here imports dblp. With --backend dblp, rank 0
starts a dblp-server on this host (DBLP_TRANSPORT=dpdk, the memif cluster,
or udp) and every rank's DDP gradients go over DBLP; every other
collective is gloo's.
Rank 0 prints a JSON summary (and writes it to --out when given).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if os.path.isdir(os.path.join(REPO, "build", "python", "dblp")):
    sys.path.insert(0, os.path.join(REPO, "build", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ddp_fashion_mnist import (DATA_DIR, MODELS, load_split,  # noqa: E402
                               make_model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="gloo", help="gloo | dblp")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--model", choices=MODELS, default="mlp")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval_images", type=int, default=10000)
    ap.add_argument("--data_dir", default=DATA_DIR)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_split(torch, args.data_dir, "train")
    model = make_model(torch, args.model)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    shard = torch.arange(rank, x.shape[0], world)
    order = shard[torch.randperm(shard.numel(), generator=g)]
    losses, times, pos = [], [], 0
    for _ in range(args.iterations):
        if pos + args.batch > order.numel():
            order, pos = shard[torch.randperm(shard.numel(), generator=g)], 0
        idx = order[pos:pos + args.batch]
        pos += args.batch
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    # A metric averaged over the ranks (exact: gloo's, under either backend).
    last = torch.tensor([sum(losses[-20:]) / min(20, len(losses))])
    dist.all_reduce(last)
    if rank == 0:
        tx, ty = load_split(torch, args.data_dir, "t10k", args.eval_images)
        with torch.no_grad():
            acc = float((model(tx).argmax(1) == ty).float().mean())
        t = sorted(times[10:]) or sorted(times)
        s = dict(backend=args.backend, world_size=world,
                 iterations=args.iterations, model=args.model,
                 loss_first=sum(losses[:20]) / min(20, len(losses)),
                 loss_last=last.item() / world, test_accuracy=acc,
                 iteration_ms_p50=1e3 * t[len(t) // 2],
                 iteration_ms_p99=1e3 * t[int(0.99 * (len(t) - 1))])
        print(json.dumps(s))
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "result.json"), "w") as f:
                json.dump(s, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
