"""Runs side by side: :func:`compare_runs` tabulates the records of a sweep's run folders (``privopt runs``).

It reads ONLY each run's ``record.json``, the public record (settings, ledger, final (ε, δ), the
released model's metrics on the test split): never the SECRET ``checkpoint.pt`` nor
``diagnostics.NOT_PRIVATE.json``. For a run whose record is not final (running, paused, interrupted)
it also looks at the run directory's lock, ``.privopt.lock``, to show the status the run has now
(a killed run is ``interrupted``; :mod:`privopt.api.run_status`). Its table, CSV, Markdown and plot
hold nothing the records do not. Guide: ``docs/api.md``, "Comparing runs".
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privopt.api.run_status import RESUMABLE, current_status, resume_command
from privopt.errors import ConfigError, DataError, PrivoptError

__all__ = ["RunTable", "compare_runs"]

RECORD_NAME = "record.json"  # privopt.training.outputs.RECORD_NAME (not imported: that pulls in torch)
FIRST = ("run", "algorithm", "model", "dataset", "epsilon", "delta", "status")
SCORES = ("test_accuracy", "test_balanced_accuracy", "test_worst_group_accuracy")
LAST = ("wall_time_s",)
SEEDED_NOTE = "* noise and sampling seeded by --insecure-seed: NOT private (anyone who knows the seed can replay them)"


@dataclass
class RunTable:
    """The runs found by :func:`compare_runs`.

    Attributes:
        rows: one dict per run, in table order: the ``columns`` plus every ``test_*`` metric of the
            record, ``path``, ``private``, ``insecure_seed``, ``reason`` (why a run failed),
            ``privopt_version``, ``record_status`` (the status the record says; ``status`` is the one
            the run has now: ``interrupted`` for a ``running`` record no process owns any more,
            ``unknown`` when this machine cannot tell), ``host`` (the host the run's lock file names, for
            a record not final), ``status_note`` (why it is interrupted or unknown) and ``resume`` (the
            command that continues a paused or interrupted run; ``None`` without a checkpoint).
        columns: the keys the table shows: run, algorithm, model, dataset, epsilon (the guarantee;
            ``None`` for a non-private run), delta, status, the hyper-parameters whose values differ
            between the runs, the test metrics present, wall_time_s (and privopt_version when it differs).
        skipped: folders searched that hold no ``record.json``.
        unreadable: ``{record path: why}`` of the records that could not be read (left out of ``rows``).
    """

    rows: list[dict[str, Any]]
    columns: list[str]
    skipped: list[Path] = field(default_factory=list)
    unreadable: dict[Path, str] = field(default_factory=dict)

    def text(self) -> str:
        """The table as aligned plain text (with a footnote when a run was seeded), then, after a blank
        line, how to resume each paused or interrupted run and why a status is unknown."""
        cells = [list(self.columns)] + [[_cell(r, c) for c in self.columns] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
        hints = self._hints()
        return "\n".join(lines + self._notes() + ([""] + hints if hints else [])) + "\n"

    def _hints(self) -> list[str]:
        """For the terminal only: they name local paths and hosts, which the files written do not."""
        out = []
        for r in self.rows:
            parts = [r.get("status_note"), f"resume with: {r['resume']}" if r.get("resume") else None]
            if any(parts):
                out.append(f"{r['run']} ({r['status']}): " + "; ".join(p for p in parts if p))
        return out

    def markdown(self) -> str:
        """The table as a Markdown (GitHub) pipe table."""
        esc = [[_cell(r, c).replace("|", "\\|").replace("*", "\\*") for c in self.columns] for r in self.rows]
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in esc]
        notes = [n.replace("*", "\\*", 1) for n in self._notes()]
        return "\n".join(lines + ["", *notes]).rstrip() + "\n"

    def csv(self) -> str:
        """The table as CSV: unrounded values, and an ``insecure_seed`` column (empty: secret randomness)."""
        buf = io.StringIO()
        keys = [*self.columns, "insecure_seed"]
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(keys)
        for r in self.rows:
            w.writerow(["" if r.get(k) is None else _plain(r.get(k)) for k in keys])
        return buf.getvalue()

    def _notes(self) -> list[str]:
        return [SEEDED_NOTE] if any(r.get("insecure_seed") is not None and r["private"] for r in self.rows) else []

    def plot(self, path: str | Path, *, metric: str = "test_accuracy") -> int:
        """PNG of ``metric`` against ε (log scale), one marked line per algorithm. Returns how many
        runs it leaves out (non-private, or without ``metric``).

        Raises:
            DataError: no run has both an ε and ``metric``.
        """
        points = [r for r in self.rows if _number(r["epsilon"]) and r["epsilon"] > 0 and _number(r.get(metric))]
        if not points:
            raise DataError(f"nothing to plot: no run has both an epsilon (a private run) and {metric}")
        series: dict[str, tuple[list[float], list[float]]] = {}
        for r in sorted(points, key=lambda r: (r["epsilon"], r[metric])):
            xs, ys = series.setdefault(str(r["algorithm"]), ([], []))
            xs.append(float(r["epsilon"]))
            ys.append(float(r[metric]))
        from privopt.plots import plot_series

        seeded = any(r.get("insecure_seed") is not None for r in points)
        title = f"{metric} against epsilon ({len(points)} runs)" + ("\nseeded runs: NOT private" if seeded else "")
        plot_series(Path(path), series, xlabel="epsilon (guarantee)", ylabel=metric, title=title, logx=True, marker="o")
        return len(self.rows) - len(points)


def _plain(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if key == "epsilon" and not row.get("private"):
        return "non-private"
    seeded = "*" if key == "epsilon" and row.get("insecure_seed") is not None else ""
    if value is None:
        return seeded
    if not _number(value):  # text, a flag, a list: as written (a hand-edited record may hold anything)
        return str(_plain(value)) + seeded
    if key == "wall_time_s":
        return f"{value:.1f}"
    if isinstance(value, float) and key.startswith("test_"):
        return f"{value:.4f}"
    return (f"{value:.4g}" if isinstance(value, float) else str(value)) + seeded


def _subdirs(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:  # unreadable folder: nothing found in it
        return []


def _find(paths: list[Path]) -> tuple[list[tuple[str, Path]], list[Path]]:
    """``(name, record path)`` of the runs in ``paths`` (run folders, their record.json, or folders
    holding runs one or two levels down), and the folders searched that hold none."""
    found: dict[Path, tuple[str, Path]] = {}
    skipped: list[Path] = []

    def add(name: str, record: Path) -> None:
        found.setdefault(record.resolve(), (name, record))

    for p in paths:
        if p.is_file() and p.name == RECORD_NAME:
            add(p.resolve().parent.name, p)
        elif not p.is_dir():
            raise DataError(f"{p} is not a run folder, a {RECORD_NAME} or a folder holding runs (no such folder)")
        elif (p / RECORD_NAME).is_file():
            add(p.resolve().name, p / RECORD_NAME)
        else:
            before, empty = len(found), []
            for child in _subdirs(p):
                if (child / RECORD_NAME).is_file():
                    add(child.name, child / RECORD_NAME)
                    continue
                inner = _subdirs(child)
                runs = [g for g in inner if (g / RECORD_NAME).is_file()]
                for g in runs:
                    add(f"{child.name}/{g.name}", g / RECORD_NAME)
                empty += [g for g in inner if g not in runs] if runs else [child]
            skipped += empty if len(found) > before else [p]
    return _unique_names(list(found.values())), skipped


def _unique_names(runs: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """Two runs of one name (``a/eps1``, ``b/eps1``) are named by their folder's path instead."""
    names = [n for n, _ in runs]
    return [(str(rec.parent) if names.count(n) > 1 else n, rec) for n, rec in runs]


