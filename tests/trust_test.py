#!/usr/bin/env python3
"""Authenticated jobs, tried the way an attacker or an unlucky operator
would (issue #11): a worker with the wrong secret, strangers on the control
port who JOIN and say BYE, stay silent, or send a PROOF they cannot make,
duplicate worker names, and fake servers whose WELCOME lies. The real job
must be unaffected; every refusal counted; every lying WELCOME ends the
worker with a clear error and exit code 1, never a signal.

Usage: trust_test.py BUILD_DIR
"""
import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dblp_testlib import (check, finish, free_port, kill_all,  # noqa: E402
                          make_secret)
from dblp_testlib import eal as testlib_eal  # noqa: E402










def eal(prefix, *vdevs, lcore="0"):
    return testlib_eal("trust", prefix, *vdevs, lcore=lcore)


# ---- the control codec, as much as the tests need ----------------------

# Paced (--link_gbps) so that the job still runs when the surplus worker,
# started after the other two, reaches the server.
ITERS = 300

JOIN, WELCOME, ERROR, CHALLENGE, PROOF, BYE, TAG = 1, 2, 8, 10, 11, 7, 12
VERSION = 6


def frame(mtype, body):
    return struct.pack(">IB", len(body) + 1, mtype) + body


def string(s):
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def join_frame(name, total_bytes=20000 * 4, nonce=None):
    body = (struct.pack(">HI", VERSION, 0) + string(name) +
            struct.pack(">QI", total_bytes, 1500) + struct.pack(">I", 0) +
            (nonce or os.urandom(32)) + bytes(6) + struct.pack(">IH", 0, 0) +
            # v6: shard 0 of 1, no claim, no directory nonce.
            struct.pack(">HHIIH", 0, 1, 0, 0, 0) + bytes(32))
    return frame(JOIN, body)


def read_frame(sock, timeout=10.0):
    sock.settimeout(timeout)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None, None
        head += chunk
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None, None
        body += chunk
    return body[0], head + body


def mac(key, label, *parts):
    msg = b"".join(struct.pack(">I", len(p)) + p
                   for p in [label.encode()] + list(parts))
    return hmac.new(key, msg, hashlib.sha256).digest()


def parse_join(raw):
    """(nonce, raw layers bytes, total_bytes) of a JOIN frame."""
    p = 5 + 2 + 4
    (n,) = struct.unpack_from(">H", raw, p)
    p += 2 + n
    (total, _mtu) = struct.unpack_from(">QI", raw, p)
    p += 12
    layers_at = p
    (count,) = struct.unpack_from(">I", raw, p)
    p += 4
    for _ in range(count):
        (n,) = struct.unpack_from(">H", raw, p)
        p += 2 + n
        (dims,) = struct.unpack_from(">I", raw, p)
        p += 4 + 8 * dims
    return raw[p:p + 32], raw[layers_at:p], total


def welcome_frame(key, nw, ns, layers, total, rank=0, workers=1,
                  chunk_payload=1436, num_chunks=None, tamper=False):
    if num_chunks is None:
        num_chunks = (total + chunk_payload - 1) // max(1, chunk_payload)
    head = (struct.pack(">IHHIIIQHHIBBI", 0x1234, rank, workers, 1500,
                        chunk_payload, num_chunks, total, 47000, 1, 0, 0, 0,
                        0x0A000001) + bytes(6) + string("fixed") + layers +
            struct.pack(">IB", 0x0A000002, 1) + os.urandom(32))
    # v6: shard 0 of 1 at chunk 0, the whole gradient, no shard map.
    tail = struct.pack(">HHIQI", 0, 1, 0, total, 0)
    unsigned = frame(WELCOME, head + bytes(32) + tail)
    tag = mac(key, "dblp/4 welcome", nw, ns, unsigned)
    if tamper:
        tag = bytes([tag[0] ^ 1]) + tag[1:]
    return frame(WELCOME, head + tag + tail)


