"""The accuracy / training-time trade-off of DBLP's loss handling (issue #10):
`tools/dblp-experiments tradeoff`.

Every configuration is one server setting (tools/dblp-cluster policy plus
dblp-server flags), trained per model, per seed, with and without bursts.
Per model one table: final accuracy (mean and range over seeds), points vs
fixed, training time (evaluations excluded) and its ratio to fixed, and
mean / p99 / spike latency of the push and of the broadcast; and a plot of
accuracy against training time for every configuration.
"""

import os
import statistics
from typing import Any, Dict, List, Optional, Sequence

import dblp_experiments_lib as X
import dblp_report

# name -> (launcher policy, dblp-server flags, what it is). Every flag is
# explicit, so a change of the apps' defaults cannot change a measurement.
CONFIGS = {
    "reliable": ("reliable", [],
                 "every chunk of both rounds: the accuracy reference"),
    "fixed": ("fixed", ["--paper_mode", "--send_order=permuted"],
              "MLT-like fixed p = P_low; zero fill, lossy broadcast"),
    "dblp-paper": ("dblp", ["--paper_mode", "--send_order=permuted"],
                   "the paper: zero fill (mean / W), broadcast under the "
                   "same p, each worker its own subset"),
    "resync": ("dblp", ["--push_fill=rescale", "--bcast_tolerance=same",
                        "--resync_every=10", "--send_order=permuted"],
               "rescaled push, lossy broadcast, replicas re-synchronised "
               "(parameters averaged, reliably) every 10 steps, both rounds "
               "in the permuted order: the defaults before issue #31"),
    "magnitude": ("dblp", ["--push_fill=rescale", "--bcast_tolerance=same",
                           "--resync_every=10", "--send_order=magnitude"],
                  "the resync configuration with both rounds sending the "
                  "largest chunks first, so early stop drops the smallest "
                  "(the defaults since issue #31)"),
    "resync5": ("dblp", ["--push_fill=rescale", "--bcast_tolerance=same",
                         "--resync_every=5"],
                "the same, re-synchronised every 5 steps"),
    "consistent": ("dblp", ["--push_fill=rescale",
                            "--bcast_tolerance=consistent"],
                   "rescaled push; one 1-p subset of the mean for every "
                   "worker, sent reliably, the rest carried to the next "
                   "iteration"),
    "feedback": ("dblp", ["--push_fill=zero", "--push_feedback",
                          "--bcast_tolerance=consistent"],
                 "exact error feedback on the push (mean / W, the worker "
                 "carries what the server did not sum) and the consistent "
                 "broadcast"),
}
# The configuration dblp-server runs with no flags (its defaults); the
# table names it "dblp (new defaults)".
DEFAULT_CONFIG = "magnitude"
DEFAULT_CONFIGS = "reliable,fixed,dblp-paper,resync,magnitude"
CONDITIONS = (("bursts", "with bursts"), ("clean", "no bursts"))


def run_name(model: str, cond: str, seed: int, config: str,
             epochs: Optional[int] = None) -> str:
    tail = f"-e{epochs}" if epochs else ""
    return f"{model}-{cond}-s{seed}-{config}{tail}"


def _mean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def interval95(xs: Sequence[float]) -> float:
    """Half-width of the 95% Student-t interval of the mean."""
    n = len(xs)
    if n < 2:
        return float("nan")
    m = sum(xs) / n
    sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36,
         9: 2.31}.get(n, 2.26 if n == 10 else 2.0)
    return t * sd / n ** 0.5


