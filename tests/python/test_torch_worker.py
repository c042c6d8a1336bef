"""The PyTorch package (python/dblp) against real dblp-server/dblp-worker
processes on the memif local cluster (and the kernel-UDP fallback):

- three trainers get the exact mean computed here, every iteration;
- with loss and p > 0 every broadcast delivered >= 1 - p, and the mean each
  trainer got is the server's on the chunks that arrived and the fill
  (zero) on the others, the server's own mean being its push fill (the sum
  of the chunks that arrived over W);
- a trainer that exits mid-job leaves the others with a DblpError naming
  it, within seconds, not a hang;
- a DDP comm hook on a small model: the loss goes down.

Run by meson (suite python) with PYTHONPATH=<build>/python and
DBLP_APPS=<build>/apps; each test starts and stops its own processes.
"""

import glob
import json
import multiprocessing as mp
import os
import struct
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import dblp  # noqa: E402
from ddp_cases import Reports, collect  # noqa: E402

CTX = mp.get_context("fork")
W = 3


def run_trainers(srv, target, *args, n=W):
    q = Reports()
    return collect([CTX.Process(target=target,
                                args=(r, srv.worker_kwargs(r), q) + args)
                    for r in range(n)], q)


def skip_without(app):
    try:
        dblp.find_app(app)
    except FileNotFoundError:
        pytest.skip(app + " not built")


def contribution(n, it, rank):
    # Small integers: sums over three workers are exact in float32.
    j = torch.arange(n, dtype=torch.int64)
    return (((j * 7 + it * 3 + rank * 5) % 17) - 8).float()


