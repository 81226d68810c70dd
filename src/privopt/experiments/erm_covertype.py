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
import itertools
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
from privopt.cliargs import non_negative_int
from privopt.errors import ConfigError, DataError
from privopt.experiments.erm_covertype_report import plot_results, summarize, summary_markdown
from privopt.objectives.erm import LogisticERM, logistic_loss, minmax_scale, normalize_rows
from privopt.training import Every, LoopState, randomness_section, run_loop, run_sources

__all__ = ["load_covertype_binary", "run_erm_covertype", "add_arguments", "main", "BUDGETS", "summarize"]

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
    """Covertype as ±1 logistic-regression data with unit-norm rows, scaled with public constants only.

    Every feature is clipped into Covertype's public attribute range and min-max scaled with it
    (``privopt.data.public.covtype_bounds``; sources in docs/data.md, "Covertype"), then each row is
    scaled to unit L2 norm: no record's features depend on another record.

    Args:
        data_dir: a data folder with ``covtype/covtype*.data[.gz]`` (UCI format), the folder
            holding that file, or the file itself.
        n_train: rows to keep (default: all): the rows with the smallest keyed hash of their content
            (``seed`` as key), in hash order, so one row added to or removed from the file changes
            the kept set by at most one swap.
        seed: key of that hash.

    Returns:
        ``(features [n, 54] float64 with ||x_i|| = 1, labels [n] in {-1, +1})``.
    """
    from privopt.data.formats import read_covtype
    from privopt.data.public import covtype_bounds
    from privopt.data.selection import record_uniforms, stage_index

    raw_x, cover = read_covtype(_find_covtype_file(Path(data_dir)))
    n_all = raw_x.shape[0]
    if n_train is not None and not (isinstance(n_train, int) and 1 <= n_train <= n_all):
        raise ConfigError(f"n_train must be an integer in [1, {n_all}] for this file, got {n_train!r}")
    rank = record_uniforms(raw_x, cover, seed=seed)[:, stage_index("max_train")]
    order = np.argsort(rank, kind="stable")[: n_train or n_all]
    lower, upper = covtype_bounds()
    x = normalize_rows(minmax_scale(raw_x[order], lower=lower, upper=upper))
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
def _check_options(budget: str, runs, accountant, epsilons, delta) -> tuple[Budget, int, str, list[float]]:
    if budget not in BUDGETS:
        raise ConfigError(f"unknown budget {budget!r}; use one of {sorted(BUDGETS)}")
    b = BUDGETS[budget]
    runs = b.runs if runs is None else runs
    accountant = b.accountant if accountant is None else accountant
    if accountant not in ("rdp", "pld"):
        raise ConfigError(f"accountant must be 'rdp' or 'pld', got {accountant!r}")
    if not (isinstance(runs, int) and runs >= 1):
        raise ConfigError(f"runs must be an integer >= 1, got {runs!r}")
    eps_list = [float(e) for e in epsilons]
    if not eps_list or any(not (math.isfinite(e) and e > 0) for e in eps_list):
        raise ConfigError(f"epsilons must be finite and > 0, got {eps_list}")
    if not (0 < delta < 1):
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    return b, runs, accountant, eps_list


