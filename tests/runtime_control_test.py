#!/usr/bin/env python3
"""The operator interfaces of a running job (issue #13): the runtime prompt
replayed from --cmdline-file and the /dblp/* telemetry commands.

prompt: dblp-server + 2 dblp-workers over memif. The server's file waits
  for iteration 5, sets p and shows the round; the change must be logged
  with the iteration it took effect at (K), `show round` must announce it,
  and in the server's and both workers' iterations.jsonl every row before
  K has the old p and every row from K on the new one. Worker 0's file
  injects a 2-iteration burst on its broadcast: exactly two consecutive
  rows, from the logged iteration on, are burst rows. Bad command files
  fail at start naming the line.
telemetry: a longer job; /dblp/stats of the running server is read twice
  over the telemetry socket and its counters move; /dblp/round, /policy,
  /lcores and /config answer on the server and a worker; summary.json
  holds the ports' xstats.

Usage: runtime_control_test.py BUILD_DIR
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from dblp_testlib import (check, finish, free_port, kill_all,  # noqa: E402
                          make_secret)

OLD_P, NEW_P = 0.008, 0.2


def eal(prefix, *vdevs, lcore="0"):
    # dblp:notice: the runtime changes are logged at notice level.
    return (["-l", lcore, "--no-huge", "-m", "256", "--no-pci",
             "--file-prefix=" + prefix, "--log-level=*:warning",
             "--log-level=dblp:notice"] + ["--vdev=" + v for v in vdevs])


class Job:
    """A server and two workers; every process is reaped however it ends."""

    def __init__(self, build, tmp, name, iterations, floats, server_args=(),
                 worker_args=((), ())):
        self.tmp = tmp
        self.procs = []
        self.prefix = {}
        secret = make_secret(os.path.join(tmp, "job.secret"))
        port = free_port()
        apps = os.path.join(build, "apps")
        pid = os.getpid()
        self.prefix["srv"] = "dblp-rt-%d-%s-srv" % (pid, name)
        vdevs = ["net_memif%d,role=server,socket=%s/%s-w%d.sock,id=0" %
                 (w, tmp, name, w) for w in range(2)]
        self.start("srv", [os.path.join(apps, "dblp-server")] +
                   eal(self.prefix["srv"], *vdevs) +
                   ["--", "--secret_file=" + secret, "--workers=2",
                    "--listen=127.0.0.1:%d" % port, "--policy=fixed",
                    "--p_fixed=%g" % OLD_P, "--resync_every=0",
                    "--stats_period=0",
                    "--out_dir=" + os.path.join(tmp, name + "-srv")] +
                   list(server_args))
        for w in range(2):
            key = "w%d" % w
            self.prefix[key] = "dblp-rt-%d-%s-%s" % (pid, name, key)
            self.start(key, [os.path.join(apps, "dblp-worker")] +
                       eal(self.prefix[key],
                           "net_memif0,role=client,socket=%s/%s-w%d.sock,"
                           "id=0" % (tmp, name, w), lcore="1") +
                       ["--", "--secret_file=" + secret,
                        "--server=127.0.0.1:%d" % port,
                        "--iterations=%d" % iterations,
                        "--floats=%d" % floats, "--stats_period=0",
                        "--out_dir=" + os.path.join(tmp, name + "-" + key)] +
                       list(worker_args[w]))
        self.name = name

    def start(self, key, cmd):
        out = open(os.path.join(self.tmp, "%s.out" % key), "w")
        err = open(os.path.join(self.tmp, "%s.err" % key), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL)
        out.close()
        err.close()
        p.key = key
        self.procs.append(p)
        if key == "srv":
            time.sleep(0.5)  # memif: the server's sockets first

    def wait(self, timeout):
        end = time.time() + timeout
        rcs = {}
        for p in self.procs:
            try:
                rcs[p.key] = p.wait(max(1, end - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rcs[p.key] = "timeout"
        return rcs

    def cleanup(self):
        kill_all(self.procs)

    def text(self, key, stream):
        with open(os.path.join(self.tmp, "%s.%s" % (key, stream)),
                  errors="replace") as f:
            return f.read()

    def rows(self, key):
        path = os.path.join(self.tmp, self.name + "-" + key,
                            "iterations.jsonl")
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def summary(self, key):
        path = os.path.join(self.tmp, self.name + "-" + key, "summary.json")
        with open(path) as f:
            return json.load(f)


def telemetry(prefix, commands, timeout=10):
    """Answers of `commands` over the app's telemetry socket (the first
    read is DPDK's info message)."""
    path = "/var/run/dpdk/%s/dpdk_telemetry.v2" % prefix
    end = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > end:
            raise RuntimeError("no telemetry socket " + path)
        time.sleep(0.05)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(timeout)
    s.connect(path)
    try:
        info = json.loads(s.recv(16384).decode())
        out = {}
        for c in commands:
            s.send(c.encode())
            reply = json.loads(s.recv(1 << 20).decode())
            out[c] = reply[c.split(",")[0]]
        return info, out
    finally:
        s.close()


