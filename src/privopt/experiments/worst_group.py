"""``privopt reproduce worst-group``: Paper D's algorithms on real group data, against DP-SGD, the
DP DRO methods of Paper A and non-private group DRO (the first experiments with these algorithms).

The code is split by responsibility:

* :mod:`privopt.experiments.worst_group_protocol` — datasets, methods, schedules, tuning grids;
* :mod:`privopt.experiments.worst_group_runner` — one run, the tuning search, the final grid;
* :mod:`privopt.experiments.worst_group_rates` — the excess-risk rate of Minimax Phased ERM in K;
* :mod:`privopt.experiments.worst_group_report` — tables, verdict and figures.
* :mod:`privopt.experiments.worst_group_reference` — non-private ERM / minimax ceiling (``--minimax-reference``).

Outputs in ``--out``: ``results.jsonl`` (one row per (method, ε, seed) with ``dataset, method,
epsilon, epsilon_spent, seed, worst_group_accuracy, average_accuracy, worst_group_loss,
per_group, wall_s``), ``tuning.json``, ``summary.json``, ``summary.md``,
``worst_group_vs_epsilon.png`` and, on ``synthetic``, ``rates.json`` and ``excess_risk_vs_K.png``.
Protocol and results: ``docs/algorithms/worst_group.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from privopt.checkpoint import atomic_write_json
from privopt.cliargs import add_run_outputs, float_list, positive_int
from privopt.errors import ConfigError
from privopt.experiments.jobs import Workers, single_threaded
from privopt.experiments.privacy_notes import hyperparameter_note, notes_markdown
from privopt.experiments.worst_group_protocol import (
    BASELINES,
    DATASETS,
    EPSILONS,
    NO_BUDGET,
    PAPER_D,
    load_group_dataset,
    schedule_summary,
)
from privopt.experiments.worst_group_report import (
    per_group_table,
    plot_rates,
    plot_vs_epsilon,
    rates_lines,
    results_table,
    summarize,
    verdict,
    verdict_markdown,
)
from privopt.experiments.worst_group_runner import Spec, final_runs, tune

__all__ = ["add_arguments", "main", "run_worst_group"]


def _checked(dataset, epsilons, seeds, methods, out_dir) -> tuple[list[float], list[str], Path]:
    if dataset not in DATASETS:
        raise ConfigError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    eps = [float(e) for e in epsilons]
    if not eps or any(not (e > 0 and e < float("inf")) for e in eps):
        raise ConfigError(f"epsilons must be finite numbers > 0, got {list(epsilons)!r}")
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ConfigError(f"seeds must be a positive integer, got {seeds!r}")
    unknown = [m for m in methods if m not in PAPER_D + BASELINES]
    if unknown:  # each method has its own tuning grid and settings: another registered algorithm has none
        raise ConfigError(
            f"unknown method(s) {unknown}; worst-group runs only its protocol's: {', '.join(PAPER_D + BASELINES)}"
        )
    out = Path(out_dir)
    if (out / "results.jsonl").exists():
        raise ConfigError(f"{out} already holds a results.jsonl; choose a new --out directory")
    return eps, list(methods), out


@single_threaded  # many small sequential runs: one intra-op thread (see privopt.experiments.jobs.single_threaded)
def run_worst_group(
    *,
    dataset: str,
    epsilons=EPSILONS,
    seeds: int = 3,
    out_dir,
    data_dir=None,
    methods=PAPER_D + BASELINES,
    tune_grid: bool = True,
    rates: bool = True,
    rate_seeds: int = 8,
    reference: bool = False,
    insecure_seed: int | None = None,
    log=print,
    jobs: int = 1,
) -> dict[str, Any]:
    """Run the reproduction on ``dataset``; returns the summary (also written to ``out_dir``).
    ``jobs``: runs at a time in worker processes (:class:`~privopt.experiments.jobs.Workers`)."""
    (eps, methods, out), workers = _checked(dataset, epsilons, seeds, methods, out_dir), Workers(jobs)
    load_group_dataset(dataset, data_dir=data_dir, seed=0)  # fail on missing files before anything is written
    out.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    spec = Spec(dataset, data_dir=data_dir, insecure_seed=insecure_seed)
    best, tuning, rows = _tune_and_run(
        methods, spec, eps=eps, seeds=seeds, out=out, tune=tune_grid, log=log, workers=workers
    )
    summary = summarize(rows)
    names = load_group_dataset(dataset, data_dir=data_dir, seed=0).group_names
    result = {
        "dataset": dataset, "epsilons": eps, "seeds": seeds, "methods": methods,
        "schedule": schedule_summary(dataset), "hyperparameters": best, "summary": summary, "verdict": verdict(summary),
        "randomness": "secret (OS entropy)" if insecure_seed is None else f"seeded, INSECURE ({insecure_seed} + seed)",
        "jobs": workers.jobs, "hyperparameter_tuning": hyperparameter_note(tuning), "tuned": bool(tuning["tuned"]),
    }  # fmt: skip
    if rates and dataset == "synthetic":
        from privopt.experiments.worst_group_rates import run_rates

        result["rates"] = run_rates(seeds=rate_seeds, insecure_seed=insecure_seed, log=log)
        atomic_write_json(out / "rates.json", result["rates"])
        plot_rates(result["rates"], out / "excess_risk_vs_K.png")
    if reference:
        from privopt.experiments.worst_group_reference import minimax_reference

        log("non-private ERM and worst-group minimax references (seed-0 split)")
        result["minimax_reference"] = minimax_reference(load_group_dataset(dataset, data_dir=data_dir, seed=0))
    plot_vs_epsilon(summary, out / "worst_group_vs_epsilon.png", title=f"{dataset}: worst-group accuracy vs ε")
    result["timing"] = {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "load_average": list(os.getloadavg()),
        "tuning_wall_s": tuning.get("wall_s"),
    }
    result["markdown"] = _markdown(result, rows, names)
    atomic_write_json(out / "summary.json", {k: v for k, v in result.items() if k != "markdown"})
    (out / "summary.md").write_text(result["markdown"] + "\n")
    return result


def _tune_and_run(methods, spec: Spec, *, eps, seeds: int, out: Path, tune: bool, log, workers):
    """(best point per method, tuning report, final rows); the rows and the report say how the
    hyper-parameters were chosen when that read the training data (not accounted)."""
    with workers:  # one pool for tuning and the final runs
        best, tuning = _hyperparameters(methods, spec, tune_grid=tune, log=log, workers=workers)
        atomic_write_json(out / "tuning.json", tuning)
        spec = replace(spec, tuning_note=hyperparameter_note(tuning))
        rows = final_runs(methods, spec, best=best, epsilons=eps, seeds=seeds, out=out, log=log, workers=workers)
    return best, tuning, rows


def _hyperparameters(methods, spec: Spec, *, tune_grid: bool, log, workers) -> tuple[dict, dict]:
    """Each method's hyper-parameters: tuned on a validation split, or the middle of its grid."""
    if tune_grid:
        log(f"tuning {len(methods)} methods on a validation split (6 grid points each)")
        return tune(methods, spec, log=log, workers=workers)
    from privopt.experiments.worst_group_protocol import grid

    return {m: grid(m)[len(grid(m)) // 2] for m in methods}, {"tuned": False}


def _markdown(result: dict, rows, names) -> str:
    eps = result["epsilons"]
    parts = [
        f"# Worst-group reproduction: {result['dataset']}",
        f"Worst-group test accuracy, mean ± std over {result['seeds']} seeds (average accuracy in brackets); "
        + (
            "hyper-parameters tuned on a validation split."
            if result["tuned"]
            else "NOT tuned (--no-tune): each "
            "method at the middle point of its grid, so methods are not compared at their best."
        ),
        _schedule_line(result["schedule"]),
        notes_markdown(result),
        results_table(result["summary"], eps),
        f"\nPer-group test accuracy at ε = {eps[len(eps) // 2]:g} (mean over seeds):",
        per_group_table(rows, epsilon=eps[len(eps) // 2], group_names=names),
        "\nBest Paper D method against DP-SGD: worst-group test accuracy (average accuracy), the difference of the "
        "means and its Welch 95 % interval over the seeds (docs/RESULTS.md, 'How methods are compared over seeds'):",
        "\n" + verdict_markdown(result["verdict"]),
    ]
    if "rates" in result:
        parts.extend(rates_lines(result["rates"]))
    if "minimax_reference" in result:
        ref = result["minimax_reference"]
        parts.append("\nNon-private references (seed-0 split, test worst-group / average accuracy):")
        for k, label in (("erm", "ERM"), ("minimax", "worst-group minimax (certified)")):
            parts.append(f"- {label}: {ref[k]['worst_group_accuracy']:.4f} / {ref[k]['average_accuracy']:.4f}")
    t = result["timing"]
    parts.append(f"\nwall {t['wall_s']:.0f} s, CPU {t['cpu_s']:.0f} s, load average {t['load_average']}")
    return "\n".join(parts)


def _schedule_line(s: dict) -> str:
    return (
        f"Schedule of every method: {s['epochs']:g} epochs, DP-SGD batch {s['batch']}, Noisy-SGD-MGR/AGS batch "
        f"{s['group_batch']}, DP-OCO {s['oco_batch']} records per round ({s['note']})."
    )


class _NoBudget(argparse.Action):
    """``--budget``, which the other reproductions take: a usage error that says why this one has none."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(NO_BUDGET)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = NO_BUDGET + "."
    parser.add_argument("--budget", action=_NoBudget, help=argparse.SUPPRESS)
    parser.add_argument(
        "--dataset", required=True, choices=sorted(DATASETS),
        help="group data: adult (sex x race), celeba (Blond_Hair x Male) or synthetic (p-group mixture)",
    )  # fmt: skip
    parser.add_argument(
        "--epsilons", type=float_list, default=list(EPSILONS), help="comma-separated ε (default 0.5,1,2,5)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="runs per (method, ε) (default 3)")
    parser.add_argument("--data-dir", help="folder with adult/ and celeba/ (default $PRIVOPT_DATA)")
    parser.add_argument("--methods", help="comma-separated algorithm names (default: Paper D's four + baselines)")
    parser.add_argument("--no-tune", action="store_true", help="skip tuning (the middle grid point)")
    parser.add_argument("--no-rates", action="store_true", help="synthetic: skip the excess-risk-vs-K sweep")
    parser.add_argument(
        "--rate-seeds",
        type=positive_int,
        default=8,
        help="synthetic: runs per (ε, K) of the excess-risk-vs-K sweep (default 8)",
    )
    parser.add_argument(
        "--minimax-reference", action="store_true",
        help="also fit non-private ERM and the exact worst-group minimax point (the ceiling of reweighting)",
    )  # fmt: skip
    add_run_outputs(parser, jobs=True)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``privopt reproduce worst-group``."""
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else list(PAPER_D + BASELINES)
    quiet = args.quiet or args.json
    res = run_worst_group(
        dataset=args.dataset,
        epsilons=args.epsilons,
        seeds=args.seeds,
        out_dir=args.out,
        data_dir=args.data_dir,
        methods=methods,
        tune_grid=not args.no_tune,
        rates=not args.no_rates,
        rate_seeds=args.rate_seeds,
        reference=args.minimax_reference,
        insecure_seed=args.insecure_seed,
        log=(lambda s: None) if quiet else (lambda s: print(s, flush=True)),
        jobs=args.jobs,
    )
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if k != "markdown"}, default=str))
    elif not args.quiet:
        print("\n" + res["markdown"])
        print(f"outputs in {args.out}")
    return 0
