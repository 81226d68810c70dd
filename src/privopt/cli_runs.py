"""The ``privopt runs`` command: the runs of a sweep side by side (:func:`privopt.api.compare_runs`).

One row per run folder: algorithm, model, dataset, ε (the guarantee; ``*`` marks a run seeded by
``--insecure-seed``), δ, status (the run's now: a killed run whose record says running is
``interrupted``, :mod:`privopt.api.run_status`), the hyper-parameters that differ between the runs,
the test metrics, the wall time; then how to resume each paused or interrupted run. Reads ONLY each
run's public ``record.json`` (and a record not final, its folder's lock file): never
``checkpoint.pt`` (SECRET) nor ``diagnostics.NOT_PRIVATE.json``. ``--csv``/``--markdown``/``--plot``
files are written atomically and an existing file is never replaced (as ``privopt predict --out``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from privopt.errors import PrivoptError

__all__ = ["add_runs_parser"]

_FILES = (("csv", "--csv"), ("markdown", "--markdown"), ("plot", "--plot"))


def _outputs(args) -> dict[str, Path]:
    """The files to write, checked before any record is read: new, and not one file twice."""
    outs = {key: Path(getattr(args, key)) for key, _ in _FILES if getattr(args, key) is not None}
    for key, flag in _FILES:
        if key in outs and outs[key].exists():
            raise PrivoptError(f"{flag} {outs[key]} exists; give a new file name (an earlier output is never replaced)")
    if len({p.resolve() for p in outs.values()}) < len(outs):
        raise PrivoptError("--csv, --markdown and --plot must name different files")
    if "plot" in outs and outs["plot"].suffix.lower() != ".png":
        raise PrivoptError(f"--plot {outs['plot']}: give a .png file name")
    return outs


def _cmd_runs(args) -> int:
    from privopt.api.run_table import compare_runs
    from privopt.checkpoint import atomic_write_text

    outs = _outputs(args)
    table = compare_runs(args.paths, sort=args.sort, reverse=args.reverse, metric=args.metric)
    for path, why in table.unreadable.items():
        print(f"privopt: skipped unreadable record {path}: {why}", file=sys.stderr)
    if table.skipped:
        folders = "folder" if len(table.skipped) == 1 else "folders"
        print(f"privopt: skipped {len(table.skipped)} {folders} without a record.json", file=sys.stderr)
    left_out = 0
    if "plot" in outs:  # first: it is the one that can refuse (nothing to plot) before any file is written
        left_out = table.plot(outs["plot"], metric=args.metric or "test_accuracy")
    if "csv" in outs:
        atomic_write_text(outs["csv"], table.csv())
    if "markdown" in outs:
        atomic_write_text(outs["markdown"], table.markdown())
    if left_out:
        print(f"privopt: the plot leaves out {left_out} run(s) without an epsilon or the metric", file=sys.stderr)
    if args.json:
        print(json.dumps(table.rows, default=str))
    else:
        sys.stdout.write(table.text())
    return 0


def add_runs_parser(sub) -> None:
    r = sub.add_parser(
        "runs",
        help="the runs of a sweep side by side: one row per run folder (docs/api.md, 'Comparing runs')",
        description="Tabulate the record.json of run folders (privopt train --out), given directly or found one "
        "or two levels down the folders given: algorithm, model, dataset, epsilon (* seeded by --insecure-seed: "
        "NOT private), delta, status, the hyper-parameters that differ between the runs, the test metrics and "
        "the wall time; then how to resume each paused or interrupted run. The status is the run's now: a run "
        "whose record says running but whose process is gone (killed, out of memory, a reboot) is shown "
        "interrupted, one this machine cannot check (run on another host) unknown. Reads only the public "
        "record.json of each run, and for a record not final its folder's lock file (never checkpoint.pt or "
        "diagnostics.NOT_PRIVATE.json); writes nothing but the files asked for.",
    )
    r.add_argument("paths", nargs="+", metavar="DIR", help="run folders, or folders holding run folders")
    r.add_argument("--sort", metavar="KEY", help="order the rows by this column, e.g. epsilon (default: as found)")
    r.add_argument("--reverse", action="store_true", help="with --sort: descending")
    r.add_argument(
        "--metric",
        metavar="NAME",
        help="a test metric of the records to show too and to plot, e.g. test_roc_auc (default: test_accuracy)",
    )
    r.add_argument("--csv", metavar="FILE", help="also write the table as CSV (an existing file is refused)")
    r.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown (an existing file is refused)")
    r.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also plot the metric against epsilon (log scale), one line per algorithm (an existing file is refused)",
    )
    r.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of the table")
    r.set_defaults(func=_cmd_runs)