def _settings(b: Budget) -> dict[str, dict[str, Any]]:
    """Per setting: its L2 weight and the (method, algorithm factory, step size) configurations."""
    return {
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


@dataclass
class _Grid:
    """What every run of the experiment shares."""

    x: torch.Tensor
    y: torch.Tensor
    delta: float
    accountant: str
    runs: int
    curve_points: int
    insecure_seed: int | None
    write: Any  # one JSON row per run
    log: Any


def _run_configuration(
    grid: _Grid, *, setting: str, l2: float, problem: LogisticERM, f_star: float, eps: float, method: str, make, step
) -> list[dict]:
    """All runs of one (setting, method, epsilon, step size); each row is written as soon as it is done."""
    n = int(grid.x.shape[0])
    cal = _calibrate(make(step), n=n, epsilon=eps, delta=grid.delta, accountant=grid.accountant)
    rows = []
    for r in range(grid.runs):
        algo = make(step)
        res = _run_once(
            algo,
            x=grid.x,
            y=grid.y,
            problem=problem,
            f_star=f_star,
            noise=cal.noise,
            delta=grid.delta,
            accountant=cal.accountant,
            insecure_seed=None if grid.insecure_seed is None else grid.insecure_seed + r,
            eval_every=max(1, algo.num_steps() // grid.curve_points),
        )
        row = {"setting": setting, "method": method, "algorithm": algo.name, "epsilon": eps, "delta": grid.delta}
        row.update(run=r, step_size=step, gap=res["gap"], wall_s=res["wall_s"], passes=res["passes"])
        row.update(epsilon_spent=res["epsilon_spent"], noise_multipliers=dict(cal.noise), accountant=cal.accountant)
        row.update(f_star=f_star, n_train=n, l2=l2, hyperparameters=algo.hyperparameters(), curve=res["curve"])
        grid.write(row)
        rows.append(row)
    gaps = [r["gap"] for r in rows]
    grid.log(
        f"[{setting}] {method:10s} eps={eps:g} step={step:g}: gap {np.mean(gaps):.4g} "
        f"± {np.std(gaps):.2g}, wall {res['wall_s']:.2f}s, passes {res['passes']:.1f}, "
        f"eps spent {res['epsilon_spent']:.4f}, z={ {k: round(v, 4) for k, v in cal.noise.items()} }"
    )
    return rows


def _jsonl(fh):
    def write(row: dict) -> None:
        fh.write(json.dumps(row) + "\n")
        fh.flush()

    return write


def _run_setting(grid: _Grid, setting: str, spec: dict[str, Any], eps_list, meta: dict[str, Any]) -> list[dict]:
    """Every (epsilon, method, step size) of one setting; records its F* in ``meta``."""
    problem = LogisticERM(features=grid.x.numpy(), labels=grid.y.numpy(), l2=spec["l2"])
    meta[f"f_star_{setting}"] = f_star = _optimum(problem, setting, grid.log)
    rows = []
    for eps, (method, make, step) in itertools.product(eps_list, spec["methods"]):
        rows += _run_configuration(
            grid, setting=setting, l2=spec["l2"], problem=problem, f_star=f_star, eps=eps,
            method=method, make=make, step=step,
        )  # fmt: skip
    return rows


def _optimum(problem: LogisticERM, setting: str, log) -> float:
    """The reference optimum F* (scipy L-BFGS)."""
    t0 = time.perf_counter()
    with single_thread_blas():
        _, f_star = problem.solve()
    log(f"[{setting}] F* = {f_star:.10f} (L-BFGS, {time.perf_counter() - t0:.1f}s)")
    return f_star


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
        out_dir: output folder (created); progress: one line per finished configuration.
        seed: data shuffle seed (a public choice).
        accountant: ``"rdp"`` or ``"pld"`` (default: the budget's, quick ``"rdp"``, paper ``"pld"``).
        insecure_seed: seed the noise and sampling (run r uses ``insecure_seed + r``): reproducible
            but NOT private; default secret randomness.

    Returns:
        The rows written to ``results.jsonl``.
    """
    b, runs, accountant, eps_list = _check_options(budget, runs, accountant, epsilons, delta)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    feats, labels = load_covertype_binary(data_dir=data_dir, n_train=n_train, seed=seed)
    log = (lambda msg: print(msg, flush=True)) if progress else (lambda msg: None)
    meta: dict[str, Any] = {"n_train": feats.shape[0], "dim": int(feats.shape[1]), "delta": delta, "budget": budget}
    meta.update(runs=runs, positive_class=f"Cover_Type == {POSITIVE_COVER_TYPE} (Lodgepole Pine)")
    meta.update(positive_share=float((labels > 0).mean()), neighbouring=NEIGHBOURING, accountant=accountant)
    meta.update(randomness=randomness_section(insecure_seed=insecure_seed))
    x_t, y_t = torch.from_numpy(feats), torch.from_numpy(labels)
    with open(out / "results.jsonl", "w") as fh:
        grid = _Grid(x_t, y_t, delta, accountant, runs, b.curve_points, insecure_seed, write=_jsonl(fh), log=log)
        rows = [
            row for setting, spec in _settings(b).items() for row in _run_setting(grid, setting, spec, eps_list, meta)
        ]
    summary = summarize(rows)
    summary["meta"] = meta
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(summary_markdown(summary))
    plot_results(rows, summary, out)
    return rows


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
    parser.add_argument("--delta", type=float, default=1e-3, help="target δ of every run (default 1e-3, below 1/n)")
    parser.add_argument("--runs", type=int, default=None, help="runs per configuration (default: 3 quick, 10 paper)")
    parser.add_argument(
        "--budget", choices=sorted(BUDGETS), default="quick", help="quick: short CPU schedule; paper: the paper's"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="data shuffle seed (public)")
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
