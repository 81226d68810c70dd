"""Paper B's Covertype experiment: DP-SVRG / DP-SVRG++ against DP-GD, optimality gap versus wall
time and versus passes over the data (the paper's Figures 1–2; Paper B's page in ``docs/algorithms/``).

Two settings, each for every epsilon and run:

* ``regularized`` (Fig. 1): ``F^r(w) = mean logistic loss + (1e-2 / 2) ||w||^2``, DP-SVRG
  (T = 15 epochs, m = 5000 inner steps) against DP-GD (T = 1500). The paper's SVRG-BB step rule
  reads exact full gradients at the snapshots and so is not private; both methods use constant
  steps taken from a grid instead. The grid is searched NON-privately (the best mean final gap is
  reported; tuning is not accounted, see "What is not accounted" in ``docs/privacy.md``), the same
  rule for both methods so the comparison is fair.
* ``unregularized`` (Fig. 2): plain logistic loss, DP-SVRG++ (T = 15, m = 10, eta = 0.01) against
  DP-GD (T = 1000, eta = 0.1), all as printed.

Data: Covertype as the binary task "Lodgepole Pine (Cover_Type 2) vs the other six types"
(intended to match LIBSVM ``covtype.binary``; label +1 = type 2), rows scaled to unit L2 norm (so
G = 1 and per-sample clipping at 1 is a no-op) as :func:`load_covertype_binary` documents;
``n_train`` rows after a seeded shuffle.

Every run goes through the shared step loop (:func:`privopt.training.run_loop`) with the run
randomness of :mod:`privopt.training`: secret noise and sampling by default, ``insecure_seed`` for
reproducible (NOT private) research runs. Noise is calibrated exactly for each method's query
inventory and target (epsilon, delta) with the project accountant (add/remove-one neighbours);
``epsilon_spent`` is re-computed by the ledger from the steps actually recorded. The reference
optimum ``F*`` comes from scipy L-BFGS. The reported gaps are training-set objective values: a
research measurement of the optimiser, not a private release.

Outputs in ``out_dir``: ``results.jsonl`` (one row per method, setting, epsilon, step size and
run), ``summary.md``, ``summary.json`` and the PNG figures ``fig1_gap_vs_time.png``,
``fig1_gap_vs_passes.png``, ``fig2_gap_vs_time.png``, ``fig2_gap_vs_passes.png``.

Example (CLI, once wired by the lead):
    privopt reproduce erm-covertype --data-dir ../shared/data/covtype --budget quick --out runs/erm
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import Algorithm, RunContext
from privopt.algorithms.dp_gd_erm import DPGDERM
from privopt.algorithms.erm_common import single_thread_blas
from privopt.algorithms.svrg import DPSVRG, DPSVRGPlusPlus
from privopt.errors import ConfigError, DataError
from privopt.objectives.erm import LogisticERM, logistic_loss, minmax_scale, normalize_rows
from privopt.training import Every, LoopState, randomness_section, run_loop, run_sources

__all__ = ["load_covertype_binary", "run_erm_covertype", "add_arguments", "main", "BUDGETS"]

POSITIVE_COVER_TYPE = 2  # Lodgepole Pine
NEIGHBOURING = "add_remove"


@dataclass(frozen=True)
class Budget:
    runs: int
    accountant: str  # "rdp" (fast) or "pld" (tighter; calibration takes ~10-80 s each)
    svrg_steps: tuple[float, ...]  # DP-SVRG step-size grid (Fig. 1)
    gd_steps: tuple[float, ...]  # DP-GD step-size grid (Fig. 1)
    curve_points: int  # evaluation points per DP-GD curve


BUDGETS = {
    "quick": Budget(
        runs=3, accountant="rdp", svrg_steps=(0.0003, 0.001, 0.003), gd_steps=(0.05, 0.1, 0.5), curve_points=60
    ),
    "paper": Budget(
        runs=10,
        accountant="pld",
        svrg_steps=(0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1),
        gd_steps=(0.01, 0.05, 0.1, 0.5, 1.0),
        curve_points=150,
    ),
}
REG_L2 = 1e-2
SVRG = dict(epochs=15, inner=5000)
SVRG_PP = dict(epochs=15, inner=10, step_size=0.01)
GD_REG_ITERATIONS = 1500
GD_UNREG = dict(iterations=1000, step_size=0.1)


# ------------------------------------------------------------------------------------------- data
def _find_covtype_file(data_dir: Path) -> Path:
    """The UCI file in ``data_dir`` or its ``covtype/`` sub-folder (the layout of every privopt data dir)."""
    if data_dir.is_file():
        return data_dir
    for folder in (data_dir, data_dir / "covtype", data_dir / "covertype"):
        cands = sorted(p for p in folder.glob("covtype*.data*") if p.is_file())
        if cands:
            return cands[0]
    raise DataError(
        f"no Covertype file (covtype*.data or covtype*.data.gz) found in {data_dir} or {data_dir / 'covtype'}"
    )


def load_covertype_binary(*, data_dir, n_train: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Covertype as ±1 logistic-regression data with unit-norm rows (see the module docstring).

    Args:
        data_dir: a data folder with ``covtype/covtype*.data[.gz]`` (UCI format), the folder
            holding that file, or the file itself.
        n_train: rows to keep after a seeded shuffle (default: all).
        seed: shuffle seed.

    Returns:
        ``(features [n, 54] float64 with ||x_i|| = 1, labels [n] in {-1, +1})``.
    """
    from privopt.data.formats import read_covtype

    raw_x, cover = read_covtype(_find_covtype_file(Path(data_dir)))
    n_all = raw_x.shape[0]
    if n_train is not None and not (isinstance(n_train, int) and 1 <= n_train <= n_all):
        raise ConfigError(f"n_train must be an integer in [1, {n_all}] for this file, got {n_train!r}")
    order = np.random.default_rng(seed).permutation(n_all)[: n_train or n_all]
    x = normalize_rows(minmax_scale(raw_x))[order]
    y = np.where(cover[order] == POSITIVE_COVER_TYPE, 1.0, -1.0)
    return x, y


