"""``privopt demo``: the DP DRO methods of Paper A on embedded data (no files needed).

Runs DP-SGDA, PrivateDiff, DP Double-SPIDER and DP Recursive-SPIDER at ε ∈ {0.5, 1, 5, 10}
(δ = n^{−1.1}) plus the non-private SCDRO reference on ``digits-st`` (scikit-learn's 8×8 digits,
0–4 vs 5–9, positives subsampled to 10 % of the training split, balanced test split), through the
same harness as ``privopt reproduce dro-table3``. Prints a table laid out like Paper A's Table 3,
a per-run table with the ε actually spent (from the privacy ledger, not the target), the final
full-training-set gradient norm ``‖∇ₓΨ_KL‖`` and a membership-attack AUC beside its DP cap, and
writes a gradient-norm plot. Fixed hyper-parameters (no tuning) keep it under 3 minutes on 2 cores.
The methods: ``docs/algorithms/dro.md``.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from privopt.checkpoint import atomic_write_text

__all__ = ["DEMO_HYPERPARAMETERS", "format_runs_table", "run_demo"]

EPSILONS = (0.5, 1.0, 5.0, 10.0)
# Per-method (lr on x, per-sample clip threshold): the winners at ε = 1 of
# `privopt reproduce dro-table3 --dataset digits-st --budget quick --seeds 1` (same 3×2 grid for
# every method, balanced validation accuracy); fixed here so the demo needs no tuning. SCDRO has
# no clipping (its clip is unused).
DEMO_HYPERPARAMETERS = {
    # DP-SGDA / DP Recursive-SPIDER re-picked on digits-st's VALIDATION split (val_fraction 0.2, seed 0,
    # ε = 1, 10 epochs, lr ∈ {0.05, 0.2, 0.5, 2} × clip ∈ {0.1, 1}): DP-SGDA lr 2 / clip 1 scored 0.69
    # balanced val. accuracy (every other point ≤ 0.50; the old lr 0.1 gave a constant predictor);
    # Recursive-SPIDER's best was lr 0.2 / clip 0.1 at 0.50 (the rest 0.43–0.50) — its 23 iterations
    # at this budget are too few to learn, so treat its demo number as chance level.
    "dp-sgda": {"lr": 2.0, "clip": 1.0},
    "private-diff": {"lr": 2.0, "clip": 1.0},
    "dp-double-spider": {"lr": 2.0, "clip": 1.0},
    "dp-recursive-spider": {"lr": 0.2, "clip": 0.1},
    # SCDRO: lr 0.1 with its new defaults (q = 4, λ step 0.01): 62.9 % on digits-st vs 64.0 % for
    # ERM on the same schedule (lr 0.5 diverges to a constant predictor, 50.6 %).
    "scdro": {"lr": 0.1, "clip": 1.0},
}


def _demo_budget(quick: bool):
    from privopt.experiments.dro import BUDGETS

    return replace(
        BUDGETS["quick"],
        name="demo-quick" if quick else "demo",
        epochs=1 if quick else 10,
        eval_points=3 if quick else 8,
    )


def format_runs_table(rows: list[dict[str, Any]]) -> str:
    """One line per run: method, target / spent ε, test metrics, gradient norm, MIA AUC and cap."""
    head = (
        "| method | ε target | ε spent | δ | test acc | test AUC | test F1 | ‖∇ₓΨ_KL‖ | MIA AUC | DP cap | wall s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]

    def f(x, spec):
        return "–" if x is None else format(x, spec)

    for r in rows:
        lines.append(
            f"| {r['label']} | {f(r['epsilon'], 'g')} | {f(r['epsilon_spent'], '.3f')} | {f(r['delta'], '.1e')} "
            f"| {f(r['test_accuracy'], '.4f')} | {f(r['test_auc'], '.4f')} | {f(r['test_f1'], '.4f')} "
            f"| {f(r['grad_norm'], '.3g')} | {f(r['mia_auc'], '.3f')} | {f(r['mia_bound'], '.3f')} "
            f"| {f(r['wall_s'], '.1f')} |"
        )
    return "\n".join(lines)


def run_demo(
    *, out_dir: str | Path = "runs/demo", progress: bool = True, quick: bool = False, insecure_seed: int | None = None
) -> list[dict]:
    """Run the demo and print its tables; returns one result row per run.

    Args:
        out_dir: parent folder; each call writes a new time-stamped sub-folder.
        progress: per-run progress bars (the per-run log lines are always printed).
        quick: one ε (1.0) and one epoch — a smoke test.
        insecure_seed: ``None`` (default: secret noise and sampling) or a seed that makes the demo
            repeatable — NOT private (recorded in its outputs).
    """
    from privopt.experiments.dro import TABLE3_METHODS, run_dro_table3

    root = Path(out_dir) / time.strftime("%Y%m%d-%H%M%S")
    t0 = time.perf_counter()
    print(f"privopt demo — Paper A's DP DRO methods on digits-st (embedded); outputs in {root}", flush=True)
    res = run_dro_table3(
        dataset="digits-st",
        epsilons=(1.0,) if quick else EPSILONS,
        seeds=1,
        budget=_demo_budget(quick),
        methods=TABLE3_METHODS,
        out_dir=root,
        progress=progress,
        tune=False,
        hyperparameters=DEMO_HYPERPARAMETERS,
        insecure_seed=insecure_seed,
    )
    rows = [{k: v for k, v in r.items() if k != "history"} for r in res["rows"]]
    runs = format_runs_table(rows)
    atomic_write_text(root / "runs.md", runs + "\n")
    print("\nTest accuracy (%), laid out like Paper A's Table 3:\n")
    print(res["table"])
    print("\nEvery run (ε spent is read from the privacy ledger):\n")
    print(runs)
    figs = [f for f in res["summary"]["figures"] if f.startswith("fig1_gradnorm")]
    print(f"\ngradient-norm plots: {', '.join(str(root / f) for f in figs)}")
    if res["mia_violations"]:
        print(f"WARNING: {len(res['mia_violations'])} DP run(s) exceed the membership-inference cap (privacy bug)")
    print(f"total wall time {time.perf_counter() - t0:.0f} s")
    return rows


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run_demo(), indent=2, default=str))