def show_blocks(stdout, title):
    """The `show <title>` blocks printed by the prompt, as dicts."""
    blocks = []
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line == title + ":":
            d = {}
            for ln in lines[i + 1:]:
                m = re.match(r"^  (\S+): (.*)$", ln)
                if not m:
                    break
                d[m.group(1)] = m.group(2)
            blocks.append(d)
    return blocks


def p_switch(rows, k):
    """Rows before iteration k at OLD_P, from k on at NEW_P."""
    bad = [(r["iteration"], r["p"]) for r in rows
           if abs(r["p"] - (OLD_P if r["iteration"] < k else NEW_P)) > 1e-12]
    return not bad and rows, bad[:5]


def test_bad_files(build, tmp):
    server = os.path.join(build, "apps", "dblp-server")
    worker = os.path.join(build, "apps", "dblp-worker")
    cases = [
        ("set p out of range", server, "show round\n\nset p 1.5\n", "line 3",
         "[0, 1)"),
        ("unknown command", server, "# c\nshowx round\n", "line 2",
         "unknown command"),
        ("bad argument", server, "show everything\n", "line 1",
         "bad or missing arguments"),
        ("set policy bad key", server, "set policy dblp p_lo=0.1\n", "line 1",
         "p_low"),
        ("worker refuses set p", worker, "wait iteration 2\nset p 0.1\n",
         "line 2", "dblp-server command"),
    ]
    for name, app, text, line, hint in cases:
        path = os.path.join(tmp, "bad.cmds")
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run([app, "--no-huge", "--", "--insecure",
                            "--cmdline-file=" + path],
                           capture_output=True, text=True, timeout=30)
        check("bad file: %s: exit 2 naming %s" % (name, line),
              r.returncode == 2 and line in r.stderr and hint in r.stderr,
              "rc=%s stderr=%s" % (r.returncode, r.stderr[-400:]))


def test_prompt(build, tmp):
    srv_cmds = os.path.join(tmp, "server.cmds")
    with open(srv_cmds, "w") as f:
        f.write("# p from 0.008 to 0.2 mid-job\n"
                "wait iteration 5\n"
                "set p %g\n"
                "show round\n"
                "wait iteration 12\n"
                "show round\n"
                "show policy\n" % NEW_P)
    w0_cmds = os.path.join(tmp, "w0.cmds")
    with open(w0_cmds, "w") as f:
        f.write("wait iteration 3\ninject burst 0.5 2\nshow round\n")
    job = Job(build, tmp, "prompt", 30, 32768,
              server_args=["--cmdline-file=" + srv_cmds],
              worker_args=(["--cmdline-file=" + w0_cmds], []))
    try:
        rcs = job.wait(240)
    finally:
        job.cleanup()
    check("prompt job: every app exits 0", all(v == 0 for v in rcs.values()),
          "%s\n%s" % (rcs, job.text("srv", "err")[-1500:]))
    err = job.text("srv", "err")
    m = re.search(r"dblp-server: runtime: p=0\.2 \(policy fixed\(p=0\.2\)\) "
                  r"from iteration (\d+)", err)
    check("server logs the change with its iteration", m is not None,
          err[-1500:])
    if m is None:
        return
    k = int(m.group(1))
    check("the change waited for iteration 5 (took effect at %d > 5)" % k,
          k > 5 and k < 30, k)
    out = job.text("srv", "out")
    rounds = show_blocks(out, "round")
    check("two show round outputs", len(rounds) == 2, out[-2000:])
    if len(rounds) == 2:
        first, second = rounds
        check("show round after set p: next_p 0.2 from iteration %d" % k,
              first.get("next_p") == "0.2" and
              first.get("last_change_iteration") == str(k) and
              first.get("runtime_changes") == "1", first)
        check("show round after wait iteration 12: p 0.2, iteration >= 12",
              second.get("p") == "0.2" and
              int(second.get("iteration", "0")) >= 12, second)
    policy = show_blocks(out, "policy")
    check("show policy: fixed at 0.2, changed from iteration %d" % k,
          policy and policy[0].get("name") == "fixed" and
          policy[0].get("p_fixed") == "0.2" and
          policy[0].get("changed_from_iteration") == str(k), policy)
    for key in ("srv", "w0", "w1"):
        rows = job.rows(key)
        ok, bad = p_switch(rows, k)
        iters = sorted({r["iteration"] for r in rows})
        check("%s rows: p %g before iteration %d, %g from it on (%d rows)" %
              (key, OLD_P, k, NEW_P, len(rows)),
              ok and iters == list(range(30)), bad or iters)
    werr = job.text("w0", "err")
    m = re.search(r"dblp-worker: runtime: loss 0\.5 on iterations (\d+)\.\.(\d+)"
                  r" from iteration (\d+)", werr)
    check("worker 0 logs its injected burst", m is not None, werr[-1500:])
    if m:
        first = int(m.group(1))
        bursts = [r["iteration"] for r in job.rows("w0") if r["burst"]]
        check("worker 0: burst rows exactly %d and %d" % (first, first + 1),
              bursts == [first, first + 1] and first >= 3, bursts)
        wround = show_blocks(job.text("w0", "out"), "round")
        check("worker 0 show round: the injected burst",
              wround and wround[0].get("injected_burst_first") == str(first)
              and wround[0].get("injected_burst_iterations") == "2", wround)
    check("worker 1 has no burst rows",
          not [r for r in job.rows("w1") if r["burst"]])


