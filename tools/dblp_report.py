"""Report logic of tools/dblp-cluster: reads the apps' result files and
compares tolerance policies side by side, next to the analytic model.

Pure python3 stdlib, no DPDK: tests/test_cluster_report.py drives it with
synthetic fixture files.

Inputs (one directory per policy, written by the apps' --out_dir):
  <policy_dir>/server/summary.json            counters of the server
  <policy_dir>/server/iterations.jsonl        (optional) one row per (it,
                                              worker); its `critical` and `p`
                                              give the CLR phase
  <policy_dir>/worker<i>/iterations.jsonl     one row per iteration
  <policy_dir>/worker<i>/summary.json         us_per_packet_clean, control_rtt_us

Definitions (the same as README / DESIGN.md section 5):
  * latency of an iteration = MAX over workers of the worker's push
    `send_latency_us` (the push is done when the slowest worker saw STOP);
  * burst iteration = listed in --burst_iters, flagged `burst` in a row, or
    listed in a summary.json `bursts` array; clean = every other iteration;
  * percentiles are nearest-rank (the q-th percentile of n samples is the
    ceil(q/100 n)-th smallest), like lib/dblp/obs/latency_stats.h, so p50 is an
    observed value and p99 of 60 samples is the maximum;
  * analytic model = lib/dblp/policy/analytic.h (see ExpectedPasses below);
  * CLR window = a maximal run of iterations the server ran critical (dblp
    at p_low); a burst is inside or outside one (clr_phase below).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# IPv4 (20) + UDP (8) + DBLP header (20) around every chunk.
FRAME_OVERHEAD_BYTES = 48
DEFAULT_MARGIN = 0.35


# --------------------------------------------------------------------------
# Chunking and the analytic model (mirrors lib/dblp/wire/chunking.cc,
# stop_decision.h and analytic.cc; keep them in step).
# --------------------------------------------------------------------------

def chunk_payload_bytes(mtu: int = 1500) -> int:
    """Chunk payload for an IP MTU: mtu - 48, rounded down to 4 bytes."""
    room = int(mtu) - FRAME_OVERHEAD_BYTES
    if room < 4:
        raise ValueError(f"MTU {mtu} leaves no room for a chunk")
    return room & ~3


def num_chunks(floats: int, mtu: int = 1500) -> int:
    """N = ceil(floats * 4 / chunk payload). 262144 floats @1500 -> 723."""
    payload = chunk_payload_bytes(mtu)
    return (int(floats) * 4 + payload - 1) // payload


def stop_threshold(n: int, p: float) -> int:
    """ceil((1 - p) n): n minus the floor(p n) chunks a round may lose."""
    if not (0.0 <= p < 1.0):
        raise ValueError(f"loss tolerance p={p} must be in [0, 1)")
    if n == 0:
        return 0
    allowed = math.floor(p * n * (1 + 1e-12))
    missing_ok = n - 1 if allowed >= n else int(allowed)
    return n - missing_ok


def _smallest_passes(n: float, loss: float, target: float, strict: bool) -> int:
    def done(k: float) -> bool:
        left = n * loss ** k
        return left < target if strict else left <= target

    if loss == 0 or done(1):
        return 1
    k = math.ceil(math.log(target / n) / math.log(loss))
    if not k <= 2 ** 32 - 2:
        raise ValueError(f"loss {loss} needs more than 2^32 passes")
    k = max(k, 1)
    while k > 1 and done(k - 1):
        k -= 1
    while not done(k):
        k += 1
    return int(k)


def expected_passes(n: int, loss: float, p: float) -> Dict[str, float]:
    """Expected passes and packets of one round (lib/dblp/policy/analytic.h).

    a = floor(p n) chunks may be lost. a >= 1: smallest k with L^k n <= a;
    a == 0: smallest k with L^k n < 0.5. packets = (n - a) / (1 - L).
    """
    for name, v in (("loss", loss), ("p", p)):
        if not (isinstance(v, (int, float)) and math.isfinite(v)
                and 0 <= v < 1):
            raise ValueError(f"{name} must be a finite number in [0, 1), "
                             f"got {v}")
    if n <= 0:
        return {"n": 0, "tolerated": 0, "passes": 0, "packets": 0.0,
                "packets_over_n": 0.0}
    need = stop_threshold(n, p)
    allowed = n - need
    if allowed >= 1:
        passes = _smallest_passes(float(n), loss, float(allowed), False)
    else:
        passes = _smallest_passes(float(n), loss, 0.5, True)
    packets = need / (1 - loss)
    return {"n": n, "tolerated": allowed, "passes": passes,
            "packets": packets, "packets_over_n": packets / n}


def expected_round_us(estimate: Dict[str, float], us_per_packet: float,
                      rtt_us: float) -> float:
    """Round time of the analytic model (ExpectedRoundTimeNs in
    lib/dblp/policy/analytic.h): packets * us_per_packet + (passes - 1) * rtt +
    rtt / 2. Every send costs a frame's time: the apps' loss injector drops
    frames at the receiver, after they crossed the link, as a lossy wire
    does.
    """
    if estimate["passes"] == 0:
        return 0.0
    return (estimate["packets"] * us_per_packet
            + (estimate["passes"] - 1) * rtt_us + rtt_us / 2)


# --------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------

def _finite(values: Iterable[Any]) -> List[float]:
    out = []
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) \
                and math.isfinite(v):
            out.append(float(v))
    return out


def percentile_nearest_rank(values: Iterable[Any], q: float) -> Optional[float]:
    """ceil(q/100 n)-th smallest (at least the first); None if empty."""
    s = sorted(_finite(values))
    if not s:
        return None
    q = min(max(q, 0.0), 100.0)
    rank = max(1, math.ceil(q / 100.0 * len(s) - 1e-9))
    return s[min(rank, len(s)) - 1]


def mean(values: Iterable[Any]) -> Optional[float]:
    s = _finite(values)
    return sum(s) / len(s) if s else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return float(a) / float(b)


# --------------------------------------------------------------------------
# Loading the apps' files.
# --------------------------------------------------------------------------

def load_jsonl(path: str) -> List[Dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON: {e}") from e
    return rows


def load_json(path: str) -> Optional[Dict[str, Any]]:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _worker_dirs(policy_dir: str) -> List[str]:
    if not os.path.isdir(policy_dir):
        return []
    found = []
    for name in os.listdir(policy_dir):
        m = re.fullmatch(r"worker(\d+)", name)
        if m and os.path.isdir(os.path.join(policy_dir, name)):
            found.append((int(m.group(1)), os.path.join(policy_dir, name)))
    return [d for _, d in sorted(found)]


def load_policy_run(policy_dir: str) -> Dict[str, Any]:
    """Everything the report needs from one policy's output directory."""
    # Re-synchronisation rounds (dblp-server --resync_every) move the
    # model, not a gradient, and are reliable: they are counted, and left
    # out of every latency and burst statistic.
    resyncs = set()

    def gradient_rows(path):
        rows = load_jsonl(path) if os.path.isfile(path) else []
        for r in rows:
            if r.get("resync") is True:
                resyncs.add(r.get("iteration"))
        return [r for r in rows if r.get("resync") is not True]

    workers = []
    for d in _worker_dirs(policy_dir):
        workers.append({
            "dir": d,
            "rows": gradient_rows(os.path.join(d, "iterations.jsonl")),
            "summary": load_json(os.path.join(d, "summary.json")),
        })
    server_dir = os.path.join(policy_dir, "server")
    return {
        "dir": policy_dir,
        "workers": workers,
        "server_summary": load_json(os.path.join(server_dir, "summary.json")),
        "server_rows": gradient_rows(os.path.join(server_dir,
                                                  "iterations.jsonl")),
        "resync_rounds": len(resyncs),
        "resync_iterations": sorted(i for i in resyncs
                                    if isinstance(i, int)),
    }


