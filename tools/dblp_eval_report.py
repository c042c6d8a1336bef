"""The report of tools/dblp-eval: tables, targets and plots from the runs'
run.json files (<out>/runs/*/run.json), into <out>/report.md and
<out>/plots/. Runs with any number of finished seeds: a cell shows how many
it has."""

import glob
import json
import math
import os
import sys

T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36,
       9: 2.31, 10: 2.26}
SYSTEM_ORDER = ["gloo", "reliable", "fixed", "dblp", "ltp", "deadline",
                "combined"]
ENV_ORDER = ["clean", "gray", "burst", "tail15", "tail3"]
# The most CPU, as a share of a run's wall time, that processes outside a
# run may take before its times stop counting. On an idle host the /proc
# scan finds 0.5-0.7%; runs that met other work took 1.5-44% (one ResNet-18
# gloo run at 44% trained in 71 s, in 60 s when run again).
MAX_FOREIGN_SHARE = 0.015
# The DBLP paper (seeds/000): its microburst and training-time tables, for
# the side-by-side table. Baseline = fixed (MLT's constant tolerance).
PAPER = {
    "II/III spike ratio (fixed / dblp at a burst)": "4.68x, 5.88x "
    "(EfficientNetB0, Table II)",
    "II/III P99 ratio (fixed / dblp)": "1.91x (EfficientNetB0)",
    "II/III mean ratio (fixed / dblp)": "1.56x (EfficientNetB0)",
    "IV accuracy under bursts (dblp - fixed)": "-1.55, -0.76 points "
    "(EfficientNetB0, ResNet50)",
    "V training time saved against fixed, bursts": "23.86% (EfficientNetB0),"
    " 19.78% (ResNet50)",
    "V training time saved against fixed, no bursts": "17.44% "
    "(EfficientNetB0), 17.51% (ResNet50)",
    "VI accuracy, dblp / fixed": "99.59% (EfficientNetB0), 99.42% (ResNet50)",
}


def interval95(v):
    """Mean and the half-width of its 95% Student-t interval (NaN for one
    value)."""
    v = [x for x in v if x is not None and math.isfinite(x)]
    if not v:
        return float("nan"), float("nan")
    n = len(v)
    m = sum(v) / n
    if n < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    return m, T95.get(n, 2.0) * sd / math.sqrt(n)


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def load(out):
    runs = []
    for path in sorted(glob.glob(os.path.join(out, "runs", "*", "run.json"))):
        with open(path) as f:
            runs.append(json.load(f))
    return runs


def foreign_share(run):
    """The share of a run's wall time that other processes took. None for
    runs recorded before the /proc scan (3f07c14, the runs without
    kernel_threads_cpu_s): their foreign_cpu_s was /proc/stat's busy time
    less the run's own, which the kernel's work on the run's frames moved
    by tens of seconds either way."""
    f, w = run.get("foreign_cpu_s"), run.get("wall_s")
    if f is None or not w or "kernel_threads_cpu_s" not in run:
        return None
    return f / w


def disturbed(runs):
    """Runs whose times other work on the host spoiled, worst first."""
    bad = [r for r in runs if (foreign_share(r) or 0) > MAX_FOREIGN_SHARE]
    return sorted(bad, key=foreign_share, reverse=True)


def run_dir_name(model, system, env, seed):
    """A run's directory under <out>/runs (dblp-eval's resume key)."""
    return f"{model}-{system}-{env}-s{seed}"


def run_name(run):
    return run_dir_name(run["model"], run["system"], run["env"], run["seed"])


