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
                 flag_bursts=True, summaries=True, server_phase=None,
                 server_policy=None, worker_critical=None):
    """server_phase: i -> (p, critical) writes the server's per-iteration
    rows (one per worker, as dblp-server does); worker_critical: i -> bool
    for the workers' rows' `critical` (False without it)."""
    pdir = os.path.join(root, policy)
    for r in range(3):
        wdir = os.path.join(pdir, f"worker{r}")
        os.makedirs(wdir)
        rows = policy_rows(r, clean_base=clean_base, p_of=p_of,
                           burst_lat=burst_lat, burst_passes=burst_passes,
                           burst_pkts=burst_pkts, clean_pkts=clean_pkts,
                           flag_bursts=flag_bursts)
        if worker_critical:
            for row in rows:
                row["critical"] = worker_critical(row["iteration"])
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
        json.dump({"role": "server", "rank": -1,
                   "policy": server_policy or policy,
                   "counters": server_counters or {}, "info": {}}, f)
    if server_phase:
        with open(os.path.join(sdir, "iterations.jsonl"), "w") as f:
            for i in range(60):
                p, critical = server_phase(i)
                for r in range(3):
                    f.write(json.dumps({"iteration": i, "rank": r, "p": p,
                                        "critical": critical,
                                        "resync": False}) + "\n")
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
# The CLR phase: which burst fell inside a critical window, and the p in
# force, from the server's rows; the latency plot shades the windows.
#
# dblp's server is critical in 0-9 and 40-49 (p_low 0.008), at p_high 0.408
# elsewhere: burst 20 falls outside, burst 45 inside. The workers' rows say
# critical nowhere, so only the server's rows can give these answers.
# ---------------------------------------------------------------------------

def clr_of(i):
    return i < 10 or 40 <= i < 50


def write_phased(root):
    write_policy(
        root, "fixed", clean_base=900.0, p_of=lambda i: 0.008,
        burst_lat={20: 9000.0, 45: 13000.0}, burst_passes=[14, 14, 14],
        burst_pkts=[2400, 2400, 2400], clean_pkts=723,
        us_per_packet=[3.6] * 3, rtts=[25.0] * 3,
        server_policy="fixed(p=0.008)",
        server_phase=lambda i: (0.008, False))
    write_policy(
        root, "dblp", clean_base=500.0,
        p_of=lambda i: 0.008 if clr_of(i) else 0.408,
        burst_lat={20: 1300.0, 45: 9000.0}, burst_passes=[3, 3, 3],
        burst_pkts=[1430, 1440, 1450], clean_pkts=428,
        us_per_packet=[1.0] * 3, rtts=[25.0] * 3,
        server_policy="dblp(p_low=0.008,p_high=0.408,freq=10,eta=0.5)",
        server_phase=lambda i: (0.008, True) if clr_of(i) else (0.408, False))


def span_x(patch):
    """Data x extent of an axvspan: a Polygon before matplotlib 3.9, a
    Rectangle since."""
    if hasattr(patch, "get_width"):
        return (patch.get_x(), patch.get_x() + patch.get_width())
    xs = [v[0] for v in patch.get_xy()]
    return (min(xs), max(xs))


