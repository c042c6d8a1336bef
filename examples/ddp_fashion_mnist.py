#!/usr/bin/env python3
"""DDP training on Fashion-MNIST with DBLP moving the gradients.

One command starts everything on this host: a dblp-server on the memif
local cluster (--transport dpdk, the default; no NIC, no hugepages) or a
dblp-udp-server (--transport udp, kernel sockets), and --workers trainer
processes, each a torch DistributedDataParallel replica whose gradients
go through its own poll-mode dblp-worker. --backend gloo runs the same
script on PyTorch's own gloo allreduce instead (the comparison point).

  /usr/bin/python3 examples/ddp_fashion_mnist.py                 # dblp, memif
  /usr/bin/python3 examples/ddp_fashion_mnist.py --transport udp
  /usr/bin/python3 examples/ddp_fashion_mnist.py --backend gloo
  /usr/bin/python3 examples/ddp_fashion_mnist.py --policy fixed \
      --server_flags="--burst_random=4 --burst_loss=0.7"

The DBLP part of a trainer is three lines (marked "DBLP" below); the rest
is a plain DDP script. Results: <out>/result.json and a summary line.
Run it with Debian's /usr/bin/python3 (python3-torch) and PYTHONPATH set
to <build>/python (the script does that for ./build when it exists).
"""

import argparse
import gzip
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if os.path.isdir(os.path.join(REPO, "build", "python", "dblp")):
    sys.path.insert(0, os.path.join(REPO, "build", "python"))

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["dblp", "gloo"], default="dblp")
    ap.add_argument("--transport", choices=["dpdk", "udp"], default="dpdk")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--model", choices=MODELS, default="mlp",
                    help="mlp (235k parameters), cnn (29k), cnn137k (a CNN "
                    "with a wider head, 140k), mlp12m (11.6M), mlp25m "
                    "(24.2M), resnet18 (torchvision's, 11.2M); the last three "
                    "take several DDP buckets")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", default="dblp",
                    help="dblp-server --policy (fixed | dblp | reliable)")
    ap.add_argument("--server_flags", default="",
                    help="extra dblp-server flags, e.g. microbursts")
    ap.add_argument("--idle_deep_sleep_us", type=int, default=-1,
                    help="the apps' second idle stage (-1: the package's "
                    "default; 0: off)")
    ap.add_argument("--worker_flags", default="",
                    help="extra dblp-worker flags")
    ap.add_argument("--eval_images", type=int, default=10000)
    ap.add_argument("--data_dir", default=DATA_DIR)
    ap.add_argument("--out", default="",
                    help="results directory (default: results/ddp-<time>)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per trainer")
    # Internal: a trainer process of the launcher.
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--dist_port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker_json", default="", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ---- data ------------------------------------------------------------------
def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        return data[16:], (n, rows, cols)
    return data[8:], (n,)


def load_split(torch, data_dir, prefix, limit=None):
    try:
        img, shape = read_idx(os.path.join(data_dir,
                                           f"{prefix}-images-idx3-ubyte.gz"))
        lab, _ = read_idx(os.path.join(data_dir,
                                       f"{prefix}-labels-idx1-ubyte.gz"))
    except FileNotFoundError as e:
        sys.exit(f"error: {e.filename} missing: apt-get install "
                 "dataset-fashion-mnist (or give --data_dir)")
    x = torch.frombuffer(bytearray(img), dtype=torch.uint8).view(*shape)
    y = torch.frombuffer(bytearray(lab), dtype=torch.uint8).long()
    if limit:
        x, y = x[:limit], y[:limit]
    x = (x.float() / 255.0 - 0.2860) / 0.3530
    return x.unsqueeze(1), y


MODELS = ["mlp", "cnn", "cnn137k", "mlp12m", "mlp25m", "resnet18"]


def make_model(torch, kind):
    nn = torch.nn
    if kind == "resnet18":
        # torchvision's ResNet-18 (11.2M parameters, no weights), its stem
        # taking Fashion-MNIST's one channel.
        import torchvision
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
        return m
    if kind == "cnn137k":
        return nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 7 * 7, 80), nn.ReLU(),
            nn.Linear(80, 10))
    if kind == "mlp12m":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 3072), nn.ReLU(),
                             nn.Linear(3072, 2560), nn.ReLU(),
                             nn.Linear(2560, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    if kind == "mlp25m":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 4096), nn.ReLU(),
                             nn.Linear(4096, 4096), nn.ReLU(),
                             nn.Linear(4096, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                         nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


# ---- one trainer -----------------------------------------------------------
def trainer(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:"
                            f"{args.dist_port}", rank=args.rank,
                            world_size=args.workers)
    x, y = load_split(torch, args.data_dir, "train")
    model = make_model(torch, args.model)
    ddp = DDP(model)  # broadcasts rank 0's parameters (gloo)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    worker = None
    if args.backend == "dblp":
        import dblp  # DBLP (1/3)
        import dblp.torch
        kw = json.loads(args.worker_json)
        # optimizer=: its momentum is averaged with the server's resyncs.
        worker = dblp.Worker(model=model, optimizer=opt, **kw)  # DBLP (2/3)
        ddp.register_comm_hook(worker, dblp.torch.comm_hook)  # DBLP (3/3)
    loss_fn = torch.nn.CrossEntropyLoss()
    # Each rank its own shard, the same order for a seed.
    g = torch.Generator().manual_seed(args.seed * 1000 + args.rank)
    shard = torch.arange(args.rank, x.shape[0], args.workers)
    order = shard[torch.randperm(shard.numel(), generator=g)]
    losses, times = [], []
    pos = 0
    cpu0 = time.process_time()
    for it in range(args.iterations):
        if pos + args.batch > order.numel():
            order = shard[torch.randperm(shard.numel(), generator=g)]
            pos = 0
        idx = order[pos:pos + args.batch]
        pos += args.batch
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ddp(x[idx]), y[idx])
        loss.backward()  # the comm hook runs the DBLP exchange
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    result = {"rank": args.rank, "losses": losses, "times_s": times,
              "train_cpu_s": time.process_time() - cpu0}
    if worker is not None:
        worker.close()
        result["dblp"] = worker.history
    if args.rank == 0:
        tx, ty = load_split(torch, args.data_dir, "t10k", args.eval_images)
        with torch.no_grad():
            pred = model(tx).argmax(1)
        result["test_accuracy"] = float((pred == ty).float().mean())
    dist.destroy_process_group()
    with open(os.path.join(args.out, f"trainer{args.rank}.json"), "w") as f:
        json.dump(result, f)