def _read(record_path: Path) -> dict[str, Any]:
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else "not valid JSON"
        raise DataError(f"{why}") from None
    ok = isinstance(record, dict) and all(isinstance(record.get(k), dict) for k in ("dataset", "model"))
    if not ok:
        raise DataError("not a privopt run record (no dataset and model sections)")
    return record


def _section(record: dict[str, Any], key: str) -> dict[str, Any]:
    return record[key] if isinstance(record.get(key), dict) else {}


def _status_note(record: dict[str, Any], status: str, owner: Any) -> str | None:
    if status == "interrupted" and record.get("status") == "running":
        note = "its process ended while its record said running (killed, out of memory or a reboot?)"
        if not (owner and owner.host):  # no lock file: whatever wrote the record is gone
            note = "no process owns its folder while its record says running (killed, or its last write failed?)"
        return note
    if status == "unknown":
        return f"its record says running, but this machine cannot tell whether it still does: {owner.why}"
    return None


def _row(name: str, record_path: Path, record: dict[str, Any], status: Any, owner: Any) -> dict[str, Any]:
    priv, metrics, seed = (_section(record, k) for k in ("privacy", "metrics", "randomness"))
    private = priv.get("private") is True
    resume = resume_command(record_path.parent, record) if status in RESUMABLE else None
    return {
        "run": name,
        "algorithm": record.get("algorithm"),
        "model": record["model"].get("name"),
        "dataset": record["dataset"].get("name"),
        "epsilon": priv.get("epsilon_guarantee", priv.get("epsilon_spent")) if private else None,
        "delta": priv.get("delta"),
        "status": status,
        **{k: v for k, v in metrics.items() if k.startswith("test_")},
        "wall_time_s": record.get("wall_time_s"),
        "path": str(record_path.parent),
        "private": private,
        "insecure_seed": seed.get("insecure_seed"),
        "reason": record.get("reason"),
        "privopt_version": record.get("privopt_version"),
        "record_status": record.get("status"),
        "host": owner.host if owner is not None else None,
        "status_note": _status_note(record, status, owner),
        "resume": resume,
        "_hp": {**_settings(_section(record, "config")), **_section(record, "hyperparameters")},
        "_cfg": set(_settings(_section(record, "config"))),
    }


