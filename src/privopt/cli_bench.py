"""The ``privopt bench`` command: its options and what it runs (privopt.bench, privopt.bench_e2e)."""

from __future__ import annotations

import json

from privopt.bench_e2e import ACCOUNTING_CACHES
from privopt.cliargs import DEVICES, int_list, name_list, positive_float, positive_int

__all__ = ["add_bench_parser"]


def _cmd_bench(args) -> int:
    from privopt.bench import format_table, run_bench

    common = dict(
        models=tuple(args.models), repeats=args.repeats, threads=args.threads, progress=not (args.quiet or args.json)
    )
    if args.end_to_end:
        from privopt.bench_e2e import format_e2e, run_end_to_end

        rows = run_end_to_end(
            **common,
            methods=tuple(args.e2e_methods),
            batch_size=args.e2e_batch_size,
            epochs=args.epochs,
            spider_steps=args.spider_steps,
            dataset=args.dataset,
            data_dir=args.data_dir,
            accounting_cache=args.accounting_cache,
        )
        print(json.dumps(rows) if args.json else format_e2e(rows))
        return 0
    from privopt.bench import METHODS

    methods = METHODS if args.methods is None else tuple(args.methods)
    rows = run_bench(
        **common, batch_sizes=tuple(args.batch_sizes), device=args.device, methods=methods,
        memory=not args.no_memory, processes=args.processes, breakdown=args.breakdown,
    )  # fmt: skip
    if args.json:
        print(json.dumps(rows))
    elif args.breakdown:
        from privopt.bench_breakdown import format_breakdown

        print(format_table(rows) + "\n\n" + format_breakdown(rows))
    else:
        print(format_table(rows))
    return 0


def add_bench_parser(sub) -> None:
    """``privopt bench``: per-step timings, or whole runs with ``--end-to-end``."""
    b = sub.add_parser(
        "bench",
        help="time DP steps against a non-private step (and Opacus if installed)",
        description="Median time and peak memory of one optimiser step per method (non-private, DP-SGD with "
        "each gradient engine, the clipped-difference query, Opacus when installed), on the same model, batch "
        "and threads. Measured on this machine: run it on a quiet one.",
    )
    b.add_argument(
        "--models",
        type=name_list,
        default=["mlp", "cnn", "resnet20"],
        metavar="M1,M2",
        help="comma-separated benchmark models: mlp, cnn, resnet20 (tiny: a smoke test) (default mlp,cnn,resnet20)",
    )
    b.add_argument(
        "--batch-sizes",
        type=int_list,
        default=[128, 512],
        metavar="B1,B2",
        help="comma-separated batch sizes to time (default 128,512)",
    )
    b.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed rounds per (model, batch); the median is reported (default 5)",
    )
    b.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads for every method (default: torch's)"
    )
    b.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="time each (model, batch) in this many fresh processes, one after the other: the median of "
        "their ratios, with their range (a fresh process moves the ratios more than the repeats do) (default 1)",
    )
    b.add_argument("--device", choices=DEVICES, default="cpu", help="time the steps on cpu or cuda (default cpu)")
    b.add_argument(
        "--methods",
        type=name_list,
        default=None,
        metavar="M1,M2",
        help="comma-separated step methods to time (default all: nonprivate, dp-sgd, dp-sgd-vmap, "
        "clipped-difference, dp-sgd-secure, dp-sgd-sync, opacus-hooks, opacus-ghost, noise-only, "
        "noise-only-secure); nonprivate is always included",
    )
    _add_output_options(b)
    _add_end_to_end_options(
        b.add_argument_group("end-to-end mode (--end-to-end): whole training runs with a time breakdown")
    )
    b.set_defaults(func=_cmd_bench)


def _add_output_options(b) -> None:
    b.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory probe (one subprocess per row) to save time"
    )
    b.add_argument(
        "--breakdown",
        action="store_true",
        help="also time each step by component (forward, backward, the engine's per-layer work, norms, "
        "sums, noise, update; --repeats more rounds) and print where the time goes "
        "(--end-to-end always prints its own)",
    )
    b.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    b.add_argument("--quiet", action="store_true", help="no progress line per finished row")


def _add_end_to_end_options(e) -> None:
    e.add_argument(
        "--end-to-end",
        action="store_true",
        help="time whole `privopt train` runs (private vs non-private, interleaved, one subprocess each) "
        "instead of single steps; prints where the time went",
    )
    e.add_argument(
        "--e2e-methods",
        type=name_list,
        default=["dp-sgd", "dp-double-spider", "dp-recursive-spider"],
        metavar="A1,A2",
        help="comma-separated private algorithms to run end to end (default dp-sgd,dp-double-spider,"
        "dp-recursive-spider); each beside non-private sgd",
    )
    e.add_argument("--e2e-batch-size", type=positive_int, default=256, help="expected batch size (default 256)")
    e.add_argument("--epochs", type=positive_float, default=1.0, help="epochs of dp-sgd and sgd (default 1)")
    e.add_argument("--spider-steps", type=positive_int, default=64, help="steps of each DP SPIDER method (default 64)")
    e.add_argument("--dataset", default="mnist-st", help="registered dataset to train on (default mnist-st)")
    e.add_argument("--data-dir", default=None, help="data directory (default: $PRIVOPT_DATA)")
    e.add_argument(
        "--accounting-cache",
        choices=ACCOUNTING_CACHES,
        default="fresh",
        help="the runs' on-disk accounting cache: fresh (default; empty at start, so round 1 pays every "
        "calibration and later rounds reuse it, like a user's repeated run), off (every run computes "
        "everything), user (your own cache as it is)",
    )