# ---- the launcher ----------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def summarize(args, results, wall_s):
    r0 = next(r for r in results if r["rank"] == 0)
    skip = min(10, args.iterations // 10)  # warm-up
    per_it = [median([r["times_s"][i] for r in results])
              for i in range(skip, args.iterations)]
    k = max(1, args.iterations // 10)
    mean_loss = [sum(r["losses"][i] for r in results) / len(results)
                 for i in range(args.iterations)]
    s = {"backend": args.backend, "transport": args.transport,
         "policy": args.policy if args.backend == "dblp" else "-",
         "workers": args.workers, "iterations": args.iterations,
         "model": args.model, "seed": args.seed,
         "iteration_ms_mean": 1e3 * sum(per_it) / max(1, len(per_it)),
         "iteration_ms_p50": 1e3 * median(per_it),
         "iteration_ms_p99": 1e3 * sorted(per_it)[int(0.99 * (len(per_it) - 1))],
         "iteration_ms_max": 1e3 * max(per_it),
         "loss_first": sum(mean_loss[:k]) / k,
         "loss_last": sum(mean_loss[-k:]) / k,
         "test_accuracy": r0.get("test_accuracy"), "wall_s": wall_s}
    infos = [i for r in results for i in r.get("dblp", [])]
    if infos:
        s["delivered_fraction_min"] = min(i["delivered_fraction"]
                                          for i in infos)
        s["handoff_us_p50"] = median([i["handoff_us"] for i in infos])
        s["copy_in_us_p50"] = median([i.get("copy_in_us", 0) for i in infos])
        s["critical_fraction"] = sum(i["critical"] for i in infos) / len(infos)
    return s


def launch(args):
    args.out = args.out or os.path.join(
        REPO, "results", "ddp-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(args.out, exist_ok=True)
    server = None
    dist_port = free_port()
    procs = []
    t0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        if args.backend == "dblp":
            import dblp
            flags = [f"--policy={args.policy}"] + args.server_flags.split()
            if args.idle_deep_sleep_us >= 0:
                deep = f"--idle_deep_sleep_us={args.idle_deep_sleep_us}"
                flags.append(deep)
                args.worker_flags = (args.worker_flags + " " + deep).strip()
            server = dblp.LocalServer(args.workers, args.transport, flags,
                                      out_dir=args.out)
        for rank in range(args.workers):
            kw = {}
            if server is not None:
                kw = server.worker_kwargs(rank)
                kw["worker_flags"] = args.worker_flags.split()
            cmd = [sys.executable, os.path.abspath(__file__),
                   f"--rank={rank}", f"--dist_port={dist_port}",
                   f"--worker_json={json.dumps(kw)}"]
            cmd += [f"--{k}={v}" for k, v in vars(args).items()
                    if k not in ("rank", "dist_port", "worker_json")]
            procs.append(subprocess.Popen(cmd))
        rcs = [p.wait() for p in procs]
        if server is not None:
            rcs.append(server.wait(60))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if server is not None:
            if server.proc.poll() not in (None, 0):
                print("dblp-server log:\n" + server.log_tail(), file=sys.stderr)
            server.close()
    if any(rcs):
        print(f"error: a process failed (exit codes {rcs}); see {args.out}",
              file=sys.stderr)
        return 1
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    results = []
    for rank in range(args.workers):
        with open(os.path.join(args.out, f"trainer{rank}.json")) as f:
            results.append(json.load(f))
    s = summarize(args, results, time.monotonic() - t0)
    # Every process of the job (trainers, their dblp-workers, the server),
    # set-up and evaluation included: the same for every backend.
    s["cpu_s_all"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime -
                                                      ru0.ru_stime)
    s["trainer_cpu_s"] = sum(r["train_cpu_s"] for r in results)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(s, f, indent=1)
    print(json.dumps(s))
    return 0


def main():
    args = parse_args()
    if args.rank >= 0:
        trainer(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
