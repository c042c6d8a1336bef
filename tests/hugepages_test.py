#!/usr/bin/env python3
"""No run leaves hugepage files behind (issue #13), tested WITH hugepages.

Reserves 2 MiB hugepages when it can (root; skip 77 otherwise) and mounts
a private hugetlbfs when none is mounted, then runs the apps without
--no-huge:

- a short server + worker job over memif (both exit 0);
- a worker whose server does not exist (exit 1 through Die/rte_exit);
- a server whose --listen port is taken (exit 1 through Die/rte_exit);
- a server stopped by SIGTERM while it waits for its workers (and, before
  that, a second server with its --file-prefix, which must fail without
  touching the first one's files).

While the server runs its map files must be there (else the test proved
nothing); afterwards no `<prefix>map_*` file of ours may remain in any
hugetlbfs mount, the mount holds no new file, HugePages_Free is back where
it was and /var/run/dpdk/<prefix> is gone. nr_hugepages and the mounts are
restored at the end, whatever happened.

Usage: hugepages_test.py BUILD_DIR
"""

import glob
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from dblp_testlib import check, finish, free_port, make_secret  # noqa: E402

NR = "/proc/sys/vm/nr_hugepages"
NEED_PAGES = 256  # what the job below maps at most, with room to spare


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def hugetlbfs_mounts():
    with open("/proc/mounts") as f:
        return [l.split()[1] for l in f if l.split()[2] == "hugetlbfs"]


def mount_files(mounts):
    out = set()
    for m in mounts:
        try:
            out.update(os.path.join(m, n) for n in os.listdir(m))
        except OSError:
            pass
    return out


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def main():
    build = sys.argv[1]
    server = os.path.join(build, "apps", "dblp-server")
    worker = os.path.join(build, "apps", "dblp-worker")
    if os.geteuid() != 0:
        skip("needs root to reserve hugepages")
    if not os.path.exists(NR):
        skip("no hugepage support in this kernel")
    if meminfo("Hugepagesize") != 2048:
        skip("default hugepage size is not 2 MiB")

    with open(NR) as f:
        prev_nr = int(f.read())
    own_mount = None
    tag = "dblp-huge-%d" % os.getpid()
    tmp = tempfile.mkdtemp(prefix="dblp-huge-")
    try:
        free0 = meminfo("HugePages_Free")
        if free0 < NEED_PAGES:
            with open(NR, "w") as f:
                f.write(str(prev_nr + NEED_PAGES - free0))
            if meminfo("HugePages_Free") < NEED_PAGES:
                skip("could not reserve %d hugepages (memory fragmented?)" %
                     NEED_PAGES)
        if not hugetlbfs_mounts():
            own_mount = os.path.join(tmp, "huge")
            os.mkdir(own_mount)
            if subprocess.call(["mount", "-t", "hugetlbfs", "-o",
                                "pagesize=2M", "nodev", own_mount]) != 0:
                own_mount = None
                skip("cannot mount hugetlbfs")
        run_cases(server, worker, tmp, tag)
    finally:
        # What a failed case left (ours only: the tag has our pid).
        for f in glob.glob("/var/run/dpdk/%s-*" % tag):
            subprocess.call(["rm", "-rf", f])
        for m in hugetlbfs_mounts():
            for f in glob.glob(os.path.join(m, tag + "-*map_*")):
                os.unlink(f)
        if own_mount:
            subprocess.call(["umount", own_mount])
        with open(NR, "w") as f:
            f.write(str(prev_nr))
        subprocess.call(["rm", "-rf", tmp])
    print("nr_hugepages restored to %d" % prev_nr)
    finish()