# ------------------------------------------------------------------------------------- one run
def _calibrate(algo: Algorithm, *, n: int, epsilon: float, delta: float, accountant: str):
    from privopt.privacy import calibrate

    return calibrate(
        algo.inventory(n=n), epsilon=epsilon, delta=delta, neighbouring=NEIGHBOURING, accountant=accountant
    )


def _sources(insecure_seed: int | None) -> dict:
    srcs = run_sources(insecure_seed)  # secret unless the experiment opted into seeded randomness
    return {"noise_rng": srcs["noise"], "sampler_rng": srcs["sampler"]}


def _run_once(
    algo: Algorithm,
    *,
    x: torch.Tensor,
    y: torch.Tensor,
    problem: LogisticERM,
    f_star: float,
    noise: dict[str, float],
    delta: float,
    accountant: str,
    insecure_seed: int | None,
    eval_every: int,
) -> dict[str, Any]:
    """Run one private optimisation; returns final gap, algorithm wall time and the gap curve."""
    from privopt.privacy import PrivacyLedger

    ledger = PrivacyLedger(delta=delta, neighbouring=NEIGHBOURING, accountant=accountant)
    model = torch.nn.Linear(x.shape[1], 1, bias=False, dtype=torch.float64)
    torch.nn.init.zeros_(model.weight)
    ctx = RunContext(
        model=model,
        loss_fn=logistic_loss,
        x_train=x,
        y_train=y,
        engine=None,
        ledger=ledger,
        noise=dict(noise),
        **_sources(insecure_seed),
    )
    algo.setup(ctx)

    def gap() -> float:
        with single_thread_blas():
            return problem.objective(algo.output()) - f_star

    curve = [{"wall_s": 0.0, "passes": 0.0, "gap": gap()}]

    def point(state: LoopState, logs: dict) -> None:  # evaluation is not part of the algorithm's time
        curve.append({"wall_s": state.algo_time_s, "passes": algo.passes, "gap": gap()})

    state = run_loop(algo.step, LoopState(step=0, total=algo.num_steps()), [Every(eval_every, point)])
    algo.finalize()
    return {
        "gap": curve[-1]["gap"],
        "wall_s": state.algo_time_s,
        "passes": algo.passes,
        "epsilon_spent": float(ledger.epsilon()),
        "curve": curve,
    }


