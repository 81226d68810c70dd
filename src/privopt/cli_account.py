"""``privopt account``: DP-SGD's noise multiplier for a target (epsilon, delta), or the epsilon of a
noise multiplier; comma-separated values sweep every combination into a table (docs/accounting.md)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from privopt.errors import ConfigError

__all__ = ["add_account_parser"]


def _epochs(epochs: float) -> str:
    return f"{epochs:g} epoch{'' if epochs == 1 else 's'}"


def _number(item: str, option: str) -> float:
    try:
        value = float(item)
    except ValueError:
        raise ConfigError(f"{option}: {item!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{option}: {item!r} is not finite")
    if value <= 0:
        raise ConfigError(f"{option}: {item!r} is not > 0")
    return value


def _size(item: str, option: str) -> int:
    try:
        value = int(item)
    except ValueError:
        raise ConfigError(f"{option}: {item!r} is not an integer") from None
    if value < 1:
        raise ConfigError(f"{option}: {item!r} is not >= 1")
    return value


def _values(text: str, option: str, parse) -> list:
    """Each comma-separated item of ``text``, parsed; a bad one is named with its option."""
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        raise ConfigError(f"{option}: empty item in {text!r} (use comma-separated values, e.g. 1,2,4)")
    return [parse(t, option) for t in items]


def _plan(args) -> dict:
    """Every value of the command, validated (before anything is accounted); the keyword
    arguments of :func:`~privopt.privacy.dp_sgd_sweep`."""
    from privopt.privacy import MAX_SWEEP_ROWS, check_delta_for_size

    n = _size(str(args.dataset_size), "--dataset-size")
    if not 0 < args.delta < 1:  # also nan
        raise ConfigError(f"--delta: '{args.delta:g}' is not in (0, 1)")
    check_delta_for_size(args.delta, dataset_size=n, allow_large=args.allow_large_delta, override="--allow-large-delta")
    sizes = _values(args.batch_size, "--batch-size", _size)
    for b in sizes:
        if b > n:
            raise ConfigError(f"--batch-size: '{b}' exceeds --dataset-size {n}")
    length = "--steps" if args.steps is not None else "--epochs"
    lengths = _values(args.steps, length, _size) if args.steps is not None else _values(args.epochs, length, _number)
    target = "--epsilon" if args.epsilon is not None else "--noise-multiplier"
    targets = _values(args.epsilon if args.epsilon is not None else args.noise_multiplier, target, _number)
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise ConfigError(f"--time-limit: '{args.time_limit:g}' is not > 0")
    total = len(sizes) * len(lengths) * len(targets)
    if total > MAX_SWEEP_ROWS:
        raise ConfigError(
            f"--batch-size, {length} and {target} give {len(sizes)} x {len(lengths)} x {len(targets)} = {total} "
            f"combinations; at most {MAX_SWEEP_ROWS} per command (split the sweep)"
        )
    _check_plot(args.plot)
    return {
        "dataset_size": n,
        "batch_sizes": sizes,
        "delta": args.delta,
        ("steps" if args.steps is not None else "epochs"): lengths,
        ("epsilons" if args.epsilon is not None else "noise_multipliers"): targets,
        "accountant": args.accountant,
        "sampling": args.sampling,
        "time_limit": args.time_limit,
    }


def _check_plot(path: str | None) -> None:
    if path is None:
        return
    if Path(path).suffix.lower() != ".png":
        raise ConfigError(f"--plot: {path!r} is not a .png file")
    parent = Path(path).parent
    if not parent.is_dir():
        raise ConfigError(f"--plot: the folder {str(parent)!r} of {path!r} does not exist")
    if Path(path).is_dir():
        raise ConfigError(f"--plot: {path!r} is a folder")


def _json(value) -> str:
    """Strict JSON: an infinite epsilon (no finite epsilon reaches delta) is null."""

    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    rows = value if isinstance(value, list) else [value]
    out = [{k: finite(v) for k, v in r.items()} for r in rows]
    return json.dumps(out if isinstance(value, list) else out[0], allow_nan=False)


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4f}" if 1e-3 <= abs(x) < 1e5 else f"{x:.4g}"


def _duration(seconds: float) -> str:
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3570 else f"{seconds / 3600:.1f} h"


def _pace(i: int, total: int, elapsed: float) -> str:
    """The time so far and, from the mean row so far, the time left (a sweep's rows can take
    seconds each: a 200-row PLD calibration sweep took 3.8 min on the shared 2-core machine)."""
    if i + 1 == total:
        return f"({_duration(elapsed)} in all)"
    return f"({_duration(elapsed)} so far, about {_duration(elapsed / (i + 1) * (total - i - 1))} left)"


def _row_line(i: int, total: int, row: dict, seconds: float, elapsed: float) -> str:
    """The progress line of a sweep's row (on stderr)."""
    length = f"{row['steps']} steps" + (f" ({_epochs(row['epochs'])})" if "epochs" in row else "")
    head = f"row {i + 1}/{total}: B={row['batch_size']}, {length}"
    if "epsilon_target" in row:
        got = f"target epsilon {row['epsilon_target']:g} -> z = {_fmt(row['noise_multiplier'])}"
        got += f" (epsilon {_fmt(row['epsilon'])}, {row['accountant']})"
    else:
        got = f"z = {row['noise_multiplier']:g} -> epsilon = {_fmt(row['epsilon'])} ({row['accountant']})"
    return f"{head}, {got}, {seconds:.1f} s {_pace(i, total, elapsed)}"