_CHUNKS_RE = re.compile(r"(\d+) chunks of (\d+) B")


def chunks_from_stdout(text: str) -> Optional[int]:
    """N from the apps' banner ('... 723 chunks of 1452 B ...')."""
    m = _CHUNKS_RE.search(text or "")
    return int(m.group(1)) if m else None


def chunks_from_summaries(run: Dict[str, Any],
                          keys=("chunks", "num_chunks", "chunks_per_round")
                          ) -> Optional[int]:
    """N from summary.json info/counters ('chunks' or 'num_chunks'), if the
    apps write it; with keys=("chunk_bytes",) the chunk payload they used
    (an authenticated job's frames carry a tag: less than the MTU gives)."""
    summaries = [run.get("server_summary")] + \
        [w.get("summary") for w in run.get("workers", [])]
    for s in summaries:
        if not s:
            continue
        for section in ("info", "counters"):
            sec = s.get(section) or {}
            for key in keys:
                if key in sec:
                    try:
                        return int(sec[key])
                    except (TypeError, ValueError):
                        pass
    return None


# --------------------------------------------------------------------------
# Analysis of one policy.
# --------------------------------------------------------------------------

def burst_iterations(run: Dict[str, Any],
                     configured: Sequence[int] = ()) -> List[int]:
    """Configured bursts, plus rows flagged `burst`, plus summary `bursts`."""
    its = {int(i) for i in configured}
    for w in run.get("workers", []):
        for r in w["rows"]:
            if r.get("burst") is True:
                its.add(int(r["iteration"]))
        for b in (w.get("summary") or {}).get("bursts", []) or []:
            if "iteration" in b:
                its.add(int(b["iteration"]))
    for b in (run.get("server_summary") or {}).get("bursts", []) or []:
        if "iteration" in b:
            its.add(int(b["iteration"]))
    return sorted(its)


def _per_iteration(run: Dict[str, Any]) -> Dict[int, List[Dict[str, Any]]]:
    by_it: Dict[int, List[Dict[str, Any]]] = {}
    for w in run.get("workers", []):
        for r in w["rows"]:
            by_it.setdefault(int(r["iteration"]), []).append(r)
    return by_it


