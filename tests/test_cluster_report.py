#!/usr/bin/env python3
"""Tests of tools/dblp_report.py (the report of tools/dblp-cluster) and of
the launcher's process handling, without DPDK: synthetic iterations.jsonl /
summary.json fixtures and fake dblp-server / dblp-worker executables.

Run: python3 tests/test_cluster_report.py   (or meson test --suite tools)
"""

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.join(os.path.dirname(TESTS_DIR), "tools")
sys.path.insert(0, TOOLS_DIR)

import dblp_report as R  # noqa: E402

LAUNCHER = os.path.join(TOOLS_DIR, "dblp-cluster")


def load_launcher():
    loader = importlib.machinery.SourceFileLoader("dblp_cluster", LAUNCHER)
    spec = importlib.util.spec_from_loader("dblp_cluster", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------
# Fixtures: 3 workers, 60 iterations, bursts at 20 and 45, N = 723.
#
# Worker r, clean iteration i: latency base + 50 r + 10 (i % 4), so the max
# over workers is base + 100 + 10 (i % 4). Of the 58 clean iterations, i % 4
# is 0 fourteen times (20 is a burst), 1 fourteen times (45 is a burst), 2
# and 3 fifteen times: sorted max latencies are (base+100) x14, (base+110)
# x14, (base+120) x15, (base+130) x15; the nearest-rank median (29th) is
# base + 120 (an interpolated median would be base + 115).
# ---------------------------------------------------------------------------

N = 723
BURSTS = (20, 45)


def policy_rows(rank, *, clean_base, p_of, burst_lat, burst_passes,
                burst_pkts, clean_pkts, flag_bursts=True):
    rows = []
    for i in range(60):
        burst = i in burst_lat
        row = {
            "iteration": i, "rank": rank,
            "send_latency_us": (burst_lat[i] + 100.0 * rank) if burst else
            clean_base + 50.0 * rank + 10.0 * (i % 4),
            "bcast_latency_us": 100.0,
            "passes": burst_passes[rank] if burst else 1,
            "bcast_passes": 1,
            "packets_sent": burst_pkts[rank] if burst else clean_pkts,
            "packets_resent": 0, "delivered_fraction": 1.0,
            "p": p_of(i), "critical": False, "grad_norm": 1.0,
            "burst": bool(burst and flag_bursts),
            "control_rtt_us": 25.0 if burst else 0.0,
        }
        rows.append(row)
    return rows


def write_policy(root, policy, *, clean_base, p_of, burst_lat, burst_passes,
                 burst_pkts, clean_pkts, us_per_packet, rtts,
                 server_counters=None, worker_counters=None,
                 flag_bursts=True, summaries=True):
    pdir = os.path.join(root, policy)
    for r in range(3):
        wdir = os.path.join(pdir, f"worker{r}")
        os.makedirs(wdir)
        rows = policy_rows(r, clean_base=clean_base, p_of=p_of,
                           burst_lat=burst_lat, burst_passes=burst_passes,
                           burst_pkts=burst_pkts, clean_pkts=clean_pkts,
                           flag_bursts=flag_bursts)
        with open(os.path.join(wdir, "iterations.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        if summaries:
            with open(os.path.join(wdir, "summary.json"), "w") as f:
                json.dump({"role": "worker", "rank": r, "policy": policy,
                           "us_per_packet_clean": us_per_packet[r],
                           "control_rtt_us": rtts[r],
                           "counters": worker_counters or {},
                           "info": {"loss": "none"}}, f)
    sdir = os.path.join(pdir, "server")
    os.makedirs(sdir)
    with open(os.path.join(sdir, "summary.json"), "w") as f:
        json.dump({"role": "server", "rank": -1, "policy": policy,
                   "counters": server_counters or {}, "info": {}}, f)
    return pdir


def write_fixed(root, **kw):
    # Burst 20 within the model; burst 45 far above it (flagged).
    return write_policy(
        root, "fixed", clean_base=900.0, p_of=lambda i: 0.008,
        burst_lat={20: 9000.0, 45: 13000.0}, burst_passes=[14, 15, 14],
        burst_pkts=[2400, 2410, 2420], clean_pkts=723,
        us_per_packet=[3.5, 3.6, 3.7], rtts=[20.0, 25.0, 30.0],
        server_counters={"push_accepted": 100, "push_stale_round": 5,
                         "push_malformed": 2, "decode_bad_magic": 3,
                         "frame_bad_udp_checksum": 1, "injected_drops": 7,
                         "device_imissed": 1, "device_oerrors": 2,
                         "control_protocol_errors": 0},
        worker_counters={"injected_drops": 1000, "device_rx_nombuf": 1},
        **kw)


def write_dblp(root, **kw):
    return write_policy(
        root, "dblp", clean_base=500.0,
        p_of=lambda i: 0.008 if i < 10 else 0.408,
        burst_lat={20: 1300.0, 45: 1400.0}, burst_passes=[3, 3, 3],
        burst_pkts=[1430, 1440, 1450], clean_pkts=428,
        us_per_packet=[1.0, 1.0, 1.0], rtts=[25.0, 25.0, 25.0], **kw)


class AnalyticModel(unittest.TestCase):
    def test_chunking(self):
        self.assertEqual(R.chunk_payload_bytes(1500), 1452)
        self.assertEqual(R.num_chunks(262144, 1500), 723)
        self.assertEqual(R.chunk_payload_bytes(9000), 8952)
        self.assertEqual(R.chunk_payload_bytes(1501), 1452)
        self.assertEqual(R.num_chunks(363, 1500), 1)  # 1452 B exactly
        self.assertEqual(R.num_chunks(364, 1500), 2)

    def test_stop_threshold(self):
        self.assertEqual(R.stop_threshold(1000, 0.008), 992)  # not 993
        self.assertEqual(R.stop_threshold(723, 0.408), 429)
        self.assertEqual(R.stop_threshold(723, 0.0), 723)
        self.assertEqual(R.stop_threshold(100, 0.29), 71)

    def test_design_figures(self):
        e = R.expected_passes(723, 0.7, 0.008)
        self.assertEqual(e["tolerated"], 5)
        self.assertEqual(e["passes"], 14)
        self.assertAlmostEqual(e["packets"], 718 / 0.3, places=6)
        self.assertAlmostEqual(e["packets_over_n"], 3.31, places=2)
        e = R.expected_passes(723, 0.7, 0.408)
        self.assertEqual(e["tolerated"], 294)
        self.assertEqual(e["passes"], 3)
        self.assertEqual(round(e["packets_over_n"], 2), 1.98)
        # DESIGN.md / analytic.h with n = 1000.
        e = R.expected_passes(1000, 0.7, 0.008)
        self.assertEqual((e["passes"], round(e["packets_over_n"], 3)),
                         (14, 3.307))
        e = R.expected_passes(1000, 0.7, 0.408)
        self.assertEqual((e["passes"], round(e["packets_over_n"], 3)),
                         (3, 1.973))

    def test_reliable_and_edges(self):
        e = R.expected_passes(723, 0.7, 0.0)  # L^k 723 < 0.5 -> k = 21
        self.assertEqual(e["passes"], 21)
        self.assertAlmostEqual(e["packets"], 2410.0)
        e = R.expected_passes(723, 0.0, 0.408)
        self.assertEqual((e["passes"], e["packets"]), (1, 429.0))
        self.assertEqual(R.expected_passes(0, 0.7, 0.1)["passes"], 0)
        with self.assertRaises(ValueError):
            R.expected_passes(723, 1.0, 0.1)
        with self.assertRaises(ValueError):
            R.expected_passes(723, 0.7, -0.1)

    def test_round_time(self):
        e = R.expected_passes(723, 0.7, 0.408)
        # 1430 packets * 1 us + 2 * 25 us + 12.5 us
        self.assertAlmostEqual(R.expected_round_us(e, 1.0, 25.0), 1492.5)
        self.assertEqual(R.expected_round_us({"passes": 0, "packets": 0},
                                             1.0, 25.0), 0.0)

    def test_percentiles(self):
        self.assertEqual(R.percentile_nearest_rank([4, 1, 3, 2], 50), 2)
        self.assertEqual(R.percentile_nearest_rank(range(1, 61), 99), 60)
        self.assertEqual(R.percentile_nearest_rank(range(1, 1001), 99), 990)
        self.assertIsNone(R.percentile_nearest_rank([], 50))
        self.assertEqual(R.percentile_nearest_rank([None, 5.0], 50), 5.0)


class ClusterReport(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-report-test-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def report(self, **kw):
        args = dict(floats=262144, burst_loss=0.7, configured_bursts=BURSTS,
                    params={"workers": 3, "iterations": 60, "seed": 1})
        args.update(kw)
        return R.build_report(self.dir, ["fixed", "dblp"], **args)

    def test_policy_numbers(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        rep = self.report()
        f, d = rep["results"]["fixed"], rep["results"]["dblp"]
        self.assertEqual(rep["n_used"]["fixed"]["n"], 723)
        self.assertEqual(f["bursts"], [20, 45])
        self.assertEqual(f["clean_count"], 58)
        self.assertEqual(f["clean_p50_us"], 1020.0)  # nearest rank, max
        self.assertEqual(d["clean_p50_us"], 620.0)
        self.assertEqual(f["p99_us"], 13200.0)
        self.assertEqual(f["max_us"], 13200.0)
        self.assertAlmostEqual(f["mean_us"], 81290 / 60)
        self.assertAlmostEqual(d["mean_us"], 38790 / 60)
        self.assertEqual(d["p99_us"], 1600.0)
        self.assertAlmostEqual(f["us_per_packet_clean"], 3.6)
        self.assertAlmostEqual(f["control_rtt_us"], 25.0)
        self.assertEqual(d["p_clean"], [0.008, 0.408])

        b20 = f["burst_rows"][0]
        self.assertEqual(b20["iteration"], 20)
        self.assertEqual(b20["latency_us"], 9200.0)  # max over workers
        self.assertEqual(b20["median_worker_us"], 9100.0)  # model compares
        self.assertAlmostEqual(b20["passes"], 43 / 3)
        self.assertEqual(b20["passes_max"], 15)
        self.assertAlmostEqual(b20["packets_over_n"], 2410 / 723)
        self.assertAlmostEqual(b20["p"], 0.008)
        exp = b20["expected"]
        self.assertEqual(exp["passes"], 14)
        self.assertAlmostEqual(exp["us"], 718 / 0.3 * 3.6 + 13 * 25 + 12.5)
        self.assertAlmostEqual(exp["measured_over_expected"],
                               9100 / (718 / 0.3 * 3.6 + 337.5))
        self.assertTrue(exp["within_margin"])
        self.assertFalse(f["burst_rows"][1]["expected"]["within_margin"])

        db = d["burst_rows"][0]
        self.assertEqual(db["expected"]["passes"], 3)
        self.assertEqual(round(db["expected"]["packets_over_n"], 2), 1.98)
        self.assertAlmostEqual(db["expected"]["us"], 1492.5)
        self.assertAlmostEqual(db["expected"]["measured_over_expected"],
                               1400 / 1492.5)  # the median worker

    def test_ratios(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        (c,) = self.report()["ratios"]
        self.assertEqual((c["numerator"], c["denominator"]), ("fixed", "dblp"))
        self.assertAlmostEqual(c["clean_p50"], 1020 / 620)
        self.assertEqual([b["iteration"] for b in c["bursts"]], [20, 45])
        self.assertAlmostEqual(c["bursts"][0]["ratio"], 9200 / 1500)
        self.assertAlmostEqual(c["bursts"][1]["ratio"], 13200 / 1600)
        self.assertAlmostEqual(c["p99"], 13200 / 1600)
        self.assertAlmostEqual(c["mean"], (81290 / 60) / (38790 / 60))

    def test_bursts_found_without_configuration(self):
        # --burst_random: the launcher does not know the iterations; the
        # rows' burst flags do.
        write_fixed(self.dir)
        write_dblp(self.dir)
        rep = self.report(configured_bursts=())
        self.assertEqual(rep["results"]["fixed"]["bursts"], [20, 45])
        self.assertEqual(rep["results"]["fixed"]["clean_p50_us"], 1020.0)

    def test_configured_bursts_when_rows_do_not_flag(self):
        write_fixed(self.dir, flag_bursts=False)
        write_dblp(self.dir, flag_bursts=False)
        rep = self.report()
        self.assertEqual(rep["results"]["dblp"]["bursts"], [20, 45])
        # Without configuration nothing is a burst: bursts count as clean.
        rep = self.report(configured_bursts=())
        self.assertEqual(rep["results"]["dblp"]["bursts"], [])
        self.assertEqual(rep["results"]["dblp"]["clean_count"], 60)

    def test_fallbacks_without_worker_summaries(self):
        write_fixed(self.dir, summaries=False)
        write_dblp(self.dir, summaries=False)
        rep = self.report()
        f = rep["results"]["fixed"]
        # clean one-pass rows, each packets * t + rtt/2 (run_report.cc):
        # t = sum(latency - rtt/2) / sum packets, rtt = 25 from the rows
        lat = sum(900 + 50 * r + 10 * (i % 4) - 12.5 for r in range(3)
                  for i in range(60) if i not in BURSTS)
        self.assertAlmostEqual(f["us_per_packet_clean"], lat / (58 * 3 * 723))
        self.assertEqual(f["us_per_packet_source"],
                         "(clean send latency - rtt/2) / packets_sent")
        self.assertAlmostEqual(f["control_rtt_us"], 25.0)  # from the rows
        self.assertIsNotNone(f["burst_rows"][0]["expected"]["us"])

    def test_counters(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        c = self.report()["results"]["fixed"]["counters"]
        self.assertEqual(c["server"]["stale"], 5)
        self.assertEqual(c["server"]["malformed"], 6)
        self.assertEqual(c["server"]["injected_drops"], 7)
        self.assertEqual(c["server"]["device_drops"], 3)
        self.assertEqual(c["workers"]["injected_drops"], 3000)
        self.assertEqual(c["workers"]["device_drops"], 3)

    def test_chunks_sources(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        self.assertEqual(R.chunks_from_stdout(
            "dblp-server: 3 workers joined; 700 chunks of 1452 B per round"),
            700)
        rep = self.report(chunks_hint=700)
        self.assertEqual(rep["n_used"]["fixed"], {"n": 700,
                                                  "source": "app banner"})
        self.assertAlmostEqual(
            rep["results"]["fixed"]["burst_rows"][0]["packets_over_n"],
            2410 / 700)

    def test_missing_policy(self):
        write_fixed(self.dir)
        rep = self.report()
        self.assertIsNone(rep["results"]["dblp"])
        self.assertEqual(rep["ratios"], [])
        self.assertRegex(R.format_text(rep), r"\ndblp +no data")

    def test_text_and_files(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        rep = self.report()
        text = R.write_report(self.dir, rep)
        if os.environ.get("DBLP_SHOW_REPORT"):
            print("\n" + text)
        self.assertIn("ratio fixed/dblp: clean p50 1.65x, burst@20 6.13x, "
                      "burst@45 8.25x, p99 8.25x, mean 2.10x", text)
        lines = text.splitlines()
        b45 = [l for l in lines if l.startswith("45") and "fixed" in l]
        self.assertEqual(len(b45), 1)
        self.assertIn("OUTSIDE MARGIN", b45[0])
        b20 = [l for l in lines if l.startswith("20") and "dblp" in l]
        self.assertIn("1.98", b20[0])
        self.assertNotIn("OUTSIDE", b20[0])
        with open(os.path.join(self.dir, "report.json")) as f:
            j = json.load(f)
        self.assertEqual(j["results"]["dblp"]["clean_p50_us"], 620.0)
        with open(os.path.join(self.dir, "report.md")) as f:
            self.assertIn("ratio fixed/dblp", f.read())

    def test_progress_from_streamed_rows(self):
        srv = os.path.join(self.dir, "progress")
        os.makedirs(srv)
        reader = R.JobProgress(srv, 3)
        self.assertIsNone(reader.read())
        path = os.path.join(srv, "iterations.jsonl")
        with open(path, "w") as f:
            for it in range(4):
                for w in range(3):
                    f.write(json.dumps({"iteration": it, "rank": w,
                                        "p": 0.408, "critical": False})
                            + "\n")
            f.write('{"iteration": 4, "rank": 0, "p": 0.0')  # being written
        self.assertEqual(reader.read(),
                         {"done": 4, "p": 0.408, "critical": False})
        with open(path, "a") as f:  # the row completes, two more follow
            f.write(', "critical": true}\n')
            for w in (1, 2):
                f.write(json.dumps({"iteration": 4, "rank": w, "p": 0.008,
                                    "critical": True}) + "\n")
        self.assertEqual(reader.read(),
                         {"done": 5, "p": 0.008, "critical": True})
        self.assertEqual(reader.offset, os.path.getsize(path))
        line = R.format_progress("dblp", 4, 10, 8.0, 0.408, False)
        self.assertEqual(line, "dblp: iteration 4/10 ( 40%) ETA 12s  "
                               "p=0.408  CLR normal")
        self.assertIn("done", R.format_progress("x", 10, 10, 3, 0.008, True))
        self.assertIn("CLR critical",
                      R.format_progress("x", 1, 10, 3, 0.008, True))

    def test_plots_written_next_to_the_report(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("no matplotlib in this python")
        files = R.write_plots(self.dir, ["fixed", "dblp"], BURSTS)
        self.assertEqual([os.path.basename(f) for f in files],
                         ["latency.png", "cdf.png"])
        for f in files:
            with open(f, "rb") as fh:
                self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")

    def test_margin_is_configurable(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        rep = self.report(margin=0.5)
        self.assertTrue(
            rep["results"]["fixed"]["burst_rows"][1]["expected"]
            ["within_margin"])  # 1.45 is inside +-50%

    def test_warmup(self):
        write_fixed(self.dir)
        write_dblp(self.dir)
        rep = self.report(warmup=4)
        self.assertEqual(rep["results"]["fixed"]["iterations"], 56)
        self.assertEqual(rep["results"]["fixed"]["clean_count"], 54)


# ---------------------------------------------------------------------------
# The launcher, with fake apps (no DPDK): command lines, the run, failures.
# ---------------------------------------------------------------------------

FAKE_APP = textwrap.dedent(r'''
    #!{python}
    # Fake {role}: records its argv, writes fixture results, behaves as
    # FAKE_MODE says (ok | fail_worker1 | hang).
    import json, os, sys, time
    role = "{role}"
    argv = sys.argv[1:]
    app = argv[argv.index("--") + 1:]
    flags = dict(a[2:].split("=", 1) for a in app if "=" in a)
    out = flags["out_dir"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "argv.json"), "w") as f:
        json.dump(argv, f)
    mode = os.environ.get("FAKE_MODE", "ok")
    with open(os.path.join(out, "pid"), "w") as f:
        f.write(str(os.getpid()))
    if role == "server":
        print("dblp-server: %s port(s), waiting for %s workers on %s" %
              (flags["workers"], flags["workers"], flags["listen"]), flush=True)
        if mode == "hang":
            time.sleep(1000)
        # Like the real server: runs until every worker is done.
        root = os.path.dirname(out)
        for _ in range(200):
            if all(os.path.exists(os.path.join(root, "worker%d" % i,
                                               "summary.json"))
                   or mode == "fail_worker1"
                   for i in range(int(flags["workers"]))):
                break
            time.sleep(0.05)
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump({{"counters": {{"push_stale_round": 4}}, "info": {{}}}}, f)
        print("dblp-server: 2 workers joined; 723 chunks of 1452 B per round")
        sys.exit(0)
    if mode == "fail_worker1" and out.endswith("worker1"):
        print("EAL: something went wrong", file=sys.stderr)
        print("dblp-worker: cannot join 127.0.0.1: refused", file=sys.stderr)
        sys.exit(3)
    bursts = [int(x) for x in flags.get("burst_iters", "").split(",") if x]
    with open(os.path.join(out, "iterations.jsonl"), "w") as f:
        for i in range(int(flags["iterations"])):
            b = i in bursts
            f.write(json.dumps({{"iteration": i, "rank": 0,
                "send_latency_us": 5000.0 if b else 700.0,
                "passes": 3 if b else 1,
                "packets_sent": 1430 if b else 723, "p": 0.408,
                "burst": b, "control_rtt_us": 20.0 if b else 0.0}}) + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({{"us_per_packet_clean": 1.0, "control_rtt_us": 20.0,
                   "counters": {{}}, "info": {{}}}}, f)
''').lstrip()


class Launcher(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-launcher-test-")
        apps = os.path.join(self.dir, "build", "apps")
        os.makedirs(apps)
        for role in ("server", "worker"):
            path = os.path.join(apps, f"dblp-{role}")
            with open(path, "w") as f:
                f.write(FAKE_APP.format(python=sys.executable, role=role))
            os.chmod(path, 0o755)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_launcher(self, *extra, mode="ok", timeout=60):
        env = dict(os.environ, FAKE_MODE=mode)
        out = os.path.join(self.dir, "out")
        return subprocess.run(
            [sys.executable, LAUNCHER, "--build",
             os.path.join(self.dir, "build"), "--workers", "2",
             "--iterations", "30", "--burst_iters", "10,20",
             "--out", out, *extra],
            env=env, capture_output=True, text=True, timeout=timeout), out

    def test_sharded_command_lines(self):
        """--shards 2: shard 0 is the directory ("server"), shard 1 names
        it; each worker has one memif port per shard (port k <-> shard k)
        and JOINs the directory only."""
        L = load_launcher()
        args = L.parse_args(["--workers", "2", "--shards", "2"])
        cmds = L.build_commands(args, "dblp", "9-dblp", "/s", [9100, 9101],
                                "/r", "/a", "/b", L.Testbed(args, "9-dblp"))
        self.assertEqual([c[0] for c in cmds],
                         ["server", "shard1", "worker0", "worker1"])
        s0, s1, w1 = cmds[0][1], cmds[1][1], cmds[3][1]
        self.assertIn("--shard_index=0", s0)
        self.assertFalse(any(a.startswith("--directory") for a in s0))
        self.assertIn("--shard_index=1", s1)
        self.assertIn("--directory=127.0.0.1:9100", s1)
        self.assertIn("--listen=127.0.0.1:9101", s1)
        self.assertIn("--vdev=net_memif1,role=server,socket=/s/s1w1.sock,id=0",
                      s1)
        self.assertIn("--vdev=net_memif0,role=client,socket=/s/s0w1.sock,id=0",
                      w1)
        self.assertIn("--vdev=net_memif1,role=client,socket=/s/s1w1.sock,id=0",
                      w1)
        self.assertIn("--server=127.0.0.1:9100", w1)
        # The netns testbed: every process in its own namespace, one
        # af_packet port, control on the namespaces' addresses.
        if os.geteuid() == 0:
            args = L.parse_args(["--workers", "2", "--shards", "2",
                                 "--transport", "netns",
                                 "--server_lcores", "2"])
            bed = L.Testbed(args, "9-dblp")
            cmds = L.build_commands(args, "dblp", "9-dblp", "/s",
                                    [9100, 9101], "/r", "/a", "/b", bed)
            for i, (_, argv, _) in enumerate(cmds):
                self.assertEqual(argv[:4], ["ip", "netns", "exec", bed.host(i)])
                self.assertIn("--vdev=net_af_packet0,iface=eth0,qpairs=2", argv)
            self.assertIn("--directory=%s:9100" % bed.ip(0), cmds[1][1])
            self.assertIn("--server=%s:9100" % bed.ip(0), cmds[3][1])
            self.assertIn("--local_ip=%s" % bed.ip(3), cmds[3][1])

    def test_command_lines(self):
        L = load_launcher()
        args = L.parse_args(["--workers", "3", "--norm_jumps", "30",
                             "--", "--send_order=rotating"])
        cmds = L.build_commands(args, "dblp", "42-dblp", "/tmp/s", [9100],
                                "/r/dblp", "/b/srv", "/b/wrk",
                                L.Testbed(args, "42-dblp"))
        self.assertEqual([c[0] for c in cmds],
                         ["server", "worker0", "worker1", "worker2"])
        prefixes = [c[2] for c in cmds]
        self.assertEqual(len(set(prefixes)), 4)
        for _, argv, prefix in cmds:
            self.assertIn(f"--file-prefix={prefix}", argv)
            self.assertIn("--no-huge", argv)
            self.assertIn("--seed=1", argv)
            self.assertIn("--burst_iters=20,45", argv)
            self.assertIn("--burst_loss=0.7", argv)
            self.assertIn("--stats_period=0", argv)
            self.assertEqual(argv[-1], "--send_order=rotating")
        srv = cmds[0][1]
        for i in range(3):
            self.assertIn(f"--vdev=net_memif{i},role=server,"
                          f"socket=/tmp/s/s0w{i}.sock,id=0", srv)
        self.assertIn("--listen=127.0.0.1:9100", srv)
        self.assertIn("--out_dir=/r/dblp/server", srv)
        self.assertNotIn("--norm_jumps=30", srv)  # not a server flag
        w2 = cmds[3][1]
        self.assertIn("--vdev=net_memif0,role=client,socket=/tmp/s/s0w2.sock,"
                      "id=0", w2)
        self.assertFalse(any(a.startswith("--shard") for a in srv + w2))
        self.assertIn("--server=127.0.0.1:9100", w2)
        self.assertIn("--norm_jumps=30", w2)
        self.assertIn("--out_dir=/r/dblp/worker2", w2)
        self.assertNotIn("--policy=dblp", w2)

        # {worker_dir} in --worker_flags: each worker its own out dir; the
        # server never sees it; a dir with a space stays one argument.
        args = L.parse_args(["--workers", "2", "--worker_flags="
                             "--log_dir={worker_dir} --tag=a{worker_dir}b",
                             "--server_flags=--zero_fraction=0.4"])
        cmds = L.build_commands(args, "reliable", "7-rel", "/s", [1],
                                "/r x/reliable", "/a", "/b",
                                L.Testbed(args, "7-rel"))
        self.assertIn("--zero_fraction=0.4", cmds[0][1])
        self.assertFalse(any("log_dir" in a or "{worker_dir}" in a
                             for a in cmds[0][1]))
        for i in range(2):
            w = cmds[1 + i][1]
            self.assertIn(f"--log_dir=/r x/reliable/worker{i}", w)
            self.assertIn(f"--tag=a/r x/reliable/worker{i}b", w)
            self.assertIn(f"--out_dir=/r x/reliable/worker{i}", w)
            self.assertFalse(any("{worker_dir}" in a for a in w))
        self.assertEqual(L.worker_flags_for("--x=1 '--d={worker_dir}/s t'",
                                            "/o/w3"),
                         ["--x=1", "--d=/o/w3/s t"])
        self.assertEqual(L.worker_flags_for("", "/o"), [])

        args = L.parse_args(["--iterations", "100", "--burst_random", "4"])
        cmds = L.build_commands(args, "fixed", "1-fixed", "/s", [1], "/r",
                                "/a", "/b", L.Testbed(args, "1-fixed"))
        for _, argv, _ in cmds:
            self.assertIn("--burst_random=4", argv)
            self.assertIn("--burst_range=10,99", argv)
            self.assertFalse(any(a.startswith("--burst_iters") for a in argv))

    def test_run_ok(self):
        p, out = self.run_launcher()
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)
        self.assertIn("ratio fixed/dblp: clean p50 1.00x", p.stdout)
        for pol in ("fixed", "dblp"):
            for name in ("server", "worker0", "worker1"):
                self.assertTrue(os.path.isfile(
                    os.path.join(out, pol, "logs", f"{name}.stdout")))
        with open(os.path.join(out, "report.json")) as f:
            rep = json.load(f)
        self.assertEqual(rep["n_used"]["dblp"]["source"], "app banner")
        self.assertEqual(rep["results"]["dblp"]["bursts"], [10, 20])
        self.assertEqual(rep["results"]["dblp"]["counters"]["server"]["stale"],
                         4)
        # Socket dirs removed.
        with open(os.path.join(out, "fixed", "server", "argv.json")) as f:
            srv_argv = json.load(f)
        sock = [a for a in srv_argv if a.startswith("--vdev=")][0]
        sock_dir = os.path.dirname(sock.split("socket=")[1].split(",")[0])
        self.assertFalse(os.path.exists(sock_dir))
        # --report_only rebuilds the same report.
        q = subprocess.run([sys.executable, LAUNCHER, "--report_only", out],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(q.returncode, 0, q.stderr)
        self.assertIn("ratio fixed/dblp", q.stdout)

    def test_worker_failure_is_reported(self):
        p, _ = self.run_launcher("--policies", "dblp", mode="fail_worker1")
        self.assertEqual(p.returncode, 1)
        self.assertIn("policy dblp FAILED", p.stderr)
        self.assertIn("worker1: exit code 3", p.stderr)
        self.assertIn("| dblp-worker: cannot join 127.0.0.1: refused",
                      p.stderr)

    def test_timeout_kills(self):
        p, out = self.run_launcher("--policies", "fixed", "--timeout", "2",
                                 mode="hang")
        self.assertEqual(p.returncode, 1)
        self.assertIn("timeout after 2 s", p.stderr)
        self.assertIn("server: killed by SIGTERM (timeout after 2 s)",
                      p.stderr)
        with open(os.path.join(out, "fixed", "server", "pid")) as f:
            pid = int(f.read())
        with self.assertRaises(ProcessLookupError):  # stopped and reaped
            os.kill(pid, 0)

    def test_missing_binaries(self):
        p = subprocess.run([sys.executable, LAUNCHER, "--build",
                            os.path.join(self.dir, "nope"), "--out",
                            os.path.join(self.dir, "o")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("not built", p.stderr)

    def test_usage_errors(self):
        for bad in (["--policies", "fast"], ["--workers", "0"],
                    ["--burst_loss", "1.0"],
                    ["--burst_iters", "1", "--burst_random", "2"]):
            p = subprocess.run([sys.executable, LAUNCHER, "--dry_run", *bad],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, bad)


if __name__ == "__main__":
    unittest.main(verbosity=2)
