"""Analysis and plots of tools/dblp-experiments (the DBLP paper's Fig. 1,
Tables II-VI, Figs. 2-6 on the local cluster).

Pure functions over the files tools/dblp-cluster and the apps write, so they
can be tested with fixture data (tests/test_experiments.py):

- iteration plans: iterations per epoch, an --max_iterations cap, the early
  and middle+final phases of the Fig. 1 runs;
- per-iteration push latency (max over workers), the dblp CLR spans from the
  server's `critical` flags, empirical CDFs, burst/p99/mean tables;
- training results from the workers' per-epoch CSVs: accuracy curves, final
  accuracy, training time (slowest worker) and times normalised to dblp;
- markdown tables; matplotlib plots (Agg backend, imported lazily so the
  analysis works without matplotlib).

Python 3 stdlib (+ matplotlib for the plot_* functions).
"""

import csv
import glob
import math
import os
import re
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dblp_report  # noqa: E402

# Fashion-MNIST training images, the dataset every model here trains on.
TRAIN_IMAGES = 60000

# Parameter counts of the training worker's models (training/models.h):
# the gradient size each model pushes, also used as --floats so synthetic
# runs move the same number of chunks as the real model would.
MODEL_FLOATS = {"mlp": 235146, "cnn": 80602, "resnet": 151738}


# --------------------------------------------------------------------------
# Iteration plans.
# --------------------------------------------------------------------------