# --------------------------------------------------------------------------
# The CLR phase (critical learning regime) of every iteration.
# --------------------------------------------------------------------------

def policy_kind(run: Dict[str, Any]) -> str:
    """'dblp', 'fixed', ... from the server's summary.json `policy`
    ('dblp(p_low=0.008,...)'), else the policy directory's name."""
    name = (run.get("server_summary") or {}).get("policy")
    if not isinstance(name, str) or not name:
        name = os.path.basename(os.path.normpath(run.get("dir") or ""))
    m = re.match(r"[A-Za-z_]+", name)
    return m.group(0).lower() if m else ""


def clr_windows(phase_by_it: Dict[int, Optional[bool]]) -> List[List[int]]:
    """[first, last] of every maximal run of critical iterations, in the
    order the iterations ran. Numbers missing from the map (resync rounds,
    which carry the model and no phase of their own) do not end a run: a
    window the detector kept across a resync is one window, as it was."""
    out: List[List[int]] = []
    open_ = False
    for it in sorted(phase_by_it):
        if phase_by_it[it] is True:
            if open_:
                out[-1][1] = it
            else:
                out.append([it, it])
                open_ = True
        else:
            open_ = False
    return out


def clr_phase(run: Dict[str, Any]) -> Dict[str, Any]:
    """Which iterations ran inside a CLR and the p in force, from the
    server's per-iteration rows (the server decides both; the workers'
    rows echo them and stand in when the server wrote none).

    by_iteration: it -> {"critical": True/False/None (rows disagree),
    "p": mean p}. detector: whether the policy has a CLR detector (dblp);
    without one `critical` is always false and means nothing, so callers
    show "-" rather than "outside"."""
    rows = [r for r in run.get("server_rows") or []
            if isinstance(r.get("critical"), bool)]
    source = "server rows"
    if not rows:
        rows = [r for w in run.get("workers", []) for r in w["rows"]
                if isinstance(r.get("critical"), bool)]
        source = "worker rows" if rows else None
    by_it: Dict[int, List[Dict[str, Any]]] = {}
    for r in rows:
        by_it.setdefault(int(r["iteration"]), []).append(r)
    phase: Dict[int, Dict[str, Any]] = {}
    for it, rs in by_it.items():
        flags = {r["critical"] for r in rs}
        phase[it] = {"critical": flags.pop() if len(flags) == 1 else None,
                     "p": mean(r.get("p") for r in rs)}
    windows = clr_windows({i: e["critical"] for i, e in phase.items()})

    def ps(critical: bool) -> List[float]:
        return sorted({round(e["p"], 6) for e in phase.values()
                       if e["critical"] is critical and e["p"] is not None})

    return {
        # A window 0-20 holding 20 iterations needs its resync round named.
        "resyncs_inside": [i for i in run.get("resync_iterations") or []
                           if any(a < i < b for a, b in windows)],
        "detector": (policy_kind(run) == "dblp"
                     or any(e["critical"] for e in phase.values())),
        "source": source,
        "by_iteration": phase,
        "windows": windows,
        "critical_iterations": sum(1 for e in phase.values()
                                   if e["critical"] is True),
        "p_inside": ps(True),
        "p_outside": ps(False),
    }


def burst_clr(phase: Dict[str, Any], iteration: int) -> Optional[str]:
    """'inside' / 'outside' a CLR window, 'mixed' when the rows disagree,
    None without a detector or without a row of that iteration."""
    e = phase["by_iteration"].get(iteration)
    if not phase["detector"] or e is None:
        return None
    return {True: "inside", False: "outside"}.get(e["critical"], "mixed")


def _us_per_packet_clean(run: Dict[str, Any],
                         bursts: set) -> Tuple[Optional[float], str]:
    vals = _finite((w.get("summary") or {}).get("us_per_packet_clean")
                   for w in run.get("workers", []))
    vals = [v for v in vals if v > 0]
    if vals:
        return sum(vals) / len(vals), "summary.json us_per_packet_clean"
    # Same definition as lib/dblp/obs/run_report.cc: clean one-pass rows, each
    # packets * t + rtt / 2 (the model's STOP travelling back).
    rtt, _ = _control_rtt(run)
    half = (rtt or 0.0) / 2
    us = pkts = 0.0
    for w in run.get("workers", []):
        for r in w["rows"]:
            if int(r["iteration"]) in bursts or r.get("passes") != 1:
                continue
            lat, n = r.get("send_latency_us"), r.get("packets_sent")
            if _finite([lat]) and _finite([n]):
                us += max(0.0, lat - half)
                pkts += n
    if pkts > 0:
        return us / pkts, "(clean send latency - rtt/2) / packets_sent"
    return None, "unavailable"


def _control_rtt(run: Dict[str, Any]) -> Tuple[Optional[float], str]:
    vals = [v for v in _finite((w.get("summary") or {}).get("control_rtt_us")
                               for w in run.get("workers", [])) if v > 0]
    if vals:
        return sum(vals) / len(vals), "summary.json control_rtt_us"
    rows = [v for w in run.get("workers", [])
            for v in _finite(r.get("control_rtt_us") for r in w["rows"])
            if v > 0]
    if rows:
        return sum(rows) / len(rows), "iterations.jsonl control_rtt_us"
    return None, "unavailable (no PROBE was answered)"