# ------------------------------------------------------------------------------------ experiment
def run_erm_covertype(
    *,
    data_dir,
    n_train: int | None = None,
    epsilons: Sequence[float] = (0.2, 0.5, 1.0),
    delta: float = 1e-3,
    runs: int | None = None,
    budget: str = "quick",
    out_dir,
    progress: bool = True,
    seed: int = 0,
    accountant: str | None = None,
    insecure_seed: int | None = None,
) -> list[dict]:
    """Run both settings of Paper B's experiment and write results, plots and a summary.

    Args:
        data_dir: Covertype folder (``covtype*.data[.gz]``) or file.
        n_train: training rows (default: all rows of the file).
        epsilons: target epsilons.
        delta: target delta.
        runs: runs per (setting, method, epsilon, step size); default from the budget (quick 3, paper 10).
        budget: ``"quick"`` (small step grids) or ``"paper"`` (the full grids, 10 runs).
        out_dir: output folder (created).
        progress: print one line per finished configuration.
        seed: data shuffle seed (a public choice).
        accountant: ``"rdp"`` or ``"pld"`` for calibration and the ledger (default: the budget's,
            quick ``"rdp"``, paper ``"pld"``).
        insecure_seed: seed the noise and sampling (run r uses ``insecure_seed + r``): reproducible
            but NOT private; default secret randomness.

    Returns:
        The rows written to ``results.jsonl``.
    """
    if budget not in BUDGETS:
        raise ConfigError(f"unknown budget {budget!r}; use one of {sorted(BUDGETS)}")
    b = BUDGETS[budget]
    runs = b.runs if runs is None else runs
    accountant = b.accountant if accountant is None else accountant
    if accountant not in ("rdp", "pld"):
        raise ConfigError(f"accountant must be 'rdp' or 'pld', got {accountant!r}")
    if not (isinstance(runs, int) and runs >= 1):
        raise ConfigError(f"runs must be an integer >= 1, got {runs!r}")
    epsilons = [float(e) for e in epsilons]
    if not epsilons or any(not (math.isfinite(e) and e > 0) for e in epsilons):
        raise ConfigError(f"epsilons must be finite and > 0, got {epsilons}")
    if not (0 < delta < 1):
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    feats, labels = load_covertype_binary(data_dir=data_dir, n_train=n_train, seed=seed)
    n = feats.shape[0]
    x_t, y_t = torch.from_numpy(feats), torch.from_numpy(labels)
    log = (lambda msg: print(msg, flush=True)) if progress else (lambda msg: None)

    settings = {
        "regularized": {
            "l2": REG_L2,
            "methods": [
                *[("dp-svrg", lambda s: DPSVRG(l2=REG_L2, step_size=s, **SVRG), s) for s in b.svrg_steps],
                *[
                    ("dp-gd", lambda s: DPGDERM(l2=REG_L2, iterations=GD_REG_ITERATIONS, step_size=s), s)
                    for s in b.gd_steps
                ],
            ],
        },
        "unregularized": {
            "l2": 0.0,
            "methods": [
                ("dp-svrg-pp", lambda s: DPSVRGPlusPlus(l2=0.0, **SVRG_PP), SVRG_PP["step_size"]),
                ("dp-gd", lambda s: DPGDERM(l2=0.0, **GD_UNREG), GD_UNREG["step_size"]),
            ],
        },
    }
    rows: list[dict] = []
    meta: dict[str, Any] = {
        "n_train": n,
        "dim": int(feats.shape[1]),
        "delta": delta,
        "budget": budget,
        "runs": runs,
        "positive_class": f"Cover_Type == {POSITIVE_COVER_TYPE} (Lodgepole Pine)",
        "positive_share": float((labels > 0).mean()),
        "neighbouring": NEIGHBOURING,
        "accountant": accountant,
        "randomness": randomness_section(insecure_seed=insecure_seed),
    }
    results_path = out / "results.jsonl"
    with open(results_path, "w") as fh:
        for setting, spec in settings.items():
            problem = LogisticERM(features=feats, labels=labels, l2=spec["l2"])
            t0 = time.perf_counter()
            with single_thread_blas():
                _, f_star = problem.solve()
            meta[f"f_star_{setting}"] = f_star
            log(f"[{setting}] F* = {f_star:.10f} (L-BFGS, {time.perf_counter() - t0:.1f}s)")
            for eps in epsilons:
                for method, make, step in spec["methods"]:
                    cal = _calibrate(make(step), n=n, epsilon=eps, delta=delta, accountant=accountant)
                    gaps = []
                    for r in range(runs):
                        algo = make(step)
                        eval_every = max(1, algo.num_steps() // b.curve_points)
                        res = _run_once(
                            algo,
                            x=x_t,
                            y=y_t,
                            problem=problem,
                            f_star=f_star,
                            noise=cal.noise,
                            delta=delta,
                            accountant=cal.accountant,
                            insecure_seed=None if insecure_seed is None else insecure_seed + r,
                            eval_every=eval_every,
                        )
                        row = {
                            "setting": setting,
                            "method": method,
                            "algorithm": algo.name,
                            "epsilon": eps,
                            "delta": delta,
                            "run": r,
                            "step_size": step,
                            "gap": res["gap"],
                            "wall_s": res["wall_s"],
                            "passes": res["passes"],
                            "epsilon_spent": res["epsilon_spent"],
                            "noise_multipliers": dict(cal.noise),
                            "accountant": cal.accountant,
                            "f_star": f_star,
                            "n_train": n,
                            "l2": spec["l2"],
                            "hyperparameters": algo.hyperparameters(),
                            "curve": res["curve"],
                        }
                        fh.write(json.dumps(row) + "\n")
                        fh.flush()
                        rows.append(row)
                        gaps.append(res["gap"])
                    log(
                        f"[{setting}] {method:10s} eps={eps:g} step={step:g}: gap {np.mean(gaps):.4g} "
                        f"± {np.std(gaps):.2g}, wall {res['wall_s']:.2f}s, passes {res['passes']:.1f}, "
                        f"eps spent {res['epsilon_spent']:.4f}, z={ {k: round(v, 4) for k, v in cal.noise.items()} }"
                    )
    summary = summarize(rows)
    summary["meta"] = meta
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(summary_markdown(summary))
    plot_results(rows, summary, out)
    return rows


# ---------------------------------------------------------------------------------- aggregation
def _mean_curve(curves: list[list[dict]]) -> dict[str, np.ndarray]:
    # All runs of one configuration have the same evaluation points; average pointwise.
    k = min(len(c) for c in curves)
    arr = {key: np.array([[pt[key] for pt in c[:k]] for c in curves]) for key in ("wall_s", "passes", "gap")}
    return {key: v.mean(axis=0) for key, v in arr.items()}


def _gap_at(curve: dict[str, np.ndarray], key: str, x: float) -> float:
    """Mean gap of a curve at abscissa x (last point reached at or before x; NaN before the start)."""
    xs = curve[key]
    i = int(np.searchsorted(xs, x, side="right")) - 1
    return float(curve["gap"][i]) if i >= 0 else float("nan")


def summarize(rows: list[dict]) -> dict[str, Any]:
    """Per (setting, method, epsilon): the best step size and its mean/std gap, time and passes,
    plus the gap each method reaches within the other's wall time ("equal time")."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["method"], r["epsilon"], r["step_size"]), []).append(r)
    best: dict[tuple, dict] = {}
    for (setting, method, eps, step), rs in groups.items():
        gaps = np.array([r["gap"] for r in rs])
        entry = {
            "setting": setting,
            "method": method,
            "epsilon": eps,
            "step_size": step,
            "runs": len(rs),
            "gap_mean": float(gaps.mean()),
            "gap_std": float(gaps.std()),
            "wall_s_mean": float(np.mean([r["wall_s"] for r in rs])),
            "passes": float(np.mean([r["passes"] for r in rs])),
            "epsilon_spent_max": float(max(r["epsilon_spent"] for r in rs)),
            "curve": _mean_curve([r["curve"] for r in rs]),
        }
        key = (setting, method, eps)
        if key not in best or entry["gap_mean"] < best[key]["gap_mean"]:
            best[key] = entry
    comparisons = []
    for (setting, method, eps), e in best.items():
        if method == "dp-gd":
            continue
        gd = best.get((setting, "dp-gd", eps))
        if gd is None:
            continue
        comparisons.append(
            {
                "setting": setting,
                "method": method,
                "epsilon": eps,
                "method_gap": e["gap_mean"],
                "method_wall_s": e["wall_s_mean"],
                "dp_gd_gap_at_method_time": _gap_at(gd["curve"], "wall_s", e["wall_s_mean"]),
                "dp_gd_gap_final": gd["gap_mean"],
                "dp_gd_wall_s": gd["wall_s_mean"],
                "method_gap_at_dp_gd_time": _gap_at(e["curve"], "wall_s", gd["wall_s_mean"]),
                "method_better_at_equal_time": bool(
                    e["gap_mean"] < _gap_at(gd["curve"], "wall_s", e["wall_s_mean"])
                    if e["wall_s_mean"] <= gd["wall_s_mean"]
                    else _gap_at(e["curve"], "wall_s", gd["wall_s_mean"]) < gd["gap_mean"]
                ),
            }
        )
    table = []
    for e in sorted(best.values(), key=lambda d: (d["setting"], d["epsilon"], d["method"])):
        t = {k: v for k, v in e.items() if k != "curve"}
        t["curve"] = {k: v.tolist() for k, v in e["curve"].items()}
        table.append(t)
    return {"best": table, "comparisons": comparisons}


def summary_markdown(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    lines = ["# Paper B on Covertype: DP-SVRG / DP-SVRG++ vs DP-GD", ""]
    if meta:
        lines += [
            f"n = {meta['n_train']}, p = {meta['dim']}, delta = {meta['delta']}, budget = {meta['budget']}, "
            f"{meta['runs']} runs per configuration; positive class: {meta['positive_class']} "
            f"({100 * meta['positive_share']:.1f}% of rows); neighbouring: {meta['neighbouring']}; "
            f"accountant: {meta['accountant']}.",
            "",
        ]
    lines += [
        "Best constant step size per method (chosen non-privately by mean final gap).",
        "",
        "| setting | method | ε | step | gap (mean ± std) | wall s | passes | ε spent (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in summary["best"]:
        lines.append(
            f"| {e['setting']} | {e['method']} | {e['epsilon']:g} | {e['step_size']:g} | "
            f"{e['gap_mean']:.4g} ± {e['gap_std']:.2g} | {e['wall_s_mean']:.2f} | {e['passes']:.1f} | "
            f"{e['epsilon_spent_max']:.4f} |"
        )
    lines += [
        "",
        "Equal-time comparison (mean curves): the gap DP-GD reaches within the method's wall time, "
        "and the method's gap within DP-GD's wall time.",
        "",
        "| setting | method | ε | method gap (its time s) | DP-GD gap at that time | DP-GD final gap (its time s) "
        "| method gap at DP-GD time | method better at equal time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["comparisons"]:
        lines.append(
            f"| {c['setting']} | {c['method']} | {c['epsilon']:g} | {c['method_gap']:.4g} "
            f"({c['method_wall_s']:.2f}) | {c['dp_gd_gap_at_method_time']:.4g} | {c['dp_gd_gap_final']:.4g} "
            f"({c['dp_gd_wall_s']:.2f}) | {c['method_gap_at_dp_gd_time']:.4g} | "
            f"{'yes' if c['method_better_at_equal_time'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def plot_results(rows: list[dict], summary: dict[str, Any], out: Path) -> list[Path]:
    """Gap vs wall time and vs passes, one panel per epsilon, best step size per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from privopt.plots import save_figure

    paths = []
    for fig_no, setting in ((1, "regularized"), (2, "unregularized")):
        entries = [e for e in summary["best"] if e["setting"] == setting]
        eps_list = sorted({e["epsilon"] for e in entries})
        if not eps_list:
            continue
        for key, xlabel in (("wall_s", "wall time (s)"), ("passes", "passes over the data")):
            fig, axes = plt.subplots(1, len(eps_list), figsize=(4.2 * len(eps_list), 3.4), squeeze=False)
            for ax, eps in zip(axes[0], eps_list):
                for e in (e for e in entries if e["epsilon"] == eps):
                    xs = np.asarray(e["curve"][key])
                    ys = np.maximum(np.asarray(e["curve"]["gap"]), 1e-12)
                    ax.plot(xs[1:], ys[1:], marker=".", ms=3, label=f"{e['method']} (η={e['step_size']:g})")
                ax.set_yscale("log")
                if key == "wall_s":
                    ax.set_xscale("log")
                ax.set_xlabel(xlabel)
                ax.set_title(f"ε = {eps:g}")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
            axes[0][0].set_ylabel("optimality gap F(w) − F*")
            fig.suptitle(f"Fig. {fig_no}: {setting} logistic regression on Covertype")
            path = out / f"fig{fig_no}_gap_vs_{'time' if key == 'wall_s' else 'passes'}.png"
            save_figure(fig, path)
            paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------- CLI
def _float_list(s: str) -> list[float]:
    try:
        return [float(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``privopt reproduce erm-covertype``."""
    parser.add_argument("--data-dir", required=True, help="folder with covtype*.data[.gz] (UCI format)")
    parser.add_argument("--n-train", type=int, default=None, help="training rows (default: all rows of the file)")
    parser.add_argument("--epsilons", type=_float_list, default=[0.2, 0.5, 1.0], help="e.g. 0.2,0.5,1")
    parser.add_argument("--delta", type=float, default=1e-3)
    parser.add_argument("--runs", type=int, default=None, help="runs per configuration (default: 3 quick, 10 paper)")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="quick")
    parser.add_argument("--seed", type=int, default=0, help="data shuffle seed (public)")
    parser.add_argument(
        "--insecure-seed",
        type=int,
        default=None,
        metavar="N",
        help="seed the noise and sampling (run r uses N + r): reproducible but NOT private; default: secret",
    )
    parser.add_argument(
        "--accountant",
        choices=("rdp", "pld"),
        default=None,
        help="accountant for calibration (default: rdp for quick, pld for paper)",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args: argparse.Namespace) -> int:
    """Entry point for the parsed arguments; prints the Markdown summary (or JSON with --json)."""
    run_erm_covertype(
        data_dir=args.data_dir,
        n_train=args.n_train,
        epsilons=args.epsilons,
        delta=args.delta,
        runs=args.runs,
        budget=args.budget,
        out_dir=args.out,
        progress=not args.json,
        seed=args.seed,
        accountant=args.accountant,
        insecure_seed=args.insecure_seed,
    )
    out = Path(args.out)
    if args.json:
        summary = json.loads((out / "summary.json").read_text())
        for e in summary["best"]:
            e.pop("curve", None)
        print(json.dumps(summary, indent=2))
    else:
        print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    raise SystemExit(main(p.parse_args()))