# ---- exact mean, no loss ---------------------------------------------------
def exact_trainer(rank, kw, q, n, iterations, zero_copy):
    try:
        w = dblp.Worker(floats=n, **kw)
        got = []
        for it in range(iterations):
            g = contribution(n, it, w.rank)
            if zero_copy == "buckets":
                # The comm hook's path: three buckets of a step, each
                # future completing with its slice of the mean.
                cuts = [0, n // 5, n // 2, n]
                futs = [w.push_bucket(g[a:b].clone(), b == n)
                        for a, b in zip(cuts, cuts[1:])]
                mean = torch.cat([f.wait() for f in futs])
                got.append((mean.clone(), w.history[-1]))
            elif zero_copy:
                w.gradient.copy_(g)
                mean, info = w.exchange()
                got.append((mean.clone(), info))
            else:
                info = w.allreduce_(g)
                got.append((g, info))
        w.close()
        q.put((rank, [(m.numpy().tobytes(), i) for m, i in got]))
    except Exception as e:  # reported, not hung
        q.put((rank, repr(e)))


@pytest.mark.parametrize("transport,zero_copy,shards",
                         [("dpdk", False, 1), ("dpdk", True, 1),
                          ("dpdk", "buckets", 1), ("udp", False, 1),
                          ("dpdk", False, 2)])
def test_exact_mean_three_trainers(transport, zero_copy, shards):
    if transport == "udp":
        skip_without("dblp-udp-worker")
    n, iterations = 50_000, 6
    with dblp.LocalServer(W, transport, ["--policy=reliable"],
                          shards=shards) as srv:
        res = run_trainers(srv, exact_trainer, n, iterations, zero_copy)
        assert srv.wait(60) == 0, srv.log_tail()
    for rank, rows in res.items():
        assert not isinstance(rows, str), f"trainer {rank}: {rows}"
        assert len(rows) == iterations
        for it, (raw, info) in enumerate(rows):
            expect = sum(contribution(n, it, r) for r in range(W)) / W
            got = torch.frombuffer(bytearray(raw), dtype=torch.float32)
            assert torch.equal(got, expect), \
                f"rank {rank} iteration {it}: mean differs"
            assert info["iteration"] == it
            assert info["delivered_fraction"] == 1.0
            assert info["p"] == 0.0
            assert info["send_latency_us"] > 0
            assert info["handoff_us"] >= 0


# ---- loss, p > 0 -----------------------------------------------------------
def weight_pattern(n):
    return (torch.arange(n) % 13 + 1).float()


def lossy_trainer(rank, kw, q, n, iterations):
    try:
        w = dblp.Worker(floats=n, **kw)
        got = []
        for _ in range(iterations):
            # Worker r contributes c * 2^r: a chunk of the server's mean
            # (zero fill: the sum of what arrived over W) names the subset
            # of workers whose chunk arrived.
            w.gradient.copy_(weight_pattern(n) * (1 << w.rank))
            mean, info = w.exchange()
            got.append((mean.numpy().tobytes(), info))
        w.close()
        q.put((rank, (w.rank, got)))
    except Exception as e:
        q.put((rank, repr(e)))


def read_f32(path):
    with open(path, "rb") as f:
        raw = f.read()
    return torch.frombuffer(bytearray(raw), dtype=torch.float32)


def read_bits(path, count):
    with open(path, "rb") as f:
        raw = f.read()
    words = struct.unpack("<%dQ" % (len(raw) // 8), raw)
    return [(words[i // 64] >> (i % 64)) & 1 == 1 for i in range(count)]


@pytest.mark.parametrize("transport", ["dpdk", "udp"])
def test_loss_delivered_and_fill(tmp_path, transport):
    if transport == "udp":
        skip_without("dblp-udp-worker")
    n, iterations, p, loss = 40_000, 8, 0.3, "bernoulli:0.25"
    dump = tmp_path / "dump"
    dump.mkdir()
    out = tmp_path / "out"
    server_flags = ["--policy=fixed", f"--p_fixed={p}", f"--loss={loss}",
                    f"--dump_dir={dump}", f"--dump_iterations={iterations}"]
    # The zero fill (the test reads the pushes off the mean), no resync.
    server_flags += ["--push_fill=zero", "--resync_every=0"]
    with dblp.LocalServer(W, transport, server_flags, out_dir=str(out)) as srv:
        q = Reports()
        procs = []
        for r in range(W):
            kw = srv.worker_kwargs(r)
            kw["worker_flags"] = [f"--loss={loss}", "--bcast_fill=zero",
                                  f"--dump_dir={dump}",
                                  f"--dump_iterations={iterations}"]
            procs.append(CTX.Process(target=lossy_trainer,
                                     args=(r, kw, q, n, iterations)))
        res = collect(procs, q)
        assert srv.wait(60) == 0, srv.log_tail()
    with open(out / "worker0" / "summary.json") as f:
        chunk_floats = int(json.load(f)["info"]["chunk_bytes"]) // 4
    chunks = (n + chunk_floats - 1) // chunk_floats
    c = weight_pattern(n)
    lost_push = lost_bcast = 0
    for r, value in res.items():
        assert not isinstance(value, str), f"trainer {r}: {value}"
        rank, rows = value
        for it, (raw, info) in enumerate(rows):
            assert info["p"] == pytest.approx(p)
            assert info["delivered_fraction"] >= 1 - p - 1e-9, (rank, it)
            server_mean = read_f32(dump / f"mean_it{it}.f32")
            arrived = read_bits(dump / f"w{rank}_it{it}_bcast.bits", chunks)
            got = torch.frombuffer(bytearray(raw), dtype=torch.float32)
            pushed = [0] * W
            for k in range(chunks):
                s = slice(k * chunk_floats, min(n, (k + 1) * chunk_floats))
                if arrived[k]:
                    assert torch.equal(got[s], server_mean[s]), (rank, it, k)
                else:
                    lost_bcast += 1
                    assert torch.all(got[s] == 0), (rank, it, k)
                # The server's fill: sum of the arrived chunks over W.
                masks = torch.round(server_mean[s] * W / c[s])
                mask = int(masks[0])
                assert torch.all(masks == mask) and 0 <= mask < (1 << W)
                assert torch.allclose(server_mean[s], c[s] * mask / W)
                for w in range(W):
                    pushed[w] += (mask >> w) & 1
            lost_push += sum(chunks - x for x in pushed)
            for w in range(W):
                assert pushed[w] >= (1 - p) * chunks - 1, (it, w, pushed)
    # The loss was real on both directions (else the fill is untested).
    assert lost_bcast > 0 and lost_push > 0


# ---- a trainer leaves ------------------------------------------------------
def leaving_trainer(rank, kw, q, n, leave_rank, leave_after):
    try:
        w = dblp.Worker(floats=n, **kw)
        for it in range(1000):
            if w.rank == leave_rank and it == leave_after:
                q.put((rank, ("left", w.rank, 0.0)))
                q.close()
                q.join_thread()  # flushed before the crash
                os._exit(0)  # a crash: no close(), no BYE
            w.gradient.fill_(1.0)
            w.exchange()
        q.put((rank, ("finished", w.rank, 0.0)))
    except dblp.DblpError as e:
        q.put((rank, ("error", str(e), time.monotonic())))
    except Exception as e:
        q.put((rank, ("other", repr(e), time.monotonic())))


@pytest.mark.parametrize("transport", ["dpdk", "udp"])
def test_trainer_exit_mid_job_is_a_clear_error(transport):
    if transport == "udp":
        skip_without("dblp-udp-worker")
    with dblp.LocalServer(W, transport, ["--policy=reliable"]) as srv:
        t0 = time.monotonic()
        res = run_trainers(srv, leaving_trainer, 20_000, 2, 5)
        rc = srv.wait(60)
    kinds = sorted(v[0] for v in res.values())
    assert kinds == ["error", "error", "left"], res
    assert rc != 0
    for kind, what, when in res.values():
        if kind != "error":
            continue
        # The others learn who left and why, promptly.
        assert "trainer" in what and "exited" in what, what
        assert when - t0 < 30, what


# ---- DDP example -----------------------------------------------------------
def test_ddp_example_loss_goes_down(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    example = os.path.join(repo, "examples", "ddp_fashion_mnist.py")
    if not glob.glob("/usr/share/datasets/fashion-mnist/*.gz"):
        pytest.skip("dataset-fashion-mnist not installed")
    import subprocess
    r = subprocess.run([sys.executable, example, "--iterations=300",
                        f"--out={tmp_path}", "--eval_images=2000"],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(tmp_path / "result.json") as f:
        s = json.load(f)
    assert s["loss_last"] < 0.6 * s["loss_first"], s
    assert s["test_accuracy"] > 0.65, s
    assert s["delivered_fraction_min"] > 0.5, s