# Server counters summarised in the report: label -> counter keys summed.
SERVER_COUNTER_GROUPS = [
    ("accepted", ["push_accepted"]),
    ("duplicate", ["push_duplicate"]),
    ("stale", ["push_stale_round"]),
    ("future", ["push_future_round"]),
    ("late", ["push_late"]),
    ("malformed", ["push_malformed", "push_wrong_session", "push_wrong_sender",
                   "push_wrong_type", "push_out_of_range", "decode_*",
                   "frame_*"]),
    ("forged", ["push_bad_tag", "frames_unpinned_source",
                "control_auth_failures", "control_out_of_state"]),
    ("injected_drops", ["injected_drops"]),
    ("device_drops", ["device_imissed", "device_rx_nombuf",
                      "device_oerrors"]),
    ("tx_ring_full", ["tx_ring_full"]),
    ("protocol_errors", ["control_protocol_errors"]),
]
WORKER_COUNTER_GROUPS = [
    ("injected_drops", ["injected_drops"]),
    ("device_drops", ["device_imissed", "device_rx_nombuf",
                      "device_oerrors"]),
    ("bcast_stale", ["bcast_stale_round", "bcast_stale"]),
    ("bcast_forged", ["bcast_bad_tag", "frames_unpinned_source"]),
    ("bcast_malformed", ["bcast_malformed", "frame_*"]),
]


def sum_counters(counters: Dict[str, Any], keys: Sequence[str]) -> int:
    total = 0
    for key in keys:
        if key.endswith("*"):
            total += sum(int(v) for k, v in counters.items()
                         if k.startswith(key[:-1]) and _finite([v]))
        elif key in counters and _finite([counters[key]]):
            total += int(counters[key])
    return total


def summarize_counters(run: Dict[str, Any]) -> Dict[str, Any]:
    server = (run.get("server_summary") or {}).get("counters") or {}
    out: Dict[str, Any] = {"server_present": bool(run.get("server_summary"))}
    out["server"] = {label: sum_counters(server, keys)
                     for label, keys in SERVER_COUNTER_GROUPS}
    workers: Dict[str, int] = {label: 0 for label, _ in WORKER_COUNTER_GROUPS}
    for w in run.get("workers", []):
        c = (w.get("summary") or {}).get("counters") or {}
        for label, keys in WORKER_COUNTER_GROUPS:
            workers[label] += sum_counters(c, keys)
    out["workers"] = workers
    return out