def _p99(xs: Sequence[float]) -> Optional[float]:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = max(0, int(-(-0.99 * len(xs) // 1)) - 1)  # nearest rank
    return xs[k]


def round_latencies(policy_dir: str) -> Dict[str, Any]:
    """Per training iteration (resync rounds left out and counted): the push
    latency (max over workers of the worker's send latency) and the
    broadcast latency (max over workers of the server's broadcast round),
    in us; and the burst iterations."""
    run = dblp_report.load_policy_run(policy_dir)  # resync rows left out
    push: Dict[int, float] = {}
    bursts = set()
    for w in run["workers"]:
        for r in w["rows"]:
            it = int(r.get("iteration", -1))
            if r.get("burst"):
                bursts.add(it)
            v = r.get("send_latency_us")
            if v is not None:
                push[it] = max(push.get(it, 0.0), float(v))
    bcast: Dict[int, float] = {}
    for r in run["server_rows"]:
        it = int(r.get("iteration", -1))
        v = r.get("bcast_latency_us")
        if v is not None:
            bcast[it] = max(bcast.get(it, 0.0), float(v))
    return {"push": push, "bcast": bcast, "bursts": sorted(bursts),
            "resyncs": run["resync_rounds"]}


def latency_summary(per_seed: Sequence[Dict[str, Any]], key: str
                    ) -> Dict[str, Optional[float]]:
    """Mean and p99 over every training iteration of every seed; spike = the
    worst burst iteration (the worst iteration without bursts)."""
    values, spikes = [], []
    for lat in per_seed:
        series = lat[key]
        values += list(series.values())
        at = [series[i] for i in lat["bursts"] if i in series]
        spikes.append(max(at) if at else
                      (max(series.values()) if series else None))
    return {"mean": _mean(values), "p99": _p99(values),
            "spike": max([s for s in spikes if s is not None], default=None)}


def collect(runs: Dict[tuple, Any]) -> Dict[tuple, Dict[str, Any]]:
    """{(model, cond, config): accuracy, time and latency over seeds}."""
    grouped: Dict[tuple, List[Any]] = {}
    seeds: Dict[tuple, List[int]] = {}
    for (model, cond, seed, config), run in runs.items():
        grouped.setdefault((model, cond, config), []).append(run)
        seeds.setdefault((model, cond, config), []).append(seed)
    out = {}
    for key, group in grouped.items():
        accs, times, lats, curves, failed = [], [], [], [], False
        by_seed = {}
        for seed, run in zip(seeds[key], group):
            run.load()
            failed = failed or bool(run.failed)
            pdir = run.policy_dir(run.policies[0])
            tr = X.load_training(pdir)
            acc = X.final_accuracy(tr)["mean"]
            t, _ = X.training_time(tr, run.seconds(run.policies[0]))
            if acc is not None:
                accs.append(acc)
                by_seed[seed] = acc
            if t is not None:
                times.append(t)
            curves.append(X.accuracy_curve(tr))
            lats.append(round_latencies(pdir))
        out[key] = {
            "acc": _mean(accs), "accs": accs, "by_seed": by_seed, "acc_min": min(accs, default=None),
            "acc_max": max(accs, default=None), "seeds": len(accs),
            "time": _mean(times), "times": times,
            "push": latency_summary(lats, "push"),
            "bcast": latency_summary(lats, "bcast"),
            "resyncs": sum(l["resyncs"] for l in lats),
            "curves": curves, "failed": failed,
        }
    return out


def table_rows(results: Dict[tuple, Dict[str, Any]], model: str,
               configs: Sequence[str]) -> List[List[str]]:
    rows = []
    for cond, cond_label in CONDITIONS:
        fx = results.get((model, cond, "fixed")) or {}
        rel = results.get((model, cond, "reliable")) or {}
        for config in configs:
            v = results.get((model, cond, config))
            if not v:
                continue
            name = config + (" = dblp (new defaults)"
                             if config == DEFAULT_CONFIG else "")
            if v["failed"]:
                name += " (FAILED run: partial)"
            pts = (None if v["acc"] is None or fx.get("acc") is None
                   else v["acc"] - fx["acc"])
            ratio = dblp_report.ratio(v["time"], fx.get("time"))
            acc_cell = X.fmt(v["acc"], "{:.2f}")
            if v["seeds"] > 1:
                acc_cell += (f" ± {interval95(v['accs']):.2f} "
                             f"({v['acc_min']:.2f}-{v['acc_max']:.2f})")
            # Paired by seed: the same data order and initial weights.
            diffs = [a - rel["by_seed"][sd] for sd, a in v["by_seed"].items()
                     if sd in rel.get("by_seed", {})]
            fx_push = (fx.get("push") or {}).get("spike")
            rows.append([
                cond_label, name, acc_cell,
                "" if config == "fixed" else X.fmt(pts, "{:+.2f}"),
                "" if config == "reliable" else (
                    f"{_mean(diffs):+.2f}" + (f" ± {interval95(diffs):.2f}"
                                              if len(diffs) > 1 else "")
                    if diffs else "-"),
                X.fmt(v["time"]),
                X.fmt(ratio, "{:.3f}"),
                X.fmt(v["push"]["mean"], "{:.0f}"),
                X.fmt(v["push"]["p99"], "{:.0f}"),
                X.fmt(v["push"]["spike"], "{:.0f}"),
                X.fmt(dblp_report.ratio(fx_push, v["push"]["spike"]),
                      "{:.2f}x"),
                X.fmt(v["bcast"]["mean"], "{:.0f}"),
                X.fmt(v["bcast"]["p99"], "{:.0f}"),
                X.fmt(v["bcast"]["spike"], "{:.0f}"),
            ])
    return rows


TABLE_HEADERS = ["bursts", "configuration",
                 "final acc (%): mean ± 95% (range)",
                 "points vs fixed", "points vs reliable (paired) ± 95%", "train time (s)", "time / fixed",
                 "push mean (us)", "push p99", "push spike",
                 "fixed / this push spike", "bcast mean (us)", "bcast p99",
                 "bcast spike"]


def plot_tradeoff(results: Dict[tuple, Dict[str, Any]], model: str,
                  configs: Sequence[str], path: str) -> str:
    """Accuracy against training time, one point per configuration and
    condition (mean over seeds; bars: the range over seeds)."""
    plt = X._plt()
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    markers = {"bursts": "^", "clean": "o"}
    colors = {}
    for k, config in enumerate(configs):
        colors[config] = f"C{k}"
    for cond, cond_label in CONDITIONS:
        for config in configs:
            v = results.get((model, cond, config))
            if not v or v["acc"] is None or v["time"] is None:
                continue
            lo, hi = v["acc"] - v["acc_min"], v["acc_max"] - v["acc"]
            tlo = v["time"] - min(v["times"])
            thi = max(v["times"]) - v["time"]
            ax.errorbar([v["time"]], [v["acc"]], yerr=[[lo], [hi]],
                        xerr=[[tlo], [thi]], fmt=markers[cond],
                        color=colors[config], capsize=3,
                        label=f"{config}, {cond_label}")
    ax.set_xlabel("training time, evaluations excluded (s)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(f"{model.upper()}: accuracy against training time "
                 "(mean over seeds, bars: range)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