def run_cases(server, worker, tmp, tag):
    mounts = hugetlbfs_mounts()
    secret = make_secret(os.path.join(tmp, "job.secret"))
    print("hugetlbfs: %s; HugePages_Free=%d" % (", ".join(mounts),
                                                  meminfo("HugePages_Free")))

    def eal(name, *vdevs, lcore="0"):
        # No --no-huge and no -m: the EAL maps hugepages as it needs them.
        return (["-l", lcore, "--no-pci", "--file-prefix=%s-%s" % (tag, name),
                 "--log-level=*:warning"] + ["--vdev=" + v for v in vdevs])

    def ours(files):
        return sorted(f for f in files
                      if os.path.basename(f).startswith(tag + "-"))

    def leftovers(case, before_files, free_before, names):
        # The files go at exit; give the kernel a moment for the pages.
        for _ in range(20):
            if meminfo("HugePages_Free") == free_before:
                break
            time.sleep(0.1)
        after = mount_files(mounts)
        new = sorted(after - before_files)
        mine = ours(after)
        check(case + ": no hugepage file of ours left", not mine,
              "%d left, e.g. %s" % (len(mine), mine[:3]))
        foreign = [f for f in new if f not in mine]
        check(case + ": no new file in the hugetlbfs mount(s)", not new,
              "new: %s" % new[:5])
        free = meminfo("HugePages_Free")
        if foreign:
            print("     (another process maps hugepages now: %s; the "
                  "HugePages_Free check is not meaningful)" % foreign[:3])
        else:
            check(case + ": HugePages_Free back to %d" % free_before,
                  free == free_before, "now %d" % free)
        dirs = [d for n in names
                for d in glob.glob("/var/run/dpdk/%s-%s" % (tag, n))]
        check(case + ": runtime dir removed", not dirs, dirs)

    def run(cmd, log, timeout):
        with open(log, "w") as f:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode

    def tail(log):
        with open(log) as f:
            return f.read()[-1500:]

    # ---- a short job, both apps exit 0 ----
    before, free_before = mount_files(mounts), meminfo("HugePages_Free")
    port = free_port()
    sock = os.path.join(tmp, "w0.sock")
    slog = os.path.join(tmp, "server.log")
    with open(slog, "w") as f:
        srv = subprocess.Popen(
            [server] + eal("srv", "net_memif0,role=server,socket=%s,id=0" %
                           sock) +
            ["--", "--secret_file=" + secret, "--workers=1",
             "--listen=127.0.0.1:%d" % port, "--out_dir=" +
             os.path.join(tmp, "srv")],
            stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not ours(mount_files(mounts)):
            time.sleep(0.1)
        time.sleep(0.5)
        running = ours(mount_files(mounts))
        print("     server running: %d hugepage files of its own, "
              "HugePages_Free=%d" % (len(running), meminfo("HugePages_Free")))
        check("server maps hugepage files while it runs", len(running) > 0,
              tail(slog))
        wlog = os.path.join(tmp, "worker.log")
        wrc = run([worker] + eal("w0", "net_memif0,role=client,socket=%s,id=0"
                                 % sock, lcore="1") +
                  ["--", "--secret_file=" + secret,
                   "--server=127.0.0.1:%d" % port, "--iterations=5",
                   "--floats=4096", "--out_dir=" + os.path.join(tmp, "w0")],
                  wlog, 60)
        check("job: worker exits 0", wrc == 0, tail(wlog))
        src = srv.wait(timeout=30)
        check("job: server exits 0", src == 0, tail(slog))
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    leftovers("job", before, free_before, ["srv", "w0"])

    # ---- a worker whose server does not exist: Die -> rte_exit(1) ----
    before, free_before = mount_files(mounts), meminfo("HugePages_Free")
    flog = os.path.join(tmp, "noserver.log")
    rc = run([worker] + eal("nosrv", "net_memif0,role=client,socket=%s,id=0"
                            % os.path.join(tmp, "none.sock")) +
             ["--", "--secret_file=" + secret,
              "--server=127.0.0.1:%d" % free_port(), "--join_timeout_ms=1500",
              "--iterations=5"], flog, 60)
    check("worker without a server exits 1", rc == 1, tail(flog))
    check("worker without a server says why", "cannot reach dblp-server" in
          tail(flog), tail(flog))
    leftovers("worker without a server", before, free_before, ["nosrv"])

    # ---- a server whose --listen port is taken: Die -> rte_exit(1) ----
    before, free_before = mount_files(mounts), meminfo("HugePages_Free")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    blog = os.path.join(tmp, "busy.log")
    try:
        rc = run([server] + eal("busy", "net_memif0,role=server,socket=%s,id=0"
                                % os.path.join(tmp, "busy.sock")) +
                 ["--", "--secret_file=" + secret, "--workers=1",
                  "--listen=127.0.0.1:%d" % busy.getsockname()[1]], blog, 60)
    finally:
        busy.close()
    check("server on a taken port exits 1", rc == 1, tail(blog))
    leftovers("server on a taken port", before, free_before, ["busy"])

    # ---- SIGTERM while the server waits for its workers ----
    before, free_before = mount_files(mounts), meminfo("HugePages_Free")
    tlog = os.path.join(tmp, "term.log")
    with open(tlog, "w") as f:
        srv = subprocess.Popen(
            [server] + eal("term", "net_memif0,role=server,socket=%s,id=0" %
                           os.path.join(tmp, "term.sock")) +
            ["--", "--secret_file=" + secret, "--workers=1",
             "--listen=127.0.0.1:%d" % free_port()],
            stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and "waiting for" not in tail(tlog):
            time.sleep(0.1)
        held = ours(mount_files(mounts))
        check("server under SIGTERM had mapped hugepages", len(held) > 0,
              tail(tlog))
        # A second primary with the same --file-prefix fails its EAL start
        # and must not touch the first one's files.
        clog = os.path.join(tmp, "clash.log")
        rc = run([server] + eal("term", "net_memif0,role=server,socket=%s,id=0"
                                % os.path.join(tmp, "clash.sock"),
                                lcore="1") +
                 ["--", "--secret_file=" + secret, "--workers=1",
                  "--listen=127.0.0.1:%d" % free_port()], clog, 60)
        check("--file-prefix clash exits 1 and names --file-prefix",
              rc == 1 and "--file-prefix" in tail(clog), tail(clog))
        check("--file-prefix clash leaves the running server's files",
              ours(mount_files(mounts)) == held and
              os.path.isdir("/var/run/dpdk/%s-term" % tag),
              "%d of %d files left" % (len(ours(mount_files(mounts))),
                                       len(held)))
        srv.send_signal(signal.SIGTERM)
        rc = srv.wait(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    check("server stopped by SIGTERM exits (rc %s)" % rc, rc is not None and
          rc >= 0, tail(tlog))
    leftovers("server stopped by SIGTERM", before, free_before, ["term"])


if __name__ == "__main__":
    main()