def analyze_policy(run: Dict[str, Any], *, n: int, burst_loss: float,
                   configured_bursts: Sequence[int] = (),
                   margin: float = DEFAULT_MARGIN,
                   warmup: int = 0) -> Dict[str, Any]:
    """Per-policy numbers of the report (see module docstring)."""
    bursts = burst_iterations(run, configured_bursts)
    burst_set = set(bursts)
    by_it = _per_iteration(run)
    nworkers = len(run.get("workers", []))
    its = sorted(i for i in by_it if i >= warmup)
    latency = {}
    incomplete = []
    for i in its:
        lat = _finite(r.get("send_latency_us") for r in by_it[i])
        if lat:
            latency[i] = max(lat)
        if len(by_it[i]) < nworkers:
            incomplete.append(i)
    clean = [latency[i] for i in its if i not in burst_set and i in latency]
    all_lat = [latency[i] for i in its if i in latency]
    us_pkt, us_pkt_src = _us_per_packet_clean(run, burst_set)
    rtt, rtt_src = _control_rtt(run)
    phase = clr_phase(run)

    burst_rows = []
    for b in bursts:
        rows = by_it.get(b, [])
        p_vals = _finite(r.get("p") for r in rows)
        # The p the server's rows carry is the one its receiver's STOP
        # decision used for the push; the workers' mean stands in without
        # server rows. They should agree: a difference is flagged (*).
        in_force = (phase["by_iteration"].get(b) or {}).get("p")
        p = in_force if in_force is not None else mean(p_vals)
        passes = mean(r.get("passes") for r in rows)
        pkts = mean(r.get("packets_sent") for r in rows)
        per_worker = sorted(_finite(r.get("send_latency_us") for r in rows))
        entry: Dict[str, Any] = {
            "iteration": b,
            "workers": len(rows),
            "latency_us": latency.get(b),
            # The model describes one sender: compare it with the median
            # worker, so one worker's scheduling stall on a shared host does
            # not decide the verdict (the max stays the headline latency).
            "median_worker_us": (per_worker[(len(per_worker) - 1) // 2]
                                 if per_worker else None),
            "p": p,
            "p_in_force": in_force,
            "p_mixed": len(set(p_vals)) > 1 or (
                in_force is not None
                and any(abs(in_force - v) > 1e-9 for v in p_vals)),
            "clr": burst_clr(phase, b),
            "passes": passes,
            "passes_max": max(_finite(r.get("passes") for r in rows),
                              default=None),
            "packets_over_n": (pkts / n) if (pkts is not None and n) else None,
            "expected": None,
        }
        if p is not None and n and 0 <= p < 1 and 0 <= burst_loss < 1:
            est = expected_passes(n, burst_loss, p)
            exp = dict(est)
            if us_pkt is not None:
                exp["us"] = expected_round_us(est, us_pkt, rtt or 0.0)
                exp["measured_over_expected"] = ratio(
                    entry["median_worker_us"], exp["us"])
                r_ = exp["measured_over_expected"]
                exp["within_margin"] = (r_ is not None
                                        and abs(r_ - 1.0) <= margin)
            else:
                exp["us"] = None
                exp["measured_over_expected"] = None
                exp["within_margin"] = None
            entry["expected"] = exp
        burst_rows.append(entry)

    return {
        "workers": nworkers,
        "iterations": len(its),
        "warmup_skipped": warmup,
        "incomplete_iterations": incomplete,
        "n": n,
        "bursts": bursts,
        "clean_p50_us": percentile_nearest_rank(clean, 50),
        "clean_count": len(clean),
        "p99_us": percentile_nearest_rank(all_lat, 99),
        "mean_us": mean(all_lat),
        "max_us": max(all_lat) if all_lat else None,
        "us_per_packet_clean": us_pkt,
        "us_per_packet_source": us_pkt_src,
        "control_rtt_us": rtt,
        "control_rtt_source": rtt_src,
        "p_clean": sorted({round(float(r["p"]), 6)
                           for i in its if i not in burst_set
                           for r in by_it[i] if _finite([r.get("p")])}),
        "burst_rows": burst_rows,
        # The phase, without the per-iteration map (report.json stays small
        # on long runs; the rows have it).
        "clr": {k: v for k, v in phase.items() if k != "by_iteration"},
        "counters": summarize_counters(run),
        "latency_by_iteration": {str(i): latency[i] for i in sorted(latency)},
    }


def compare(results: Dict[str, Dict[str, Any]],
            order: Sequence[str]) -> List[Dict[str, Any]]:
    """Ratios first-policy / each other policy (fixed/dblp by default)."""
    present = [p for p in order if p in results and results[p]]
    out = []
    if len(present) < 2:
        return out
    base = present[0]
    b = results[base]
    for other in present[1:]:
        o = results[other]
        o_burst = {e["iteration"]: e for e in o["burst_rows"]}
        bursts = []
        for e in b["burst_rows"]:
            oe = o_burst.get(e["iteration"])
            bursts.append({"iteration": e["iteration"],
                           "ratio": ratio(e["latency_us"],
                                          oe["latency_us"] if oe else None)})
        out.append({
            "numerator": base, "denominator": other,
            "clean_p50": ratio(b["clean_p50_us"], o["clean_p50_us"]),
            "bursts": bursts,
            "p99": ratio(b["p99_us"], o["p99_us"]),
            "mean": ratio(b["mean_us"], o["mean_us"]),
        })
    return out


def build_report(out_dir: str, policies: Sequence[str], *, floats: int,
                 burst_loss: float, configured_bursts: Sequence[int] = (),
                 mtu: int = 1500, margin: float = DEFAULT_MARGIN,
                 warmup: int = 0,
                 params: Optional[Dict[str, Any]] = None,
                 chunks_hint: Optional[int] = None,
                 status: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Loads <out_dir>/<policy>/... for every policy and analyses it."""
    computed_n = num_chunks(floats, mtu)
    chunk_bytes = chunk_payload_bytes(mtu)
    results: Dict[str, Any] = {}
    n_used: Dict[str, Any] = {}
    for pol in policies:
        pdir = os.path.join(out_dir, pol)
        run = load_policy_run(pdir)
        chunk_bytes = chunks_from_summaries(run, ("chunk_bytes",)) or \
            chunk_bytes
        if not any(w["rows"] for w in run["workers"]):
            results[pol] = None
            continue
        n = chunks_from_summaries(run) or chunks_hint or computed_n
        source = ("summary.json" if chunks_from_summaries(run) else
                  "app banner" if chunks_hint else
                  f"ceil(floats*4/{chunk_payload_bytes(mtu)})")
        n_used[pol] = {"n": n, "source": source}
        results[pol] = analyze_policy(run, n=n, burst_loss=burst_loss,
                                      configured_bursts=configured_bursts,
                                      margin=margin, warmup=warmup)
    return {
        "params": dict(params or {}),
        "floats": floats,
        "mtu": mtu,
        "chunk_bytes": chunk_bytes,
        "n_computed": computed_n,
        "n_used": n_used,
        "burst_loss": burst_loss,
        "margin": margin,
        "policies": list(policies),
        "results": results,
        "ratios": compare(results, policies),
        "status": dict(status or {}),
    }


# --------------------------------------------------------------------------
# Formatting.
# --------------------------------------------------------------------------

def _f(v: Optional[float], fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if v is None else fmt.format(v)


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _table(rows: List[List[str]], right: Sequence[bool]) -> List[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [(r[c].rjust(widths[c]) if right[c] else r[c].ljust(widths[c]))
                 for c in range(len(r))]
        out.append("  ".join(cells).rstrip())
    return out


def _ps(values: Sequence[float]) -> str:
    return "/".join(f"{p:g}" for p in values) or "-"


def _clr_cell(result: Dict[str, Any], entry: Dict[str, Any]) -> str:
    if not (result.get("clr") or {}).get("detector"):
        return "-"
    return entry.get("clr") or "?"  # "?": no row of the server's for it


def format_ranges(windows: Sequence[Sequence[int]]) -> str:
    """[[0, 20], [31, 31]] -> '0-20, 31'."""
    return ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in windows)


def format_clr_windows(policy: str, clr: Dict[str, Any]) -> str:
    """One line: the iterations a policy ran inside a CLR, and its p."""
    head = f"{policy} CLR windows: "
    if not clr.get("source"):
        return head + "unknown (no row carries `critical`)"
    src = "" if clr["source"] == "server rows" else \
        f" (from the {clr['source']}: the server wrote none)"
    if not clr["detector"]:
        return (head + f"- (no CLR detector; p = {_ps(clr['p_outside'])} "
                f"in every iteration){src}")
    if not clr["windows"]:
        return head + f"none (p = {_ps(clr['p_outside'])} throughout){src}"
    rs = clr.get("resyncs_inside") or []
    resync = (f"; resync round{'s' if len(rs) > 1 else ''} "
              f"{', '.join(map(str, rs))} between them" if rs else "")
    return (head + f"{format_ranges(clr['windows'])} "
            f"({clr['critical_iterations']} iterations at p = "
            f"{_ps(clr['p_inside'])}{resync}); outside them p = "
            f"{_ps(clr['p_outside'])}{src}")


def format_text(report: Dict[str, Any]) -> str:
    """The human report (stdout and, fenced, report.md)."""
    res = report["results"]
    lines = []
    prm = report.get("params") or {}
    ns = sorted({v["n"] for v in report["n_used"].values()}) or \
        [report["n_computed"]]
    head = (f"DBLP local cluster: {prm.get('workers', '?')} workers, "
            f"{prm.get('iterations', '?')} iterations, {report['floats']} "
            f"floats = N {'/'.join(map(str, ns))} chunks of "
            f"{report['chunk_bytes']} B, burst loss L={report['burst_loss']}")
    if prm.get("seed") is not None:
        head += f", seed {prm['seed']}"
    lines.append(head)
    lines.append("latency = push send latency per iteration, max over "
                 "workers (us); percentiles nearest-rank; clean = not a "
                 "burst iteration")
    warm = max((r["warmup_skipped"] for r in res.values() if r), default=0)
    if warm:
        lines.append(f"first {warm} iteration(s) skipped as warm-up")
    lines.append("")

    rows = [["policy", "p (clean)", "clean p50", "p99", "mean", "max",
             "us/pkt", "rtt us", "iters"]]
    for pol in report["policies"]:
        r = res.get(pol)
        if not r:
            rows.append([pol, "no data", "-", "-", "-", "-", "-", "-", "-"])
            continue
        pc = r["p_clean"]
        ptxt = ("/".join(f"{p:g}" for p in pc[:3]) + ("/..." if len(pc) > 3
                                                      else "")) if pc else "-"
        rows.append([pol, ptxt, _f(r["clean_p50_us"]), _f(r["p99_us"]),
                     _f(r["mean_us"]), _f(r["max_us"]),
                     _f(r["us_per_packet_clean"], "{:.3f}"),
                     _f(r["control_rtt_us"]), str(r["iterations"])])
    lines += _table(rows, [False, False] + [True] * 7)
    lines.append("")

    margin = report["margin"]
    all_bursts = sorted({b["iteration"] for r in res.values() if r
                         for b in r["burst_rows"]})
    if all_bursts:
        lines.append(f"burst iterations: measured vs analytic expectation "
                     f"(L={report['burst_loss']}, measured us/pkt and rtt; "
                     f"flag outside ±{margin * 100:.0f}%)")
        rows = [["burst", "policy", "p", "CLR", "passes", "pkts/N", "push us",
                 "median us", "|", "exp passes", "exp pkts/N", "exp us",
                 "median/exp", ""]]
        for b in all_bursts:
            for pol in report["policies"]:
                r = res.get(pol)
                if not r:
                    continue
                e = next((x for x in r["burst_rows"] if x["iteration"] == b),
                         None)
                if e is None:
                    continue
                exp = e["expected"] or {}
                flag = ""
                if exp.get("within_margin") is False:
                    flag = "OUTSIDE MARGIN"
                elif exp and exp.get("us") is None:
                    flag = "(no us/pkt: time not modelled)"
                ptxt = _f(e["p"], "{:.3f}") + ("*" if e["p_mixed"] else "")
                passes = _f(e["passes"], "{:.1f}")
                if e["passes_max"] is not None:
                    passes += f"/{e['passes_max']:g}"
                rows.append([str(b), pol, ptxt, _clr_cell(r, e), passes,
                             _f(e["packets_over_n"], "{:.2f}"),
                             _f(e["latency_us"]),
                             _f(e.get("median_worker_us")), "|",
                             _f(exp.get("passes"), "{:g}"),
                             _f(exp.get("packets_over_n"), "{:.2f}"),
                             _f(exp.get("us")),
                             _f(exp.get("measured_over_expected"), "{:.2f}"),
                             flag])
        lines += _table(rows, [False, False, True, False, True, True, True,
                               True, False, True, True, True, True, False])
        lines.append("  passes = mean/max over workers; pkts/N = mean over "
                     "workers (sends, lost ones included); push us = slowest "
                     "worker, median us = median worker")
        lines.append("  exp us = pkts*us/pkt + (passes-1)*rtt + rtt/2 "
                     "(every send costs a frame: loss is injected at the "
                     "receiver)")
        lines.append("  CLR = the server's phase in that iteration: inside "
                     "a CLR window (critical, p = p_low) or outside "
                     "(p = p_high); - = no CLR detector")
        if any(e["p_mixed"] for r in res.values() if r
               for e in r["burst_rows"]):
            lines.append("  * the rows disagree on p in this iteration "
                         "(the server's shown, else the workers' mean)")
        lines.append("")
    else:
        lines.append("no burst iterations in this run")
        lines.append("")
    clr_lines = [format_clr_windows(pol, res[pol]["clr"])
                 for pol in report["policies"]
                 if res.get(pol) and res[pol].get("clr")]
    if clr_lines:
        lines += clr_lines + [""]

    for c in report["ratios"]:
        parts = [f"clean p50 {_x(c['clean_p50'])}"]
        parts += [f"burst@{b['iteration']} {_x(b['ratio'])}"
                  for b in c["bursts"]]
        parts += [f"p99 {_x(c['p99'])}", f"mean {_x(c['mean'])}"]
        lines.append(f"ratio {c['numerator']}/{c['denominator']}: "
                     + ", ".join(parts))
    if report["ratios"]:
        lines.append("")

    lines.append("counters: server (push receive) | workers (sum)")
    rows = [["policy", "stale", "malformed", "late", "dup", "inj drops",
             "dev drops", "tx ring full", "proto err", "|", "inj drops",
             "dev drops"]]
    for pol in report["policies"]:
        r = res.get(pol)
        if not r:
            continue
        s, w = r["counters"]["server"], r["counters"]["workers"]
        cells = ([str(s[k]) for k in ("stale", "malformed", "late",
                                      "duplicate", "injected_drops",
                                      "device_drops", "tx_ring_full",
                                      "protocol_errors")]
                 if r["counters"]["server_present"] else
                 ["no summary.json"] + [""] * 7)
        rows.append([pol] + cells + ["|", str(w["injected_drops"]),
                                     str(w["device_drops"])])
    lines += _table(rows, [False] + [True] * 8 + [False, True, True])
    lines.append("  server: stale = push frames of an old round; malformed = "
                 "bad frame/header/session/sender/seq; inj drops = pushes the "
                 "loss injector dropped on arrival; tx ring full = broadcast "
                 "bursts cut short (re-sent later); workers: inj drops = "
                 "broadcast frames dropped on arrival")

    st = report.get("status") or {}
    failed = {k: v for k, v in st.items() if v.get("failed")}
    if failed:
        lines.append("")
        lines.append("FAILED: " + ", ".join(sorted(failed)))
    return "\n".join(lines) + "\n"


def format_markdown(report: Dict[str, Any]) -> str:
    prm = report.get("params") or {}
    out = ["# DBLP local cluster report", ""]
    if prm.get("command"):
        out += ["Command:", "", "```", prm["command"], "```", ""]
    out += ["```", format_text(report).rstrip("\n"), "```", ""]
    out += ["Files: `<policy>/server/`, `<policy>/worker<i>/` "
            "(iterations.jsonl/.csv, summary.json), `<policy>/logs/` "
            "(stdout/stderr of every process), `report.json`.", ""]
    return "\n".join(out)


def write_report(out_dir: str, report: Dict[str, Any]) -> str:
    """Writes report.json and report.md; returns the text form."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "report.json"), "w",
              encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=False)
        f.write("\n")
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(format_markdown(report))
    return format_text(report)


# --------------------------------------------------------------------------
# Plots next to report.md (matplotlib, Agg, imported only here).
# --------------------------------------------------------------------------
def push_latency_series(run: Dict[str, Any]) -> List[Tuple[int, float]]:
    """(iteration, median push send latency over the workers in us)."""
    out = []
    for it, rows in sorted(_per_iteration(run).items()):
        vals = sorted(_finite(r.get("send_latency_us") for r in rows))
        if vals:
            out.append((it, vals[len(vals) // 2]))
    return out


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# Light enough that the latency lines stay readable on top, as the shaded
# critical regimes of the DBLP paper's Figure 2.
CLR_COLOURS = ("#b7e4c7", "#ffe8a3", "#cfe2ff", "#f8d7da")


def draw_latency(ax, series: Dict[str, List[Tuple[int, float]]],
                 bursts: Iterable[int],
                 clr: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The latency plot on `ax`: one line per policy, the CLR windows of
    every policy with a detector shaded (axvspan over first - 0.5 ..
    last + 0.5, so a one-iteration window still shows) and the burst
    iterations marked. `clr` maps policy -> clr_phase() (or analyze_policy's
    "clr"). Returns the spans drawn: {"policy", "first", "last", "p",
    "patch"}."""
    spans: List[Dict[str, Any]] = []
    shaded = [pol for pol in series
              if (clr.get(pol) or {}).get("windows")]
    for k, pol in enumerate(shaded):
        c = clr[pol]
        p = _ps(c.get("p_inside") or [])
        label = f"CLR (critical, p = {p})"
        if len(series) > 1:  # the other policies ran no such phase
            label = f"{pol} {label}"
        for j, (a, b) in enumerate(c["windows"]):
            patch = ax.axvspan(a - 0.5, b + 0.5, zorder=0, lw=0,
                               color=CLR_COLOURS[k % len(CLR_COLOURS)],
                               label=label if j == 0 else None)
            spans.append({"policy": pol, "first": a, "last": b, "p": p,
                          "patch": patch})
    for pol, s in series.items():
        ax.plot([i for i, _ in s], [v / 1e3 for _, v in s], label=pol, lw=1,
                zorder=2)
    for i, b in enumerate(sorted(bursts)):
        ax.axvline(b, color="red", alpha=0.25, lw=4, zorder=1,
                   label="microburst" if i == 0 else None)
    ax.set_xlabel("iteration")
    ax.set_ylabel("push latency, median over workers (ms)")
    ax.set_yscale("log")
    return spans


def write_plots(out_dir: str, policies: Sequence[str],
                configured_bursts: Sequence[int] = ()) -> List[str]:
    """latency.png (push latency per iteration, CLR windows shaded, bursts
    marked) and cdf.png (its distribution), every policy on one axis.
    Returns the files written; [] without matplotlib (the report does not
    need them)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    series = {}
    clr = {}
    bursts = set(int(i) for i in configured_bursts)
    for pol in policies:
        run = load_policy_run(os.path.join(out_dir, pol))
        s = push_latency_series(run)
        if s:
            series[pol] = s
            clr[pol] = clr_phase(run)
            bursts.update(burst_iterations(run, configured_bursts))
    if not series:
        return []
    last = max(s[-1][0] for s in series.values())
    bursts = {b for b in bursts if b <= last}  # configured, but never ran
    written = []
    fig, ax = plt.subplots(figsize=(9, 4.5))
    draw_latency(ax, series, bursts, clr)
    written.append(_save(plt, fig, ax, os.path.join(out_dir, "latency.png")))
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for pol, s in series.items():
        vals = sorted(v / 1e3 for _, v in s)
        ax.step(vals, [(k + 1) / len(vals) for k in range(len(vals))],
                where="post", label=pol)
    ax.set_xscale("log")
    ax.set_xlabel("push latency (ms)")
    ax.set_ylabel("fraction of iterations")
    written.append(_save(plt, fig, ax, os.path.join(out_dir, "cdf.png")))
    return written


def _save(plt, fig, ax, path):
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------
# Progress of a running job (from the server's streamed rows).
# --------------------------------------------------------------------------
class JobProgress:
    """Progress of a running job from the server's iterations.jsonl as it
    grows (one row per worker and iteration). Each read parses only what
    was appended since the last one, so following a long job stays cheap;
    a partly written last line waits for the next read."""

    def __init__(self, server_dir: str, workers: int):
        self.path = os.path.join(server_dir, "iterations.jsonl")
        self.workers = max(1, workers)
        self.offset = 0
        self.rows = 0
        self.last: Optional[Dict[str, Any]] = None

    def read(self) -> Optional[Dict[str, Any]]:
        """{"done": iterations finished, "p", "critical"}, or None before
        the first row."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        end = data.rfind(b"\n") + 1  # complete lines only
        for line in data[:end].split(b"\n"):
            if not line.strip():
                continue
            try:
                self.last = json.loads(line)
                self.rows += 1
            except ValueError:
                continue
        self.offset += end
        if self.last is None:
            return None
        return {"done": self.rows // self.workers, "p": self.last.get("p"),
                "critical": self.last.get("critical")}


def format_progress(policy: str, done: int, total: int, elapsed_s: float,
                    p: Optional[float], critical: Optional[bool]) -> str:
    """One line: policy, iteration/total, percentage, ETA, p, CLR state."""
    pct = 100.0 * done / total if total else 0.0
    if done > 0 and total > done:
        eta = "ETA %ds" % round(elapsed_s / done * (total - done))
    elif done >= total:
        eta = "done"
    else:
        eta = "ETA -"
    ps = "-" if p is None else "%.3g" % p
    clr = "-" if critical is None else ("critical" if critical else "normal")
    return "%s: iteration %d/%d (%3.0f%%) %s  p=%s  CLR %s" % (
        policy, done, total, pct, eta, ps, clr)
