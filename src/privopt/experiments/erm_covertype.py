"""Paper B's Covertype experiment with tuned schedules: DP-SVRG, DP-SVRG++ and DP-AMD against DP-GD,
optimality gap versus passes and wall time (the paper's Figures 1–2 plus an ℓ1-constrained
comparison; ``docs/algorithms/erm.md``, "The Covertype comparison").

Protocol, for each setting (:mod:`~privopt.experiments.erm_covertype_protocol`) and epsilon:

1. **tune** every method on the held-out tuning set (rows disjoint from the training set, treated as
   public; :mod:`~privopt.experiments.erm_covertype_data`): each schedule of its grid (run length ×
   step size) is run ``tune_runs`` times with the noise calibrated for the training set's size,
   and the schedule with the smallest mean tuning-set gap is kept. The training set is not touched.
2. **run** the kept schedule ``runs`` times on the training set (fresh noise) and report its gap
   ``F(w) − F*`` on the training objective (``F*`` from a non-private solver: evaluation only).
3. where the paper prints a schedule, run it too, as a reference.

So every method is compared at a schedule chosen by the same rule, and a method whose gap is
limited by its iteration count rather than by its noise shows it: its chosen run length sits at
the edge of its grid ("interior: NO").

Outputs in ``out_dir``: ``results.jsonl`` (one row per run: ``phase`` tune / final / printed),
``summary.json``, ``summary.md`` and per setting ``fig{N}_{setting}.png`` (gap versus passes and
versus wall time for the tuned and printed schedules, and the tuning profiles).

Example (CLI):
    privopt reproduce erm-covertype --data-dir ../shared/data --budget quick --out runs/erm
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privopt.cliargs import add_run_outputs, float_list, non_negative_int, positive_int
from privopt.errors import ConfigError
from privopt.experiments.erm_covertype_data import POSITIVE_COVER_TYPE, load_covertype_binary, load_covertype_split
from privopt.experiments.erm_covertype_plots import plot_results
from privopt.experiments.erm_covertype_protocol import BUDGETS, L1_RADIUS, Budget, settings
from privopt.experiments.erm_covertype_report import summarize, summary_markdown
from privopt.experiments.erm_covertype_runner import NEIGHBOURING, Problem, Runner
from privopt.experiments.privacy_notes import ERM_TRAINING_MEASUREMENTS, ERM_TUNING_ROWS
from privopt.privacy.checks import check_delta_for_size
from privopt.training import randomness_section

__all__ = ["BUDGETS", "add_arguments", "load_covertype_binary", "main", "run_erm_covertype"]

SETTINGS = ("regularized", "unregularized", "l1-constrained")
# What every summary says its ε does not cover: training-row measurements, the tuning rows' role.
_NOTES = {"not_private": ERM_TRAINING_MEASUREMENTS, "hyperparameter_tuning": ERM_TUNING_ROWS}


def _new_out(out_dir) -> Path:
    out = Path(out_dir)
    if (out / "results.jsonl").exists():  # opening it would truncate an earlier reproduction's results
        raise ConfigError(f"{out} already holds a results.jsonl; choose a new --out directory")
    return out


_OVERRIDE = "allow_large_delta=True, CLI --allow-large-delta"


def _check_options(budget: str, runs, accountant, epsilons, chosen) -> tuple[Budget, int, str, list[float]]:
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
    unknown = sorted(set(chosen) - set(SETTINGS))
    if not chosen or unknown:
        raise ConfigError(f"settings must be a non-empty subset of {list(SETTINGS)}, got {list(chosen)}")
    return b, runs, accountant, eps_list


def _jsonl(fh):
    def write(row: dict) -> None:
        fh.write(json.dumps(row) + "\n")
        fh.flush()

    return write


def _run_setting(
    runner: Runner, setting, data, *, eps_list, budget: Budget, runs: int, meta: dict
) -> tuple[list, list]:
    """Tune, run and (where printed) reference-run every method of one setting at every epsilon."""
    (x_tr, y_tr), (x_tu, y_tu) = data
    train, tune = Problem.build(x_tr, y_tr, setting), Problem.build(x_tu, y_tu, setting)
    meta[f"f_star_{setting.name}"] = {
        name: {"f_star": p.f_star, "certificate": p.certificate, "solve_s": p.solve_s}
        for name, p in (("train", train), ("tune", tune))
    }
    runner.log(
        f"[{setting.name}] F* = {train.f_star:.10f} (training, NOT private; certificate {train.certificate:.2g}), "
        f"{tune.f_star:.10f} (tuning rows)"
    )
    rows, selections = [], []
    for eps in eps_list:
        for method in setting.methods:
            sel = runner.tune(setting, method, tune, epsilon=eps, runs=budget.tune_runs)
            selections.append(
                {
                    "setting": setting.name,
                    "method": method.label,
                    "epsilon": eps,
                    "schedule": sel.schedule,
                    "tuning_gap": sel.tuning_gap,
                    "interior": sel.interior,
                    "last_gain": sel.last_gain,
                    "profile": [list(p) for p in sel.profile],
                    "grid": sel.grid,
                }
            )
            rows += runner.final(setting, method, train, epsilon=eps, schedule=sel.schedule, runs=runs)
            if method.printed is not None:
                rows += runner.final(
                    setting, method, train, epsilon=eps, schedule=method.printed, runs=runs, phase="printed"
                )
    return rows, selections


def _meta(data, *, budget: str, b: Budget, runs: int, delta: float, accountant: str, insecure_seed) -> dict[str, Any]:
    (x, _), (x_tune, _) = data
    meta: dict[str, Any] = {"n_train": int(x.shape[0]), "n_tune": int(x_tune.shape[0]), "dim": int(x.shape[1])}
    meta.update(delta=delta, budget=budget, runs=runs, tune_runs=b.tune_runs, neighbouring=NEIGHBOURING)
    meta.update(delta_at_least_1_over_n=delta >= 1 / meta["n_train"])  # allowed explicitly: a weak guarantee
    # No statistic of the training rows (e.g. their positive share: times n, an exact class count).
    meta.update(accountant=accountant, l1_radius=L1_RADIUS)
    meta.update(positive_class=f"Cover_Type == {POSITIVE_COVER_TYPE} (Lodgepole Pine)")
    meta.update(randomness=randomness_section(insecure_seed=insecure_seed))
    return meta


def run_erm_covertype(
    *,
    data_dir,
    n_train: int = 10_000,
    n_tune: int = 10_000,
    epsilons: Sequence[float] = (0.2, 0.5, 1.0),
    delta: float = 1e-5,
    allow_large_delta: bool = False,
    runs: int | None = None,
    budget: str = "quick",
    out_dir,
    progress: bool = True,
    seed: int = 0,
    accountant: str | None = None,
    insecure_seed: int | None = None,
    only: Sequence[str] = SETTINGS,
) -> dict[str, Any]:
    """Run the comparison and write results, summary and figures; returns the summary.

    Args:
        data_dir: Covertype folder (``covtype*.data[.gz]``) or file.
        n_train, n_tune: training rows and disjoint tuning rows (keyed-hash order, ``seed`` as key).
        epsilons, delta: privacy targets; δ < 1/n_train unless ``allow_large_delta`` (the paper's 1e-3 is not).
        runs: final runs per (setting, method, epsilon); default from the budget (quick 3, paper 10).
        budget: ``"quick"`` or ``"paper"`` (:data:`BUDGETS`: runs, tuning runs, accountant, grids).
        out_dir: a new output folder (not one with ``results.jsonl``); progress: a line per tuned method/final run.
        seed, accountant: data selection key (public); ``"rdp"`` or ``"pld"`` (default: the budget's).
        insecure_seed: seed the noise and sampling (reproducible but NOT private); default secret.
        only: the settings to run (default all three).
    """
    b, runs, accountant, eps_list = _check_options(budget, runs, accountant, epsilons, only)
    delta = check_delta_for_size(delta, dataset_size=n_train, allow_large=allow_large_delta, override=_OVERRIDE)
    out = _new_out(out_dir)
    data = load_covertype_split(data_dir=data_dir, n_train=n_train, n_tune=n_tune, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    log = (lambda msg: print(msg, flush=True)) if progress else (lambda msg: None)
    meta = _meta(data, budget=budget, b=b, runs=runs, delta=delta, accountant=accountant, insecure_seed=insecure_seed)
    specs = {name: s for name, s in settings(b).items() if name in only}
    rows, selections = [], []
    t0, cpu0, load0 = time.perf_counter(), time.process_time(), list(os.getloadavg())  # the machine is shared
    with open(out / "results.jsonl", "w") as fh:
        runner = Runner(
            delta=delta,
            accountant=accountant,
            insecure_seed=insecure_seed,
            curve_points=b.curve_points,
            write=_jsonl(fh),
            log=log,
        )
        for setting in specs.values():
            r, s = _run_setting(runner, setting, data, eps_list=eps_list, budget=b, runs=runs, meta=meta)
            rows, selections = rows + r, selections + s
    meta.update(total_wall_s=time.perf_counter() - t0, total_cpu_s=time.process_time() - cpu0)
    meta.update(load_average_start=load0, load_average_end=list(os.getloadavg()))
    summary = summarize(rows, selections, {name: s.proposed for name, s in specs.items()})
    summary.update(meta=meta, selections=selections, **_NOTES)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(summary_markdown(summary))
    plot_results(summary, out, {name: s.figure for name, s in specs.items()})
    return summary


# ------------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``privopt reproduce erm-covertype``."""
    parser.add_argument("--data-dir", required=True, help="folder with covtype*.data[.gz] (UCI format)")
    parser.add_argument("--n-train", type=positive_int, default=10_000, help="training rows (default 10000)")
    parser.add_argument("--n-tune", type=positive_int, default=10_000, help="disjoint tuning rows (default 10000)")
    parser.add_argument(
        "--epsilons", type=float_list, default=[0.2, 0.5, 1.0], help="comma-separated ε (default 0.2,0.5,1)"
    )
    parser.add_argument(
        "--delta", type=float, default=1e-5, help="target δ of every run (default 1e-5; must be below 1/n-train)"
    )
    parser.add_argument(
        "--allow-large-delta",
        action="store_true",
        help="accept δ >= 1/n-train, e.g. the paper's δ = 1e-3 (a weak guarantee: see docs/accounting.md)",
    )
    parser.add_argument(
        "--runs", type=positive_int, default=None, help="final runs per method and ε (default: the budget's)"
    )
    parser.add_argument(
        "--budget",
        choices=sorted(BUDGETS),
        default="quick",
        help="quick: short CPU schedule; paper: the paper's (default quick)",
    )
    parser.add_argument(
        "--settings", default=",".join(SETTINGS), help=f"comma-separated subset of {','.join(SETTINGS)} (default all)"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="data selection key (public)")
    parser.add_argument("--accountant", choices=("rdp", "pld"), default=None, help="default: the budget's")
    add_run_outputs(parser, out_help="output folder (new, or without a results.jsonl)")


def main(args: argparse.Namespace) -> int:
    """Entry point for the parsed arguments; prints the Markdown summary (or JSON with --json)."""
    summary = run_erm_covertype(
        data_dir=args.data_dir,
        n_train=args.n_train,
        n_tune=args.n_tune,
        epsilons=args.epsilons,
        delta=args.delta,
        allow_large_delta=args.allow_large_delta,
        runs=args.runs,
        budget=args.budget,
        out_dir=args.out,
        progress=not (args.json or args.quiet),
        seed=args.seed,
        accountant=args.accountant,
        insecure_seed=args.insecure_seed,
        only=[s.strip() for s in args.settings.split(",") if s.strip()],
    )
    if args.json:
        for e in summary["methods"] + summary["printed"]:
            e.pop("curve", None)
        summary.pop("selections")
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        print((Path(args.out) / "summary.md").read_text())
    return 0


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    raise SystemExit(main(p.parse_args()))
