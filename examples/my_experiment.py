"""A reproduction of your own, run by the privopt command like a built-in one.

Run (from the repository's root; a few seconds on 2 CPU cores, no files needed):

    privopt reproduce --plugin examples/my_experiment.py my-exp --epsilons 1,4 --out runs/my-exp

This file is a plugin (docs/api.md, "Extending privopt"): ``--plugin`` before the experiment's name
imports it, and ``register_experiment`` at its end makes ``my-exp`` a command (``privopt list
--plugin examples/my_experiment.py`` shows it). The module provides ``add_arguments(parser)``, the
command's options, and ``main(args) -> int``, the reproduction: ``args`` holds the options and
``args.plugin``, the plugins the command was given, for the summary to state whose code ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import privopt
from privopt.cliargs import add_run_outputs, float_list
from privopt.experiments import register_experiment


def add_arguments(parser) -> None:
    parser.add_argument("--epsilons", type=float_list, default=[1.0, 4.0], help="comma-separated ε (default 1,4)")
    add_run_outputs(parser, out_help="output directory (new): one run folder per ε and summary.json")


def main(args) -> int:
    out, rows = Path(args.out), []
    for eps in args.epsilons:
        record = privopt.fit(
            model="logreg", dataset="digits", epsilon=eps, delta=1e-5, epochs=1, batch_size=128, lr=0.5,
            out_dir=out / f"eps{eps:g}", insecure_seed=args.insecure_seed, progress=False,
        )  # fmt: skip
        priv = record["privacy"]
        rows.append({"epsilon": priv["epsilon_guarantee"], "test_accuracy": record["metrics"]["test_accuracy"]})
    summary = {"rows": rows, "plugins": args.plugin, "insecure_seed": args.insecure_seed}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary))
    elif not args.quiet:
        for row in rows:
            print(f"eps={row['epsilon']:.3g}: test accuracy {row['test_accuracy']:.4f}")
        print(f"outputs in {out}")
    return 0


register_experiment("my-exp", __name__, "logistic regression on digits at each ε (examples/my_experiment.py)")