def fake_server(port, key, lie, ready):
    """Accepts one worker, runs the handshake with `key`, answers with the
    WELCOME `lie` describes (a dict of welcome_frame arguments)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(1)
    ready.set()
    ls.settimeout(30)
    try:
        c, _ = ls.accept()
    except socket.timeout:
        return
    with c:
        t, raw = read_frame(c)
        if t != JOIN:
            return
        nw, layers, total = parse_join(raw)
        ns = os.urandom(32)
        digest = hashlib.sha256(raw).digest()
        c.sendall(frame(CHALLENGE, ns + mac(key, "dblp/4 server", nw, ns,
                                            digest)))
        t, _ = read_frame(c)
        if t != PROOF:
            return  # the worker refused us: fine, the test reads its output
        args = dict(layers=layers, total=total)
        args.update(lie)
        # After the PROOF every message travels with its TAG (seq 0 first).
        s2w = mac(key, "dblp/4 control s2w", nw, ns)
        wf = welcome_frame(key, nw, ns, **args)
        seq = struct.pack(">Q", 0)
        c.sendall(wf + frame(TAG, seq + mac(s2w, "dblp/4 tag", seq, wf)))
        time.sleep(2)  # let the worker read it, answer, and go
    ls.close()


def run_worker(worker, prefix, port, secret, extra=(), timeout=40):
    cmd = ([worker] + eal(prefix, "net_null0") +
           ["--", "--server=127.0.0.1:%d" % port, "--secret_file=" + secret,
            "--floats=20000", "--stats_period=0", "--join_timeout_ms=8000"] +
           list(extra))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout


def main():
    build = sys.argv[1]
    server = os.path.join(build, "apps", "dblp-server")
    worker = os.path.join(build, "apps", "dblp-worker")
    tmp = tempfile.mkdtemp(prefix="dblp-trust-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    other = make_secret(os.path.join(tmp, "other.secret"))
    key = open(secret, "rb").read()

    # ---- flags: a secret file that is not private, or none ----
    loose = make_secret(os.path.join(tmp, "loose.secret"))
    os.chmod(loose, 0o644)
    for flags, needle in [(["--secret_file=" + loose], "chmod 600"),
                          ([], "--secret_file"),
                          (["--secret_file=" + secret, "--insecure"],
                           "choose one"),
                          (["--secret_file=" + secret, "--frame_auth=sha1"],
                           "frame_auth")]:
        p = subprocess.run([server] + eal("flags", "net_null0") + ["--"] +
                           flags, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=30)
        check("server %s refused naming %s" % (" ".join(flags) or "(none)",
                                               needle),
              p.returncode == 2 and needle in p.stdout, p.stdout[-300:])

    # ---- a real job of 2 workers, attacked during its join ----
    port = free_port()
    socks = [os.path.join(tmp, "w%d.sock" % w) for w in (0, 1)]
    out_dir = os.path.join(tmp, "server")
    srv = subprocess.Popen(
        [server] + eal("srv", *["net_memif%d,role=server,socket=%s,id=0"
                                % (w, socks[w]) for w in (0, 1)]) +
        ["--", "--workers=2", "--listen=127.0.0.1:%d" % port,
         "--secret_file=" + secret, "--policy=fixed", "--stats_period=0",
         "--control_join_deadline_ms=1500", "--out_dir=" + out_dir,
         "--join_timeout_ms=60000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    procs = [srv]
    try:
        # A worker with another job's secret: refused, exit 1, and it
        # says why.
        rc, out = run_worker(worker, "wrong", port, other,
                             ["--name=intruder"])
        check("a worker with the wrong secret is refused (exit 1)",
              rc == 1 and "authentication failed" in out, out[-400:])

        # Strangers: JOIN then BYE; JOIN then a forged PROOF; a JOIN and
        # silence; BYE with no JOIN.
        def stranger(frames, wait_close=True):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            with s:
                for f in frames:
                    s.sendall(f)
                    if f[4] == JOIN:
                        t, _ = read_frame(s)
                        if t != CHALLENGE:
                            return "no CHALLENGE (%s)" % t
                types = []
                while wait_close:
                    t, raw = read_frame(s, timeout=5)
                    if t is None:
                        break
                    types.append(t)
                return types
        got = stranger([join_frame("stranger-1"), frame(BYE, string("bye"))])
        check("a stranger's JOIN + BYE is refused and closed", got == [ERROR],
              str(got))
        got = stranger([join_frame("stranger-2"), frame(PROOF, bytes(32))])
        check("a stranger's forged PROOF is refused and closed",
              got == [ERROR], str(got))
        got = stranger([frame(BYE, string("bye"))])
        check("a BYE before any JOIN is refused and closed", got == [ERROR],
              str(got))
        t0 = time.time()
        got = stranger([join_frame("stranger-3")])
        check("a stranger's JOIN followed by silence is closed at the join "
              "deadline", got == [ERROR] and 1.0 < time.time() - t0 < 8,
              "%s after %.1f s" % (got, time.time() - t0))
        if srv.poll() is not None:
            check("the server survives the strangers", False,
                  srv.communicate()[0][-600:])
            return

        # Two real workers; one duplicate name in between. Which of the two
        # alphas JOINs first depends on how fast each EAL starts (under
        # load the second may win): the one that JOINs second is refused,
        # whichever it is, and beta takes its memif socket.
        def start(w, name):
            p = subprocess.Popen(
                [worker] + eal("w%d-%s-%d" % (w, name, len(procs)),
                               "net_memif0,role=client,socket=%s,id=0"
                               % socks[w],
                               lcore="1" if os.cpu_count() > 1 else "0") +
                ["--", "--server=127.0.0.1:%d" % port, "--secret_file=" +
                 secret, "--name=" + name, "--iterations=%d" % ITERS,
                 "--link_gbps=0.1",
                 "--floats=20000", "--stats_period=0"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append(p)
            return p
        alphas = [start(0, "alpha")]
        time.sleep(0.5)
        alphas.append(start(1, "alpha"))
        deadline = time.time() + 60
        refused = None
        while refused is None and time.time() < deadline:
            refused = next((a for a in alphas if a.poll() is not None), None)
            time.sleep(0.05)
        out = refused.communicate(timeout=10)[0] if refused else ""
        check("a second worker named alpha is refused",
              refused is not None and refused.returncode == 1 and
              "unique --name" in out, out[-400:])
        time.sleep(0.5)
        survivor = alphas[1] if refused is alphas[0] else alphas[0]
        beta = start(1 if refused is alphas[1] or refused is None else 0,
                     "beta")
        ws = [survivor, refused, beta]
        # The job is full once it runs (its first rows are on disk). It
        # lasts a few seconds: one of its workers is held (SIGSTOP) while a
        # third worker with the right secret starts and JOINs, so that it
        # meets a full, running job whatever the load (a surplus JOIN,
        # refused), then let go: the job goes on.
        rows_path = os.path.join(out_dir, "iterations.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline and not (
                os.path.exists(rows_path) and os.path.getsize(rows_path)):
            time.sleep(0.05)
        survivor.send_signal(signal.SIGSTOP)
        try:
            rc, out = run_worker(worker, "surplus", port, secret,
                                 ["--name=gamma"])
        finally:
            survivor.send_signal(signal.SIGCONT)
        check("a surplus worker (right secret, job full) is refused",
              rc == 1 and "all workers" in out, out[-400:])
        outs = {}
        for p in (srv, ws[0], ws[2]):
            outs[p.pid] = p.communicate(timeout=120)[0]
        check("the real job finishes: server and both workers exit 0",
              srv.returncode == 0 and ws[0].returncode == 0 and
              ws[2].returncode == 0,
              "\n".join(o[-500:] for o in outs.values()))
        rows = [json.loads(l) for l in open(os.path.join(out_dir,
                                                          "iterations.jsonl"))]
        steps = [r for r in rows if not r.get("resync")]
        check("the server ran all %d iterations of both workers" % ITERS,
              len(steps) == 2 * ITERS and
              sorted({r["rank"] for r in steps}) == [0, 1],
              "%d rows" % len(steps))
        c = json.load(open(os.path.join(out_dir, "summary.json")))["counters"]
        # The wrong-secret worker refuses the server's proof and leaves
        # before it sends one; the forged PROOF is the failure counted.
        check("refusals counted: auth failures, out of order, refused joins",
              c.get("control_auth_failures", 0) >= 1 and
              c.get("control_out_of_state", 0) >= 2 and
              c.get("control_refused_joins", 0) >= 2,
              str({k: v for k, v in c.items() if k.startswith("control")}))
    finally:
        kill_all(procs)

    # ---- fake servers: the WELCOME lies ----
    lies = [
        ("a server without the secret", open(other, "rb").read(), {},
         "server's proof"),
        ("a WELCOME with a bad MAC", key, {"tamper": True},
         "WELCOME failed authentication"),
        ("an oversized layout (256 MiB)", key,
         {"total": 256 << 20}, "gradient of 268435456 bytes"),
        ("a zero chunk payload", key, {"chunk_payload": 0, "num_chunks": 1},
         "chunk payload 0"),
        ("a rank past the workers", key, {"rank": 5, "workers": 2},
         "rank 5 is not below"),
    ]
    for what, k, lie, needle in lies:
        port = free_port()
        ready = threading.Event()
        t = threading.Thread(target=fake_server, args=(port, k, lie, ready),
                             daemon=True)
        t.start()
        ready.wait(5)
        rc, out = run_worker(worker, "fake%d" % port, port, secret)
        check("forged WELCOME (%s): worker exits 1 naming it" % what,
              rc == 1 and needle in out, "rc=%s %s" % (rc, out[-500:]))
        t.join(10)

    finish()


if __name__ == "__main__":
    main()
