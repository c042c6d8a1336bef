#!/usr/bin/env python3
"""A stalled round's text names the cause that was measured (issue #35,
item 3), each branch provoked:

  worker --mbufs=16 (its pool runs dry)   the worker names --mbufs and the
                                          count; the server does not blame
                                          the trainer alone
  100% loss injected by the server        the server names its injector
  100% loss injected by a worker          that worker names its injector
  a trainer that posts nothing            the hint of a trainer's pause
                                          (test_torch_worker's pause tests)

On 2e16acc all three read "a worker that sent nothing may be waiting for
its trainer". memif (dblp-server, dblp-worker) and, for the worker's
injector, kernel UDP.

Usage: stall_cause_test.py BUILD_DIR
"""

import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import check, finish, make_secret  # noqa: E402
import watchdog_test as wt  # noqa: E402

wt.TIMEOUT_MS = 2000


def memif(build, tmp, secret, name, sflags, wflags):
    port, srv, ws = wt.memif_job(build, tmp, name, secret, 1, sflags, wflags)
    try:
        wt.wait_ended([srv] + ws, 30)
        return srv.text(), ws[0].text(), wt.detail(srv, ws[0])
    finally:
        for p in [srv] + ws:
            p.kill()


def main():
    build = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dblp-stallcause-")
    secret = make_secret(os.path.join(tmp, "job.secret"))
    try:
        s, w, d = memif(build, tmp, secret, "mbufs", [], ["--mbufs=16"])
        check("worker --mbufs=16: the worker's failure names its dry pool "
              "and --mbufs",
              re.search(r"mbuf pool ran dry \d+ times", w) and
              "--mbufs" in w, d)
        check("worker --mbufs=16: the server's text names the causes it "
              "cannot tell apart, --mbufs among them",
              "no progress" in s and "--mbufs" in s, d)
        s, w, d = memif(build, tmp, secret, "srvloss",
                        ["--loss=bernoulli:1"], [])
        check("server --loss=bernoulli:1: the server names its injector and "
              "what it dropped",
              re.search(r"this server's loss injector dropped \d+ frames", s)
              and "trainer" not in s.split("no progress")[-1], d)
        s, w, d = memif(build, tmp, secret, "wloss", [],
                        ["--loss=bernoulli:1"])
        check("worker --loss=bernoulli:1 (memif): the worker names its "
              "injector", re.search(
                  r"this process's loss injector dropped \d+ of the \d+", w),
              d)
        port, srv, uw = wt.udp_job(build, tmp, "udp-wloss", secret, [],
                                   ["--loss=bernoulli:1"])
        try:
            wt.wait_ended([srv, uw], 30)
            check("worker --loss=bernoulli:1 (udp): the worker names its "
                  "injector", re.search(
                      r"this process's loss injector dropped \d+ of the \d+",
                      uw.text()), wt.detail(srv, uw))
        finally:
            for p in (srv, uw):
                p.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    sys.exit(main())