_now = time.monotonic  # the clock of the row lines (a test sets it)


def _cmd_account(args) -> int:
    from privopt.privacy import dp_sgd_sweep
    from privopt.privacy.search import ProgressLine

    plan = _plan(args)
    single = all(len(v) == 1 for v in plan.values() if isinstance(v, list))
    # On stderr: stdout holds the result. A sweep's rows are its progress in a log; a terminal also
    # shows each calibration's live line.
    progress = ProgressLine(sys.stderr, quiet=args.quiet or (not single and not sys.stderr.isatty()))
    start = _now()
    clock = [start]

    def on_row(i: int, total: int, row: dict) -> None:
        progress.finish()
        now = _now()
        if not single and not args.quiet:
            print(_row_line(i, total, row, now - clock[0], now - start), file=sys.stderr, flush=True)
        clock[0] = now

    rows = dp_sgd_sweep(**plan, progress=progress, on_row=on_row)
    if args.plot is not None:
        _plot(args.plot, rows, delta=args.delta)
    if single:
        row = {k: v for k, v in rows[0].items() if k not in ("dataset_size", "batch_size")}
        if args.json:
            print(_json(row))
        else:
            _print_single(row, args)
    elif args.json:
        print(_json(rows))
    else:
        _print_table(rows, args)
    return 0


def _print_single(row: dict, args) -> None:
    z, eps = row["noise_multiplier"], row["epsilon"]
    length = f"{row['steps']} steps" + ("" if "epochs" not in row else f" = {_epochs(row['epochs'])}")
    where = (
        f"({row['accountant'].upper()}, {row['sampling']} sampling, q = {row['sampling_rate']:.4g}, "
        f"{length}, {row['neighbouring']} neighbours)"
    )
    if "epsilon_target" not in row:
        print(f"noise multiplier z = {z:g} gives epsilon = {_fmt(eps)} at delta = {args.delta} {where}")
        if not math.isfinite(eps):
            print(
                "note: no finite epsilon reaches this delta (PLD cannot certify one below ~1e-15; try --accountant rdp)"
            )
        return
    print(f"noise multiplier z = {z:.4f}  (std of noise on the clipped sum = z * C)")
    print(
        f"achieves epsilon = {eps:{'.4f' if eps >= 1e-3 else '.4g'}} <= {row['epsilon_target']} "
        f"at delta = {args.delta} {where}"
    )
    if not row["search_complete"]:
        note = "this noise is valid but may be larger than needed"
        print(f"note: the search hit --time-limit {args.time_limit:g} s; {note}")


def _print_table(rows: list[dict], args) -> None:
    calibrated = "epsilon_target" in rows[0]
    cols = ["n", "B", *(["epochs"] if args.epochs is not None else []), "steps", "q"]
    cols += [*(["target eps"] if calibrated else []), "z", "epsilon", "delta", "accountant"]
    lines = []
    for r in rows:
        z = _fmt(r["noise_multiplier"]) if calibrated else f"{r['noise_multiplier']:g}"
        z += "" if r.get("search_complete", True) else "*"
        cells = [str(r["dataset_size"]), str(r["batch_size"]), *([f"{r['epochs']:g}"] if "epochs" in r else [])]
        cells += [str(r["steps"]), f"{r['sampling_rate']:.4g}", *([f"{r['epsilon_target']:g}"] if calibrated else [])]
        lines.append([*cells, z, _fmt(r["epsilon"]), f"{r['delta']:g}", r["accountant"]])
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(cols)]
    for line in [cols, *lines]:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)).rstrip())
    if not all(r.get("search_complete", True) for r in rows):
        print(f"* the search hit --time-limit {args.time_limit:g} s: this noise is valid but may be larger than needed")
    what = "the smallest noise multiplier z whose epsilon is <= the target" if calibrated else "the epsilon of z"
    print(f"({what}; {rows[0]['sampling']} sampling, {rows[0]['neighbouring']} neighbours)")