# The rows' keys beside the columns (a hyper-parameter of one of these names is shown as hp.NAME).
_EXTRA = ("path", "private", "insecure_seed", "reason", "privopt_version")
_EXTRA += ("record_status", "host", "status_note", "resume")  # the run's state now (privopt.api.run_status)

# Config keys the fixed columns show already, or that say how a run was carried out, not what it trained.
_SHOWN = {"algorithm", "algorithm_params", "dataset", "model", "privacy.epsilon", "privacy.delta", "insecure_seed"}
_HOW = {"device", "data_dir", "plots", "checkpoint_every", "eval_every", "eval_subsample"}


def _settings(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The run's config flattened to dotted keys (``model_params.hidden``), but for what other columns show."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = prefix + str(key)
        if name in _SHOWN or name in _HOW:
            continue
        if isinstance(value, dict) and value:
            out.update(_settings(value, name + "."))
        elif not isinstance(value, dict):
            out[name] = value
    return out


def _differing(rows: list[dict[str, Any]]) -> list[str]:
    """The hyper-parameters and config settings (``seed``, ``model_params.hidden``, ...) that take two
    values or more in the runs that have them (one algorithm's own settings, alike in each of its
    runs, say nothing the algorithm column does not), and the config settings given in some runs and
    unset in others (``logit_adjustment: {}``) — for ``dataset_params``/``model_params``, among the runs
    of one dataset/model (the dataset and model columns tell the others apart)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r["_hp"] if k not in keys]
    config = set().union(*(r["_cfg"] for r in rows))

    def differs(k: str) -> bool:
        if len({json.dumps(r["_hp"][k], sort_keys=True, default=str) for r in rows if k in r["_hp"]}) > 1:
            return True
        if k not in config:
            return False
        by = "dataset" if k.startswith("dataset_params.") else "model" if k.startswith("model_params.") else None
        given: dict[Any, set[bool]] = {}
        for r in rows:
            given.setdefault(str(r[by]) if by else None, set()).add(k in r["_hp"])
        return any(len(v) > 1 for v in given.values())

    return [k for k in keys if differs(k)]


def _columns(rows: list[dict[str, Any]], metric: str | None) -> list[str]:
    hps = _differing(rows)
    taken = set(FIRST) | set(SCORES) | set(LAST) | set(_EXTRA)
    named = {k: (f"hp.{k}" if k in taken or k.startswith("test_") else k) for k in hps}
    for r in rows:
        hp = r.pop("_hp")
        r.pop("_cfg")
        r.update({named[k]: hp.get(k) for k in hps})
    scores = [k for k in SCORES if any(r.get(k) is not None for r in rows)]
    if metric is not None and metric not in scores:
        scores.append(metric)
    versions = {r["privopt_version"] for r in rows}
    return [*FIRST, *named.values(), *scores, *LAST, *(["privopt_version"] if len(versions) > 1 else [])]


def _sorted(rows: list[dict[str, Any]], key: str, reverse: bool) -> list[dict[str, Any]]:
    """Rows by ``key`` (numbers before text), the runs without a value last either way."""
    have = [r for r in rows if r.get(key) is not None]
    rest = [r for r in rows if r.get(key) is None]

    def order(r: dict[str, Any]) -> tuple:
        v = r[key]
        text = not isinstance(v, (int, float))
        return (text, str(_plain(v)) if text else "", 0.0 if text else float(v))

    return sorted(have, key=order, reverse=reverse) + rest


def compare_runs(
    paths: list[str | Path], *, sort: str | None = None, reverse: bool = False, metric: str | None = None
) -> RunTable:
    """Tabulate the run records of ``paths``: run folders, their ``record.json``, or folders holding
    runs one or two levels down (searched in name order). Reads only ``record.json`` (public), and for
    a record not final the folder's lock file, to show ``interrupted`` for a run whose process was
    killed (:mod:`privopt.api.run_status`; nothing is written).

    Args:
        paths: where the runs are.
        sort: a column to order the rows by (default: the order found); runs without a value come last.
        reverse: descending order.
        metric: a test metric of the records (e.g. ``test_roc_auc``) to show as a column too.

    Returns:
        A :class:`RunTable` (``.rows``, ``.columns``; ``.text()``, ``.markdown()``, ``.csv()``, ``.plot()``).

    Raises:
        DataError: a path does not exist, or no readable run record was found.
        ConfigError: ``sort`` or ``metric`` names no column or metric of the runs.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("give at least one run folder or folder holding runs")
    runs, skipped = _find(paths)
    rows, unreadable = [], {}
    for name, record_path in runs:
        try:
            record, status, owner = current_status(record_path, _read(record_path), _read)
            rows.append(_row(name, record_path, record, status, owner))
        except PrivoptError as e:
            unreadable[record_path] = str(e)
    if not rows:
        where = ", ".join(str(p) for p in paths)
        bad = f"; {len(unreadable)} unreadable: {', '.join(map(str, unreadable))}" if unreadable else ""
        raise DataError(f"no readable run record in {where} (a run folder holds {RECORD_NAME}){bad}")
    _check_metric(rows, metric)
    columns = _columns(rows, metric)
    if sort is not None:
        if sort not in columns and sort not in rows[0]:
            raise ConfigError(f"cannot sort by {sort!r}: the columns are {', '.join(columns)}")
        rows = _sorted(rows, sort, reverse)
    return RunTable(rows=rows, columns=columns, skipped=skipped, unreadable=unreadable)


def _check_metric(rows: list[dict[str, Any]], metric: str | None) -> None:
    if metric is None or any(r.get(metric) is not None for r in rows):
        return
    known = sorted({k for r in rows for k, v in r.items() if k.startswith("test_") and v is not None})
    raise ConfigError(f"no run has the metric {metric!r}; the runs' test metrics are {', '.join(known) or 'none'}")