def iterations_per_epoch(workers: int, batch: int,
                         train_images: int = TRAIN_IMAGES) -> int:
    """floor(floor(train_images / workers) / batch): an epoch is one pass
    over the worker's shard in full minibatches, the tail dropped
    (docs/TRAINING.md); the smallest shard sets the count. At least 1."""
    if workers < 1 or batch < 1 or train_images < 1:
        raise ValueError("workers, batch and train_images must be >= 1")
    return max(1, (train_images // workers) // batch)


def total_iterations(epochs: int, ipe: int,
                     max_iterations: Optional[int] = None) -> Tuple[int, bool]:
    """(iterations to run, capped?): epochs x ipe, at most max_iterations."""
    if epochs < 1 or ipe < 1:
        raise ValueError("epochs and iterations per epoch must be >= 1")
    nominal = epochs * ipe
    if max_iterations is not None and 0 < max_iterations < nominal:
        return max_iterations, True
    return nominal, False


def phase_ranges(total: int, ipe: int, epochs: int,
                 early_epochs: int = 1) -> Dict[str, Tuple[int, int]]:
    """Inclusive iteration ranges of the Fig. 1 phases.

    early = epochs [0, early_epochs), late (middle + final) = the rest, up to
    the last iteration total - 1. When the run is capped below epochs x ipe
    (smoke runs), the split keeps the same proportion: the early phase is
    the first round(total x early_epochs / epochs) iterations.
    """
    if not 0 < early_epochs < epochs:
        raise ValueError(f"need 0 < early_epochs ({early_epochs}) < epochs "
                         f"({epochs}): with one epoch there is no middle/final "
                         "phase")
    if total < 2:
        raise ValueError("need at least 2 iterations for two phases")
    if total >= epochs * ipe:
        boundary = early_epochs * ipe
    else:
        boundary = int(round(total * early_epochs / epochs))
    boundary = min(max(boundary, 1), total - 1)
    return {"early": (0, boundary - 1), "late": (boundary, total - 1)}


def early_late_runs(total: int, ipe: int, epochs: int,
                    fractions: Sequence[float] = (0.4, 0.8)
                    ) -> List[Dict[str, Any]]:
    """The five Fig. 1 runs: no loss; each fraction zeroed in the middle +
    final phases; each fraction zeroed in the early phase only. Each run:
    name (a directory name), label (legend), zero_fraction, zero_iters
    (inclusive FIRST, LAST or None)."""
    ph = phase_ranges(total, ipe, epochs)
    runs = [{"name": "none", "label": "no loss", "zero_fraction": 0.0,
             "zero_iters": None, "phase": "-"}]
    for where, label in (("late", "middle+final"), ("early", "early only")):
        for f in fractions:
            pct = int(round(f * 100))
            runs.append({"name": f"{where}-{pct}",
                         "label": f"{pct}% zeroed, {label}",
                         "zero_fraction": float(f),
                         "zero_iters": ph[where], "phase": where})
    return runs


def default_burst_range(iterations: int) -> Tuple[int, int]:
    """tools/dblp-cluster's default --burst_range for --burst_random."""
    return min(10, max(0, iterations // 4)), iterations - 1


# --------------------------------------------------------------------------
# Per-iteration latency, CLR spans, CDFs.
# --------------------------------------------------------------------------

def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def max_latency_by_iteration(worker_rows: Iterable[Iterable[Dict[str, Any]]],
                             key: str = "send_latency_us") -> Dict[int, float]:
    """{iteration: max over workers of key}; rows without a finite value are
    skipped (an iteration no worker reported is absent)."""
    out: Dict[int, float] = {}
    for rows in worker_rows:
        for r in rows:
            v = _num(r.get(key))
            if v is None or "iteration" not in r:
                continue
            i = int(r["iteration"])
            out[i] = v if i not in out else max(out[i], v)
    return out


def critical_by_iteration(rows: Iterable[Dict[str, Any]],
                          p_high: Optional[float] = None) -> Dict[int, bool]:
    """{iteration: was it inside a CLR}. From the server's rows (one per
    worker and iteration; the server decides p, so its `critical` flag is the
    truth): critical if any row of the iteration says so. Rows without a
    `critical` field fall back to p < p_high when p_high is given."""
    out: Dict[int, bool] = {}
    for r in rows:
        if "iteration" not in r:
            continue
        i = int(r["iteration"])
        c = r.get("critical")
        if isinstance(c, bool):
            crit = c
        elif isinstance(c, (int, float)):
            crit = bool(c)
        elif p_high is not None and _num(r.get("p")) is not None:
            crit = r["p"] < p_high - 1e-12
        else:
            continue
        out[i] = out.get(i, False) or crit
    return out


def clr_spans(critical: Dict[int, bool]) -> List[Tuple[int, int]]:
    """Maximal runs of consecutive critical iterations, as inclusive
    (first, last) pairs in order. A missing iteration ends a run."""
    spans: List[Tuple[int, int]] = []
    start = prev = None
    for i in sorted(critical):
        if critical[i]:
            if start is not None and i == prev + 1:
                prev = i
                continue
            if start is not None:
                spans.append((start, prev))
            start = prev = i
        else:
            if start is not None:
                spans.append((start, prev))
            start = prev = None
    if start is not None:
        spans.append((start, prev))
    return spans


def ecdf(values: Iterable[Any]) -> Tuple[List[float], List[float]]:
    """Exact empirical CDF: distinct finite values ascending and the fraction
    of samples <= each (the last is 1.0). Same definition as the apps'
    WriteCdfCsv."""
    s = sorted(v for v in (_num(x) for x in values) if v is not None)
    xs: List[float] = []
    fs: List[float] = []
    n = len(s)
    for k, v in enumerate(s, 1):
        if xs and xs[-1] == v:
            fs[-1] = k / n
        else:
            xs.append(v)
            fs.append(k / n)
    return xs, fs


def latency_stats(lat: Dict[int, float],
                  exclude: Iterable[int] = ()) -> Dict[str, Optional[float]]:
    """p50 / p99 (nearest rank, as the launcher's report) / mean / max of a
    per-iteration latency series, without the excluded iterations."""
    ex = set(exclude)
    vals = [v for i, v in lat.items() if i not in ex]
    return {"count": len(vals),
            "p50": dblp_report.percentile_nearest_rank(vals, 50),
            "p99": dblp_report.percentile_nearest_rank(vals, 99),
            "mean": dblp_report.mean(vals),
            "max": max(vals) if vals else None}


def bursts_from_rows(worker_rows: Iterable[Iterable[Dict[str, Any]]]
                     ) -> List[int]:
    its = set()
    for rows in worker_rows:
        for r in rows:
            if r.get("burst") is True and "iteration" in r:
                its.add(int(r["iteration"]))
    return sorted(its)


def microburst_table(base: Dict[int, float], other: Dict[int, float],
                     bursts: Sequence[int],
                     other_critical: Optional[Dict[int, bool]] = None
                     ) -> Dict[str, Any]:
    """Tables II/III: spike latency per burst, p99 and mean of every
    iteration, each base/other (fixed/dblp). Whether the other policy was
    inside a CLR at each burst (it then pays the same as the base)."""
    rows = []
    for b in bursts:
        rows.append({"iteration": b, "base_us": base.get(b),
                     "other_us": other.get(b),
                     "ratio": dblp_report.ratio(base.get(b), other.get(b)),
                     "other_critical": (other_critical or {}).get(b)})
    sb, so = latency_stats(base), latency_stats(other)
    cb = latency_stats(base, bursts)
    co = latency_stats(other, bursts)
    return {
        "bursts": rows,
        "p99": {"base": sb["p99"], "other": so["p99"],
                "ratio": dblp_report.ratio(sb["p99"], so["p99"])},
        "mean": {"base": sb["mean"], "other": so["mean"],
                 "ratio": dblp_report.ratio(sb["mean"], so["mean"])},
        "clean_p50": {"base": cb["p50"], "other": co["p50"],
                      "ratio": dblp_report.ratio(cb["p50"], co["p50"])},
        "iterations": {"base": sb["count"], "other": so["count"]},
    }


# --------------------------------------------------------------------------
# Training results (the workers' per-epoch CSVs).
# --------------------------------------------------------------------------

TRAINING_COLUMNS = ("epoch", "iteration", "train_loss", "test_accuracy",
                    "wall_s")


def read_training_csv(path: str) -> List[Dict[str, Optional[float]]]:
    """Rows of a worker's training CSV (epoch, iteration, train_loss,
    test_accuracy, wall_s; extra columns kept), numbers as float or None.
    test_accuracy is returned in percent: a file whose accuracies are all
    within [0, 1] is taken to hold fractions."""
    rows: List[Dict[str, Optional[float]]] = []
    with open(path, newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            row: Dict[str, Optional[float]] = {}
            for k, v in rec.items():
                if k is None:
                    continue
                k = k.strip()
                try:
                    x = float(v)
                    row[k] = x if math.isfinite(x) else None
                except (TypeError, ValueError):
                    row[k] = None
            rows.append(row)
    accs = [r.get("test_accuracy") for r in rows
            if r.get("test_accuracy") is not None]
    if accs and max(accs) <= 1.0:
        for r in rows:
            if r.get("test_accuracy") is not None:
                r["test_accuracy"] = 100.0 * r["test_accuracy"]
    return rows


def training_csvs(worker_dir: str) -> List[str]:
    """The worker's training CSV: training.csv, or training-w<rank>.csv /
    training*.csv if the worker names it by rank."""
    exact = os.path.join(worker_dir, "training.csv")
    if os.path.isfile(exact):
        return [exact]
    return sorted(glob.glob(os.path.join(worker_dir, "training*.csv")))


def worker_dirs(policy_dir: str) -> List[str]:
    found = []
    if os.path.isdir(policy_dir):
        for name in os.listdir(policy_dir):
            m = re.fullmatch(r"worker(\d+)", name)
            if m:
                found.append((int(m.group(1)), os.path.join(policy_dir, name)))
    return [d for _, d in sorted(found)]


def load_training(policy_dir: str) -> List[List[Dict[str, Optional[float]]]]:
    """One list of CSV rows per worker that wrote a training CSV."""
    out = []
    for d in worker_dirs(policy_dir):
        for path in training_csvs(d)[:1]:
            rows = read_training_csv(path)
            if rows:
                out.append(rows)
    return out


def accuracy_curve(workers: Sequence[Sequence[Dict[str, Optional[float]]]]
                   ) -> List[Tuple[float, float]]:
    """(epoch, mean test accuracy over workers) per epoch, ascending. A
    worker's last row of an epoch counts (a partial last epoch is its own
    point)."""
    per_epoch: Dict[float, List[float]] = {}
    for rows in workers:
        last: Dict[float, float] = {}
        for r in rows:
            e, a = r.get("epoch"), r.get("test_accuracy")
            if e is not None and a is not None:
                last[e] = a
        for e, a in last.items():
            per_epoch.setdefault(e, []).append(a)
    return [(e, sum(v) / len(v)) for e, v in sorted(per_epoch.items())]


def final_accuracy(workers: Sequence[Sequence[Dict[str, Optional[float]]]]
                   ) -> Dict[str, Optional[float]]:
    """Mean / min / max over workers of each worker's last test accuracy."""
    finals = []
    for rows in workers:
        accs = [r.get("test_accuracy") for r in rows
                if r.get("test_accuracy") is not None]
        if accs:
            finals.append(accs[-1])
    if not finals:
        return {"mean": None, "min": None, "max": None, "workers": 0}
    return {"mean": sum(finals) / len(finals), "min": min(finals),
            "max": max(finals), "workers": len(finals)}


def training_time(workers: Sequence[Sequence[Dict[str, Optional[float]]]],
                  process_seconds: Optional[float] = None
                  ) -> Tuple[Optional[float], str]:
    """(seconds, source): train_s of the slowest worker's last CSV row (wall
    time minus the test evaluations, a fixed cost both policies pay), else
    its wall_s, else the launcher's process wall time of the policy run."""
    for key, label in (("train_s", "training.csv train_s (slowest worker, "
                                   "test evaluations excluded)"),
                       ("wall_s", "training.csv wall_s (slowest worker)")):
        times = []
        for rows in workers:
            w = [r.get(key) for r in rows if r.get(key) is not None]
            if w:
                times.append(w[-1])
        if times:
            return max(times), label
    if process_seconds is not None:
        return float(process_seconds), "process wall time (launcher)"
    return None, "unavailable"


def normalize(times: Dict[str, Optional[float]],
              ref: str = "dblp") -> Dict[str, Optional[float]]:
    """Each time divided by times[ref] (so ref = 1.0); None where missing."""
    r = times.get(ref)
    return {k: dblp_report.ratio(v, r) for k, v in times.items()}


def speedup_percent(t_base: Optional[float],
                    t_dblp: Optional[float]) -> Optional[float]:
    """How much less time dblp takes than the base, in percent of the base:
    (1 - t_dblp / t_base) x 100 (the paper's "23.86% speedup")."""
    if t_base is None or t_dblp is None or t_base == 0:
        return None
    return (1.0 - float(t_dblp) / float(t_base)) * 100.0


# --------------------------------------------------------------------------
# Markdown.
# --------------------------------------------------------------------------

def fmt(v: Any, spec: str = "{:.1f}", none: str = "-") -> str:
    if v is None:
        return none
    if isinstance(v, float) and not math.isfinite(v):
        return none
    try:
        return spec.format(v)
    except (ValueError, TypeError):
        return str(v)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
             right: Optional[Sequence[bool]] = None) -> str:
    """A GitHub markdown table; cells are str()-ed, '|' escaped."""
    if right is None:
        right = [False] + [True] * (len(headers) - 1)
    def cell(x):
        return str(x).replace("|", "\\|")
    out = ["| " + " | ".join(cell(h) for h in headers) + " |",
           "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, headers "
                             f"{len(headers)}")
        out.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(out) + "\n"


def write_csv(path: str, headers: Sequence[str],
              rows: Sequence[Sequence[Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(headers)
        for r in rows:
            w.writerow(["" if c is None else c for c in r])


# --------------------------------------------------------------------------
# Plots (matplotlib, Agg; imported on first use).
# --------------------------------------------------------------------------

def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def _legend(ax, loc="best"):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc=loc)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_accuracy_curves(curves: Dict[str, Sequence[Tuple[float, float]]],
                         path: str, title: str = "",
                         xlabel: str = "epoch") -> str:
    """One line per label (legend order = dict order)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, pts in curves.items():
        if not pts:
            continue
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if any(curves.values()):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_latency(series: Dict[str, Dict[int, float]], path: str, *,
                 spans: Sequence[Tuple[int, int]] = (),
                 bursts: Sequence[int] = (), title: str = "",
                 span_label: str = "dblp CLR (critical)") -> str:
    """Per-iteration push latency (ms) per policy; CLR spans shaded
    [first - 0.5, last + 0.5]; bursts as dashed vertical lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for k, (first, last) in enumerate(spans):
        ax.axvspan(first - 0.5, last + 0.5, color="tab:green", alpha=0.15,
                   lw=0, label=span_label if k == 0 else None)
    for k, b in enumerate(bursts):
        ax.axvline(b, color="tab:red", ls="--", lw=1,
                   label="70% microburst" if k == 0 else None)
    for name, lat in series.items():
        its = sorted(lat)
        ax.plot(its, [lat[i] / 1000.0 for i in its], lw=0.9, label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("push send latency, max over workers (ms)")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _legend(ax, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cdf(series: Dict[str, Iterable[float]], path: str,
             title: str = "") -> str:
    """Empirical CDF (ms, log x) of each policy's per-iteration latency."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, vals in series.items():
        xs, fs = ecdf(vals)
        if xs:
            ax.step([x / 1000.0 for x in xs], fs, where="post", label=name)
    ax.set_xscale("log")
    from matplotlib.ticker import ScalarFormatter
    for axis in (ax.xaxis,):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("push send latency, max over workers (ms)")
    ax.set_ylabel("fraction of iterations")
    ax.set_ylim(0, 1.01)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_normalized_times(data: Dict[str, Dict[str, Optional[float]]],
                          path: str, title: str = "") -> str:
    """Grouped bars: one group per key of data (e.g. 'cnn, bursts'), one bar
    per policy (normalised time, dblp = 1)."""
    plt = _plt()
    groups = list(data)
    policies: List[str] = []
    for g in groups:
        for p in data[g]:
            if p not in policies:
                policies.append(p)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(groups) + 2), 4.2))
    width = 0.8 / max(1, len(policies))
    for k, p in enumerate(policies):
        xs = [gi + (k - (len(policies) - 1) / 2) * width
              for gi in range(len(groups))]
        ys = [data[g].get(p) or 0.0 for g in groups]
        bars = ax.bar(xs, ys, width, label=p)
        for b, g in zip(bars, groups):
            v = data[g].get(p)
            ax.annotate("-" if v is None else f"{v:.2f}",
                        (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel("training time (dblp = 1)")
    if title:
        ax.set_title(title)
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