def _plot(path: str, rows: list[dict], *, delta: float) -> None:
    """z against the target epsilon (calibration), or epsilon against the length (accounting): one
    line per batch size (and per length, or noise multiplier, when several are swept)."""
    from privopt.plots import plot_series

    calibrated = "epsilon_target" in rows[0]
    length = "epochs" if "epochs" in rows[0] else "steps"
    x_key, y_key, other = (
        ("epsilon_target", "noise_multiplier", length) if calibrated else (length, "epsilon", "noise_multiplier")
    )
    several = len({r[other] for r in rows}) > 1
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        label = f"B={r['batch_size']}"
        if several:
            label += f", {r[other]:g} {length}" if calibrated else f", z={r[other]:g}"
        xs, ys = series.setdefault(label, ([], []))
        xs.append(r[x_key])
        ys.append(r[y_key])
    xs = [r[x_key] for r in rows]
    ys = [r[y_key] for r in rows if math.isfinite(r[y_key])]
    plot_series(
        Path(path),
        series,
        xlabel="target epsilon" if calibrated else length,
        ylabel="noise multiplier z" if calibrated else "epsilon",
        title=f"DP-SGD, n = {rows[0]['dataset_size']}, delta = {delta:g} ({rows[0]['sampling']} sampling)",
        logx=max(xs) >= 10 * min(xs),
        logy=bool(ys) and min(ys) > 0 and max(ys) >= 10 * min(ys),
        marker="o",
        plain_ticks=True,
    )


def add_account_parser(sub) -> None:
    """The ``account`` sub-command."""
    a = sub.add_parser(
        "account",
        help="calibrate DP-SGD noise for a target (epsilon, delta), or the epsilon of a noise multiplier",
        description="Smallest DP-SGD noise multiplier z such that T noisy sums of clipped gradients on "
        "sampled batches are (EPSILON, DELTA)-DP; or, with --noise-multiplier, the epsilon that z gives. "
        "Comma-separated values of --batch-size, --steps/--epochs and --epsilon/--noise-multiplier print one "
        "row per combination. See docs/accounting.md.",
    )
    a.add_argument("--dataset-size", type=int, required=True, metavar="N", help="number of training records n")
    a.add_argument(
        "--batch-size", required=True, metavar="B[,B...]",
        help="expected (poisson) or exact (wor) batch size; comma-separated values sweep",
    )  # fmt: skip
    _add_swept_options(a)
    a.add_argument("--delta", type=float, required=True, help="target delta, in (0, 1) and below 1/N")
    a.add_argument(
        "--accountant", choices=["auto", "pld", "rdp"], default="auto",
        help="auto (default): the smaller epsilon of PLD and RDP at each noise level; pld: privacy loss "
        "distributions only (tight, cannot certify delta below ~1e-15); rdp: Renyi DP only (fast, any delta)",
    )  # fmt: skip
    a.add_argument(
        "--sampling", choices=["poisson", "wor"], default="poisson",
        help="poisson (default; add/remove-one neighbours) or fixed-size batches without replacement "
        "(replace-one neighbours, RDP only)",
    )  # fmt: skip
    a.add_argument(
        "--time-limit", type=float, default=25.0, metavar="SECONDS",
        help="stop each calibration after this long and report the best valid noise found (default 25)",
    )  # fmt: skip
    a.add_argument(
        "--allow-large-delta", action="store_true",
        help="accept delta >= 1/N (such a delta allows publishing a record outright; refused by default)",
    )  # fmt: skip
    a.add_argument(
        "--plot", metavar="FILE.png",
        help="also draw the rows: z against the target epsilon, or (--noise-multiplier) epsilon against the "
        "length; one line per batch size",
    )  # fmt: skip
    a.add_argument("--quiet", action="store_true", help="no progress on stderr (calibration line, rows of a sweep)")
    a.add_argument("--json", action="store_true", help="print the result as one JSON object (a sweep: a list of rows)")
    a.set_defaults(func=_cmd_account)


def _add_swept_options(a) -> None:
    """The length (--steps/--epochs) and the target (--epsilon/--noise-multiplier): comma-separated values sweep."""
    length = a.add_mutually_exclusive_group(required=True)
    length.add_argument(
        "--steps", metavar="T[,T...]", help="number of noisy gradient steps; comma-separated values sweep"
    )
    length.add_argument(
        "--epochs", metavar="E[,E...]",
        help="passes over the data instead of --steps: T = ceil(E*N/B) steps, as privopt train plans DP-SGD; "
        "comma-separated values sweep",
    )  # fmt: skip
    target = a.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--epsilon",
        metavar="EPS[,EPS...]",
        help="target epsilon (> 0) to calibrate z for; comma-separated values sweep",
    )
    target.add_argument(
        "--noise-multiplier", metavar="Z[,Z...]",
        help="instead of --epsilon: report the epsilon this noise multiplier z (> 0) gives at --delta, by the same "
        "--accountant; comma-separated values sweep",
    )  # fmt: skip