class ClrPhase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dblp-clr-test-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def report(self):
        return R.build_report(self.dir, ["fixed", "dblp"], floats=262144,
                              burst_loss=0.7, configured_bursts=BURSTS,
                              params={"workers": 3, "iterations": 60})

    def test_windows(self):
        T, F = True, False
        self.assertEqual(
            R.clr_windows({0: T, 1: T, 2: F, 4: T, 5: T, 6: F, 8: T}),
            [[0, 1], [4, 5], [8, 8]])
        # A missing number (a resync round) does not split a window; a row
        # that is not critical, or whose workers disagree (None), does.
        self.assertEqual(R.clr_windows({0: T, 1: T, 3: T, 4: F}), [[0, 3]])
        self.assertEqual(R.clr_windows({0: T, 1: None, 2: T}),
                         [[0, 0], [2, 2]])
        self.assertEqual(R.clr_windows({0: F, 1: F}), [])
        self.assertEqual(R.format_ranges([[0, 20], [31, 31]]), "0-20, 31")

    def test_burst_inside_and_outside_a_window(self):
        write_phased(self.dir)
        rep = self.report()
        d = rep["results"]["dblp"]
        self.assertEqual(d["clr"]["source"], "server rows")
        self.assertTrue(d["clr"]["detector"])
        self.assertEqual(d["clr"]["windows"], [[0, 9], [40, 49]])
        self.assertEqual(d["clr"]["critical_iterations"], 20)
        self.assertEqual(d["clr"]["p_inside"], [0.008])
        self.assertEqual(d["clr"]["p_outside"], [0.408])
        b20, b45 = d["burst_rows"]
        self.assertEqual((b20["iteration"], b20["clr"]), (20, "outside"))
        self.assertAlmostEqual(b20["p_in_force"], 0.408)  # p_high
        self.assertEqual((b45["iteration"], b45["clr"]), (45, "inside"))
        self.assertAlmostEqual(b45["p_in_force"], 0.008)  # p_low
        self.assertFalse(b45["p_mixed"])
        # The model follows the phase: 14 passes inside, 3 outside.
        self.assertEqual(b45["expected"]["passes"], 14)
        self.assertEqual(b20["expected"]["passes"], 3)
        # fixed has no detector: its rows' critical=false is no "outside".
        f = rep["results"]["fixed"]
        self.assertFalse(f["clr"]["detector"])
        self.assertEqual(f["clr"]["windows"], [])
        self.assertEqual([e["clr"] for e in f["burst_rows"]], [None, None])
        self.assertAlmostEqual(f["burst_rows"][1]["p_in_force"], 0.008)

        text = R.write_report(self.dir, rep)
        if os.environ.get("DBLP_SHOW_REPORT"):
            print("\n" + text)
        lines = text.splitlines()
        header = next(l for l in lines if l.startswith("burst  "))
        self.assertRegex(header, r"^burst +policy +p +CLR +passes")

        def row(it, pol):
            (l,) = [l for l in lines if l.split()[:2] == [str(it), pol]]
            return l.split()
        self.assertEqual(row(20, "dblp")[2:4], ["0.408", "outside"])
        self.assertEqual(row(45, "dblp")[2:4], ["0.008", "inside"])
        self.assertEqual(row(45, "fixed")[2:4], ["0.008", "-"])
        self.assertIn("dblp CLR windows: 0-9, 40-49 (20 iterations at "
                      "p = 0.008); outside them p = 0.408", lines)
        self.assertIn("fixed CLR windows: - (no CLR detector; p = 0.008 in "
                      "every iteration)", lines)
        with open(os.path.join(self.dir, "report.md")) as fh:
            md = fh.read()
        self.assertIn("dblp CLR windows: 0-9, 40-49", md)
        self.assertIn("inside", md)
        with open(os.path.join(self.dir, "report.json")) as fh:
            j = json.load(fh)
        self.assertEqual(j["results"]["dblp"]["clr"]["windows"],
                         [[0, 9], [40, 49]])
        self.assertEqual(j["results"]["dblp"]["burst_rows"][1]["clr"],
                         "inside")

    def test_server_p_is_the_p_in_force(self):
        # The workers' rows say 0.408 throughout; the server (the push's
        # receiver) decided 0.008 in its windows: its p is shown and
        # modelled, and the disagreement is flagged.
        write_policy(
            self.dir, "dblp", clean_base=500.0, p_of=lambda i: 0.408,
            burst_lat={20: 1300.0, 45: 9000.0}, burst_passes=[3, 3, 3],
            burst_pkts=[1430] * 3, clean_pkts=428,
            us_per_packet=[1.0] * 3, rtts=[25.0] * 3,
            server_phase=lambda i: (0.008, True) if clr_of(i)
            else (0.408, False))
        rep = R.build_report(self.dir, ["dblp"], floats=262144,
                             burst_loss=0.7, configured_bursts=BURSTS)
        b20, b45 = rep["results"]["dblp"]["burst_rows"]
        self.assertAlmostEqual(b45["p"], 0.008)
        self.assertTrue(b45["p_mixed"])
        self.assertEqual(b45["expected"]["passes"], 14)
        self.assertAlmostEqual(b20["p"], 0.408)
        self.assertFalse(b20["p_mixed"])
        lines = R.format_text(rep).splitlines()
        (row,) = [l for l in lines if l.split()[:2] == ["45", "dblp"]]
        self.assertEqual(row.split()[2:4], ["0.008*", "inside"])
        self.assertTrue(any(l.strip().startswith("* the rows disagree on p")
                            for l in lines))

    def test_worker_rows_stand_in_for_the_server(self):
        write_policy(
            self.dir, "dblp", clean_base=500.0,
            p_of=lambda i: 0.008 if i < 30 else 0.408,
            burst_lat={20: 9000.0, 45: 1300.0}, burst_passes=[3, 3, 3],
            burst_pkts=[1430] * 3, clean_pkts=428,
            us_per_packet=[1.0] * 3, rtts=[25.0] * 3,
            worker_critical=lambda i: i < 30)
        d = R.build_report(self.dir, ["dblp"], floats=262144,
                           burst_loss=0.7,
                           configured_bursts=BURSTS)["results"]["dblp"]
        self.assertEqual(d["clr"]["source"], "worker rows")
        self.assertTrue(d["clr"]["detector"])  # from the directory's name
        self.assertEqual(d["clr"]["windows"], [[0, 29]])
        self.assertEqual([e["clr"] for e in d["burst_rows"]],
                         ["inside", "outside"])
        self.assertIn("(from the worker rows: the server wrote none)",
                      R.format_clr_windows("dblp", d["clr"]))

    def test_resync_rounds_and_disagreeing_rows(self):
        def rows(it, critical, p=0.008, n=3):
            return [{"iteration": it, "rank": r, "p": p,
                     "critical": critical} for r in range(n)]
        server = rows(0, True) + rows(1, True) + rows(3, True) + \
            rows(4, False, 0.408) + rows(5, True)[:1] + \
            rows(5, False, 0.408)[1:]
        run = {"dir": "/x/fixed", "workers": [], "server_rows": server,
               "resync_iterations": [2, 6],
               "server_summary": {"policy": "dblp(p_low=0.008)"}}
        ph = R.clr_phase(run)
        self.assertTrue(ph["detector"])  # the summary, not the dir name
        self.assertEqual(ph["windows"], [[0, 3]])
        self.assertEqual(ph["resyncs_inside"], [2])
        self.assertEqual(R.burst_clr(ph, 5), "mixed")
        self.assertEqual(R.burst_clr(ph, 3), "inside")
        self.assertIsNone(R.burst_clr(ph, 7))  # no row
        self.assertEqual(R.format_clr_windows("dblp", ph),
                         "dblp CLR windows: 0-3 (3 iterations at p = 0.008; "
                         "resync round 2 between them); outside them "
                         "p = 0.408")
        self.assertEqual(R.policy_kind({"dir": "/r/ltp/"}), "ltp")

    def _pyplot(self):
        try:
            import matplotlib
        except ImportError:
            self.skipTest("no matplotlib in this python")
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt

    def test_latency_plot_shades_the_windows(self):
        plt = self._pyplot()
        write_phased(self.dir)
        clr = {pol: R.clr_phase(R.load_policy_run(
            os.path.join(self.dir, pol))) for pol in ("fixed", "dblp")}
        series = {pol: R.push_latency_series(R.load_policy_run(
            os.path.join(self.dir, pol))) for pol in ("fixed", "dblp")}
        fig, ax = plt.subplots()
        try:
            spans = R.draw_latency(ax, series, BURSTS, clr)
            self.assertEqual([(s["policy"], s["first"], s["last"], s["p"])
                              for s in spans],
                             [("dblp", 0, 9, "0.008"),
                              ("dblp", 40, 49, "0.008")])
            shaded = sorted(span_x(p) for p in ax.patches)
            self.assertEqual(shaded, [(-0.5, 9.5), (39.5, 49.5)])
            for s in spans:
                self.assertIn(s["patch"], ax.patches)
            _, labels = ax.get_legend_handles_labels()
            self.assertEqual(labels.count("dblp CLR (critical, p = 0.008)"),
                             1)
            self.assertIn("microburst", labels)
            marked = sorted(l.get_xdata()[0] for l in ax.lines
                            if l.get_color() == "red")
            self.assertEqual(marked, [20, 45])
        finally:
            plt.close(fig)
        # One policy alone: the legend names no policy.
        fig, ax = plt.subplots()
        try:
            R.draw_latency(ax, {"dblp": series["dblp"]}, (), clr)
            _, labels = ax.get_legend_handles_labels()
            self.assertIn("CLR (critical, p = 0.008)", labels)
        finally:
            plt.close(fig)

    def test_write_plots_shades_from_the_server_rows(self):
        self._pyplot()
        write_phased(self.dir)
        drawn = []
        real = R.draw_latency

        def recording(ax, series, bursts, clr):
            spans = real(ax, series, bursts, clr)
            drawn.append((sorted(bursts), len(ax.patches), spans))
            return spans
        R.draw_latency = recording
        try:
            files = R.write_plots(self.dir, ["fixed", "dblp"], BURSTS)
        finally:
            R.draw_latency = real
        self.assertEqual([os.path.basename(f) for f in files],
                         ["latency.png", "cdf.png"])
        ((bursts, patches, spans),) = drawn
        self.assertEqual(bursts, [20, 45])
        self.assertEqual(patches, 2)
        self.assertEqual([(s["first"], s["last"]) for s in spans],
                         [(0, 9), (40, 49)])


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


SYSTEM_PYTHON = "/usr/bin/python3"

if __name__ == "__main__":
    # Under a python3 without matplotlib (a pyenv shim, say), re-run with
    # Debian's, which has python3-matplotlib, so the plot tests run too.
    if (not R.have_matplotlib() and os.path.isfile(SYSTEM_PYTHON)
            and not os.environ.get("DBLP_TEST_REEXEC")
            and os.path.realpath(sys.executable)
            != os.path.realpath(SYSTEM_PYTHON)
            and subprocess.run([SYSTEM_PYTHON, "-c", "import matplotlib"],
                               capture_output=True).returncode == 0):
        os.execve(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)]
                  + sys.argv[1:], dict(os.environ, DBLP_TEST_REEXEC="1"))
    unittest.main(verbosity=2)
