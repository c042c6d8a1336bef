"""A trainer that lies in the shared header cannot keep its worker running
(issue #21, item 5): it writes trainer_pid=1 into the header after its
dblp-udp-worker claimed the object, then exits. The worker must end within
2 s naming the trainer that exited (it watched the pid read at the claim).
On 8cec710 the worker re-read the header every 100 ms, watched pid 1 and
ran on. No torch needed: the trainer is dblp._native's Channel.
"""
import mmap
import os
import struct
import subprocess
import time

import pytest

import dblp
from dblp import _native
from dblp._launch import worker_command

# ShmHeader (lib/dblp/handoff/shm_channel.h): magic, version, floats,
# region_bytes, three offsets, num_layers, then trainer_pid.
TRAINER_PID_OFFSET = 4 + 4 + 8 + 8 + 3 * 8 + 4
JOINED = 1  # ShmWorkerState::kJoined


def lying_trainer(name, ready_fd):
    """Creates the object, waits for its worker to join, writes pid 1 over
    its own pid in the header and exits without a word."""
    ch = _native.Channel(name, 1000)
    os.write(ready_fd, b"r")
    deadline = time.monotonic() + 30
    while ch.state != JOINED and time.monotonic() < deadline:
        time.sleep(0.01)
    fd = os.open("/dev/shm" + name, os.O_RDWR)
    m = mmap.mmap(fd, 4096)
    assert struct.unpack_from("<i", m, TRAINER_PID_OFFSET)[0] == os.getpid()
    struct.pack_into("<i", m, TRAINER_PID_OFFSET, 1)
    os.write(ready_fd, b"j" if ch.state == JOINED else b"n")
    os._exit(0)


def test_a_trainer_pid_rewritten_after_the_claim_ends_the_worker():
    try:
        dblp.find_app("dblp-udp-worker")
    except FileNotFoundError:
        pytest.skip("dblp-udp-worker not built")
    name = "/dblp-test-liar-%d" % os.getpid()
    with dblp.LocalServer(1, "udp", ["--round_timeout_ms=60000"]) as srv:
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(r)
            try:
                lying_trainer(name, w)
            finally:
                os._exit(1)
        os.close(w)
        worker = None
        try:
            assert os.read(r, 1) == b"r"
            worker = subprocess.Popen(
                worker_command("udp", server=srv.address, shm=name,
                               name="w0", secret_file=srv.secret_file),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert os.read(r, 1) == b"j", "the worker never joined"
            os.waitpid(child, 0)
            child = 0
            t0 = time.monotonic()
            try:
                out = worker.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:
                pytest.fail("dblp-udp-worker still runs 10 s after its "
                            "trainer (which wrote trainer_pid=1) exited")
            took = time.monotonic() - t0
            assert worker.returncode == 1, out
            assert "trainer (pid" in out and "exited" in out, out
            assert took < 2.0, "%.2f s: %s" % (took, out)
        finally:
            if child:
                os.kill(child, 9)
                os.waitpid(child, 0)
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait()
            try:
                os.unlink("/dev/shm" + name)
            except FileNotFoundError:
                pass


# A trainer that truncates its region under the worker (issue #35, item 2):
# the worker read the cut part as zeros (its SIGBUS guard, shm_guard.h) and
# ends the job naming the truncation; before, dblp-worker and
# dblp-udp-worker died by SIGBUS with nothing in their log.
GRADIENT, ANSWER_SLICE_MS = 1, 100


@pytest.mark.parametrize("transport", ["udp", "dpdk"])
def test_a_region_truncated_under_the_worker_is_an_error_not_sigbus(
        transport):
    app = "dblp-udp-worker" if transport == "udp" else "dblp-worker"
    try:
        dblp.find_app(app)
    except FileNotFoundError:
        pytest.skip(app + " not built")
    name = "/dblp-test-trunc-%s-%d" % (transport, os.getpid())
    floats = 300000  # 1.2 MB: most of the region lies past the cut
    with dblp.LocalServer(1, transport,
                          ["--round_timeout_ms=20000"]) as srv:
        ch = _native.Channel(name, floats)
        worker = None
        try:
            extra = {} if transport == "udp" else {
                "memif_socket": srv.socket(0)}
            worker = subprocess.Popen(
                worker_command(transport, server=srv.address, shm=name,
                               name="w0", secret_file=srv.secret_file,
                               **extra),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 30
            while ch.state != JOINED and time.monotonic() < deadline:
                ch.wait_state(ch.state, ANSWER_SLICE_MS)
            assert ch.state == JOINED, worker.communicate(timeout=5)[0]
            ch.gradient()  # a real step first: the job runs
            seen = ch.answers
            ch.post(GRADIENT, 0)
            while not ch.wait_answer(seen, ANSWER_SLICE_MS):
                assert worker.poll() is None, worker.communicate()[0]
            # The trainer cuts everything past the header's page, then
            # posts the next step as if nothing happened.
            os.truncate("/dev/shm" + name, 4096)
            ch.post(GRADIENT, 1)
            try:
                out = worker.communicate(timeout=30)[0]
            except subprocess.TimeoutExpired:
                pytest.fail(app + " still runs 30 s after its region was "
                            "truncated")
            assert worker.returncode == 1, (worker.returncode, out)
            assert "truncated the hand-off region" in out, out
            assert "truncated" in ch.error, ch.error
        finally:
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait()
            ch.unlink()