MOVING = ("rx_frames", "tx_frames", "push_accepted", "control_messages_in")


def test_telemetry(build, tmp):
    job = Job(build, tmp, "tel", 3000, 16384)
    try:
        _, first = telemetry(job.prefix["srv"],
                             ["/dblp/round", "/dblp/stats"])
        # Until the job runs, the counters are all zero: wait until the
        # push and the first broadcast both moved them.
        end = time.time() + 60
        while any(first["/dblp/stats"].get(n, 0) == 0 for n in MOVING):
            if time.time() > end:
                break
            time.sleep(0.05)
            _, first = telemetry(job.prefix["srv"],
                                 ["/dblp/round", "/dblp/stats"])
        time.sleep(0.5)
        info, second = telemetry(
            job.prefix["srv"],
            ["/dblp/round", "/dblp/stats", "/dblp/policy", "/dblp/lcores",
             "/dblp/lcores,0", "/dblp/config", "/dblp/stats,total"])
        _, worker = telemetry(job.prefix["w1"],
                              ["/dblp/round", "/dblp/stats", "/dblp/lcores",
                               "/dblp/policy"])
        rcs = job.wait(240)
    finally:
        job.cleanup()
    check("telemetry info message first", "pid" in info and
          "version" in info, info)
    s1, s2 = first["/dblp/stats"], second["/dblp/stats"]
    for name in MOVING:
        check("/dblp/stats %s moves between two reads (%s -> %s)" %
              (name, s1.get(name), s2.get(name)),
              s2.get(name, 0) > s1.get(name, 0) > 0, (s1, s2))
    check("/dblp/stats has the per-reason counters",
          all(k in s2 for k in ("push_duplicate", "push_stale_round",
                                "push_bad_tag", "frame_bad_udp_checksum",
                                "decode_bad_magic", "device_imissed")), s2)
    r1, r2 = first["/dblp/round"], second["/dblp/round"]
    check("/dblp/round: the iteration moves",
          r2["iteration"] > r1["iteration"] and
          r2["push_round"] >= 2 * r2["iteration"] and r2["p"] == "0.008"
          and r2["clr_state"] == "non-critical", (r1, r2))
    pol = second["/dblp/policy"]
    check("/dblp/policy: fixed, p_fixed 0.008",
          pol.get("name") == "fixed" and pol.get("p_fixed") == "0.008", pol)
    lc = second["/dblp/lcores"]
    check("/dblp/lcores: fields and lcore 0's row",
          "fields" in lc and "0" in lc and
          lc["0"][lc["fields"].index("rx_frames")] > 0, lc)
    check("/dblp/lcores,0: lcore 0, shard 0",
          second["/dblp/lcores,0"].get("lcore") == 0 and
          second["/dblp/lcores,0"].get("lane") == 0, second["/dblp/lcores,0"])
    cfg = second["/dblp/config"]
    check("/dblp/config: flags and EAL",
          cfg.get("workers") == "2" and cfg.get("policy") == "fixed" and
          cfg.get("eal_file_prefix") == job.prefix["srv"] and
          cfg.get("eal_lcores") == "0", cfg)
    check("/dblp/stats,total answers",
          second["/dblp/stats,total"].get("rx_frames", 0) > 0)
    check("worker /dblp/round and /dblp/stats",
          worker["/dblp/round"].get("iterations_total") == 3000 and
          worker["/dblp/stats"].get("tx_frames", 0) > 0 and
          "bcast_accepted" in worker["/dblp/stats"], worker)
    check("worker /dblp/policy: the server's policy",
          worker["/dblp/policy"].get("describe") == "fixed(p=0.008)",
          worker["/dblp/policy"])
    check("telemetry job: every app exits 0",
          all(v == 0 for v in rcs.values()), rcs)
    for key in ("srv", "w0"):
        x = job.summary(key).get("xstats", {})
        check("%s summary.json: port0 xstats" % key,
              "port0" in x and x["port0"].get("rx_good_packets", 0) > 0,
              list(x.get("port0", {}))[:10])


def main():
    build = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="dblp-runtime-")
    try:
        test_bad_files(build, tmp)
        test_prompt(build, tmp)
        test_telemetry(build, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