def foreign_lines(runs):
    """One bullet: how quiet the host was, and which runs to run again."""
    shares = [x for x in map(foreign_share, runs) if x is not None]
    if not shares:
        return []
    bad = disturbed(runs)
    line = (f"- Other processes' CPU (`foreign_cpu_s`): median "
            f"{100 * median(shares):.2f}% of a run's wall time, at most "
            f"{100 * max(shares):.2f}% ({len(shares)} of {len(runs)} runs "
            "measured it); ")
    if not bad:
        return [line + f"none over {100 * MAX_FOREIGN_SHARE:.1f}%."]
    names = ", ".join(f"`{run_name(r)}` {100 * foreign_share(r):.1f}%"
                      for r in bad)
    return [line + f"**{len(bad)} over {100 * MAX_FOREIGN_SHARE:.1f}%, "
            f"their times not to be trusted**: {names}. Delete their "
            "directories under runs/ and `dblp-eval run` does them again."]


def step_ms(run):
    """Median step (or C++ iteration) time, warm-up left out."""
    s = run.get("step_s") or []
    return 1e3 * median(s[10:] or s) if s else float("nan")


def tail_ratio(run):
    s = sorted((run.get("step_s") or [])[10:])
    if len(s) < 20:
        return float("nan")
    return s[int(0.99 * (len(s) - 1))] / s[len(s) // 2]


def time_to(run, target):
    """Training seconds until the accuracy curve first reaches `target`
    (linear between curve points); None when it never does."""
    prev = (0.0, 0.0)
    for t, _step, acc in run.get("curve") or []:
        if acc >= target:
            t0, a0 = prev
            if acc == a0:
                return t
            return t0 + (t - t0) * (target - a0) / (acc - a0)
        prev = (t, acc)
    return None


def cells(runs):
    by = {}
    for r in runs:
        by.setdefault((r["model"], r["env"]), {}).setdefault(
            r["system"], []).append(r)
    return by


def target_of(by, model):
    """The lowest final curve accuracy of reliable's clean seeds (the
    issue's target), else of any reliable runs of the model."""
    for env in ["clean"] + ENV_ORDER:
        rel = by.get((model, env), {}).get("reliable", [])
        if rel:
            return min(r["curve"][-1][2] for r in rel if r.get("curve"))
    return None


def fmt(m, h, unit="", digits=2):
    if m is None or not math.isfinite(m):
        return "-"
    s = f"{m:.{digits}f}{unit}"
    if h is not None and math.isfinite(h):
        s += f" ± {h:.{digits}f}"
    return s


def cell_stats(rs, target, ref_by_seed):
    acc = [100 * r["test_accuracy"] for r in rs
           if r.get("test_accuracy") is not None]
    tta = [time_to(r, target) if target is not None else None for r in rs]
    reached = [t for t in tta if t is not None]
    paired = [100 * (r["test_accuracy"] - ref_by_seed[r["seed"]])
              for r in rs if r["seed"] in ref_by_seed and
              r.get("test_accuracy") is not None]
    net = [r.get("network", {}) for r in rs]
    frames = sum(n.get("frames_out", 0) for n in net)
    return {
        "seeds": len(rs), "acc": interval95(acc), "delta": interval95(paired),
        "ms": interval95([step_ms(r) for r in rs]),
        "tail": interval95([tail_ratio(r) for r in rs]),
        "tta": interval95(reached), "reached": len(reached),
        "train_s": interval95([r.get("train_s") for r in rs]),
        "wire": sum(n.get("wire_drops", 0) for n in net) / frames
        if frames else 0.0,
        "queue": sum(n.get("queue_drops", 0) for n in net),
        "oversize": sum(n.get("oversize", 0) for n in net),
        "delivered": min((r.get("delivered_min", 1.0) for r in rs),
                         default=1.0)}


def all_reached(stats):
    return stats["seeds"] > 0 and stats["reached"] == stats["seeds"]


def model_tables(by):
    lines, stats = [], {}
    for model in dict.fromkeys(m for m, _ in sorted(by)):
        target = target_of(by, model)
        tgt = f"{100 * target:.2f}%" if target is not None else "-"
        lines += ["", f"### {model}: target accuracy {tgt} (lowest final "
                  "curve accuracy of reliable's clean seeds)", "",
                  "| env | system | seeds | final accuracy % | vs reliable "
                  "(paired) | step ms | P99/P50 | time to target s "
                  "(reached) | vs fixed | vs gloo | wire drop | queue drops "
                  "| oversize | min delivered |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                  "---:|---:|---:|"]
        for env in ENV_ORDER:
            c = by.get((model, env))
            if not c:
                continue
            ref = {r["seed"]: r["test_accuracy"]
                   for r in c.get("reliable", [])}
            st = {s: cell_stats(rs, target, ref) for s, rs in c.items()}
            stats[(model, env)] = st
            for system in sorted(st, key=SYSTEM_ORDER.index):
                x = st[system]

                def vs(other):
                    # Only where every seed of both reached the target: a
                    # mean over the runs that got there would flatter the
                    # one that often did not.
                    o = st.get(other)
                    if not o or other == system or not all_reached(x) or \
                            not all_reached(o):
                        return "-"
                    return f"{100 * (1 - x['tta'][0] / o['tta'][0]):+.0f}%"
                lines.append(
                    f"| {env} | {system} | {x['seeds']} | "
                    f"{fmt(*x['acc'])} | "
                    f"{'-' if system == 'reliable' else fmt(*x['delta'])} | "
                    f"{fmt(*x['ms'], digits=1)} | {fmt(x['tail'][0], None)} "
                    f"| {fmt(*x['tta'], digits=1)} ({x['reached']}/"
                    f"{x['seeds']}) | {vs('fixed')} | {vs('gloo')} | "
                    f"{100 * x['wire']:.2f}% | {x['queue']} | "
                    f"{x['oversize']} | {x['delivered']:.3f} |")
    return lines, stats


def targets(stats):
    """The issue's Done-when lines, each MET / NOT MET / open."""
    out = ["", "## Targets", ""]
    for (model, env), st in sorted(stats.items()):
        if env not in ("burst", "gray") or "dblp" not in st:
            continue
        d = st["dblp"]
        for other, need in (("fixed", 25), ("gloo", 40)):
            o = st.get(other)
            if not o:
                continue
            if all_reached(d) and all_reached(o):
                gain = 100 * (1 - d["tta"][0] / o["tta"][0])
                verdict = "MET" if gain >= need else "NOT MET"
                out.append(f"- {model}, {env}: dblp reaches the target "
                           f"{gain:.0f}% sooner than {other} (need >= "
                           f"{need}%): **{verdict}** ({d['seeds']} and "
                           f"{o['seeds']} seeds)")
            else:
                # A run that never reaches the target is slower than any
                # that does: dblp wins only by reaching it every time.
                verdict = ("MET" if all_reached(d) else "NOT MET")
                out.append(f"- {model}, {env}: dblp vs {other}: the target "
                           f"was reached by dblp in {d['reached']} of "
                           f"{d['seeds']} runs, by {other} in "
                           f"{o['reached']} of {o['seeds']} (need >= {need}% "
                           f"sooner): **{verdict}**")
        r = st.get("reliable")
        if r:
            dm, dh = d["delta"]
            ok = math.isfinite(dm) and abs(dm) <= 0.5
            overlap = (abs(d["acc"][0] - r["acc"][0]) <=
                       (d["acc"][1] + r["acc"][1]))
            out.append(f"- {model}, {env}: dblp's final accuracy "
                       f"{dm:+.2f} ± {dh:.2f} points against reliable "
                       f"(need within 0.5, intervals overlap: "
                       f"{'yes' if overlap else 'no'}): "
                       f"**{'MET' if ok and overlap else 'NOT MET'}**")
    for (model, env), st in sorted(stats.items()):
        if env == "clean" and "reliable" in st and "gloo" in st:
            ratio = st["reliable"]["ms"][0] / st["gloo"]["ms"][0]
            out.append(f"- {model}, clean: reliable's step is {ratio:.2f}x "
                       "gloo's (need <= 1.1 in the symmetric topology)")
    return out


def paper_table(stats, runs):
    out = ["", "## The paper's Tables II-VI beside ours", "",
           "| table | the paper (its GPUs, 10 Gb/s) | here (model: value) |",
           "|---|---|---|"]
    ours = {k: [] for k in PAPER}
    for (model, env), st in sorted(stats.items()):
        f, d = st.get("fixed"), st.get("dblp")
        if not f or not d:
            continue
        if env == "burst":
            sp = spike_ratio(runs, model)
            if sp:
                ours["II/III spike ratio (fixed / dblp at a burst)"].append(
                    f"{model}: {sp:.2f}x")
            ours["IV accuracy under bursts (dblp - fixed)"].append(
                f"{model}: {d['acc'][0] - f['acc'][0]:+.2f}")
            ours["V training time saved against fixed, bursts"].append(
                f"{model}: {100 * (1 - d['train_s'][0] / f['train_s'][0]):.1f}%")
        if env == "clean":
            ours["II/III P99 ratio (fixed / dblp)"].append(
                f"{model}: {p99(runs, model, 'fixed') / p99(runs, model, 'dblp'):.2f}x")
            ours["II/III mean ratio (fixed / dblp)"].append(
                f"{model}: {f['ms'][0] / d['ms'][0]:.2f}x (median step)")
            ours["V training time saved against fixed, no bursts"].append(
                f"{model}: {100 * (1 - d['train_s'][0] / f['train_s'][0]):.1f}%")
            ours["VI accuracy, dblp / fixed"].append(
                f"{model}: {100 * d['acc'][0] / f['acc'][0]:.2f}%")
    for k, v in PAPER.items():
        out.append(f"| {k} | {v} | {'; '.join(ours[k]) or '-'} |")
    return out


def p99(runs, model, system):
    v = [s for r in runs if r["model"] == model and r["system"] == system
         and r["env"] == "clean" for s in (r.get("step_s") or [])[10:]]
    v.sort()
    return v[int(0.99 * (len(v) - 1))] if v else float("nan")


def spike_ratio(runs, model):
    """fixed's step time at its bursts over dblp's at the same steps (the
    same seeded steps for both), the median over bursts and seeds."""
    by = {}
    for r in runs:
        if r["model"] == model and r["env"] == "burst":
            by.setdefault(r["seed"], {})[r["system"]] = r
    ratios = []
    for pair in by.values():
        f, d = pair.get("fixed"), pair.get("dblp")
        if not f or not d:
            continue
        for b in f.get("bursts", []):
            i = b["step"]
            if i < len(f["step_s"]) and i < len(d["step_s"]):
                ratios.append(f["step_s"][i] / d["step_s"][i])
    return median(ratios) if ratios else None


def plots(out, runs, by):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [f"(no plots: no matplotlib in {sys.executable}; run the "
                "report with Debian's /usr/bin/python3, python3-matplotlib)"]
    pdir = os.path.join(out, "plots")
    os.makedirs(pdir, exist_ok=True)
    made = []
    for (model, env), c in sorted(by.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for system in sorted(c, key=SYSTEM_ORDER.index):
            rs = [r for r in c[system] if r.get("curve")]
            if not rs:
                continue
            steps = [p[1] for p in rs[0]["curve"]]
            t = [interval95([r["curve"][i][0] for r in rs
                             if i < len(r["curve"])])[0]
                 for i in range(len(steps))]
            acc = [interval95([100 * r["curve"][i][2] for r in rs
                               if i < len(r["curve"])])
                   for i in range(len(steps))]
            m = [a[0] for a in acc]
            h = [a[1] if math.isfinite(a[1]) else 0 for a in acc]
            ax.plot(t, m, marker=".", label=f"{system} ({len(rs)} seeds)")
            ax.fill_between(t, [x - y for x, y in zip(m, h)],
                            [x + y for x, y in zip(m, h)], alpha=0.2)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{model}, {env}: accuracy against time (mean, 95%)")
        ax.legend(fontsize=7)
        path = os.path.join(pdir, f"tta-{model}-{env}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)
        made += latency_plots(plt, pdir, model, env, c)
    return made


def latency_plots(plt, pdir, model, env, c):
    """Seed 1 (or the lowest) of each system: step time per iteration, the
    dblp run's CLR windows shaded and the bursts marked; and the CDF."""
    fig, (ax, cx) = plt.subplots(1, 2, figsize=(11, 4))
    shaded = False
    for system in sorted(c, key=SYSTEM_ORDER.index):
        rs = sorted(c[system], key=lambda r: r["seed"])
        if not rs or not rs[0].get("step_s"):
            continue
        r = rs[0]
        ms = [1e3 * s for s in r["step_s"]]
        ax.plot(range(len(ms)), ms, lw=0.7, label=system)
        v = sorted(ms)
        cx.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=system)
        if system == "dblp" and r.get("critical") and not shaded:
            for a, b in windows(r["critical"]):
                ax.axvspan(a, b + 1, color="orange", alpha=0.15,
                           label=None if shaded else "dblp CLR")
                shaded = True
        for b in r.get("bursts", []) if system in ("fixed", "dblp") else []:
            ax.axvline(b["step"], color="red", lw=0.5, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"{model}, {env}: per-iteration step (seed "
                 f"{min(r['seed'] for rs in c.values() for r in rs)})")
    ax.legend(fontsize=7)
    cx.set_xscale("log")
    cx.set_xlabel("step time (ms)")
    cx.set_ylabel("CDF")
    cx.legend(fontsize=7)
    path = os.path.join(pdir, f"latency-{model}-{env}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def windows(flags):
    """[(first, last)] of the runs of True in `flags`."""
    out, start = [], None
    for i, f in enumerate(flags + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i - 1))
            start = None
    return out


def render(out):
    runs = load(out)
    by = cells(runs)
    lines = [f"# tools/dblp-eval: {len(runs)} runs in {out}", ""]
    if runs:
        tb = runs[0]["testbed"]
        lines.append(f"Testbed: {tb['topology']} topology, {tb['workers']} "
                     f"workers, queues {tb['queue_kb']} KB, MTU {tb['mtu']};"
                     " per-model worker link rates in the runs' config.")
    for path in sorted(glob.glob(os.path.join(out, "share-*.json"))):
        with open(path) as f:
            sh = json.load(f)
        lines.append(f"- {sh['model']}: at {sh['rate_mbit']:.0f} Mbit/s a "
                     f"worker's port ({sh['topology']}), gloo's step "
                     f"{1e3 * sh['gloo_step_s']:.1f} ms against "
                     f"{1e3 * sh['compute_step_s']:.1f} ms with no "
                     f"communication: **communication {100 * sh['share']:.0f}"
                     "% of a gloo step** (`tools/dblp-eval share`)")
    same = [r["seed"] for r in runs if r["system"] == "reliable" and any(
        g["system"] == "gloo" and g["seed"] == r["seed"] and
        g["model"] == r["model"] and g["env"] == r["env"] and
        g.get("test_accuracy") == r.get("test_accuracy") for g in runs)]
    pairs = sum(1 for r in runs if r["system"] == "reliable" and any(
        g["system"] == "gloo" and g["seed"] == r["seed"] and
        g["model"] == r["model"] and g["env"] == r["env"] for g in runs))
    if pairs:
        lines.append(f"- `reliable` ended with gloo's final accuracy to the "
                     f"last digit in {len(same)} of {pairs} paired runs "
                     "(same seed, model and environment): the exact path "
                     "survives the testbed's drops.")
    lines += foreign_lines(runs)
    t, stats = model_tables(by)
    lines += t + targets(stats) + paper_table(stats, runs)
    made = plots(out, runs, by)
    # A line that is not a plot says why there are none (no matplotlib in
    # the python that ran the report): never an empty section.
    lines += ["", "## Plots", ""] + [
        f"![{os.path.basename(p)}](plots/{os.path.basename(p)})"
        if p.endswith(".png") else p for p in made]
    return "\n".join(lines) + "\n"


def main(out):
    text = render(out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
