"""Your own CSV file as a dataset (``dataset: csv``), encoded with the PUBLIC schema of the config.

The file needs a header line naming its columns; columns the schema does not name are not read.
Labels, groups and categories are matched as text (cells stripped of surrounding spaces) against
the declared names; numeric cells are clipped to their declared range by the pipeline's public
scaling. No constant is computed from the file (no min, max, mean or vocabulary), so each record's
features depend on that record and the config alone (the file is read as UTF-8 with no fallback:
decoding the whole file otherwise when one record is not UTF-8 would re-read every record). Errors
name the file, the column and the problem, never a cell's value; the line only under ``--debug``
(as for the other loaders).
Guide: ``docs/data.md``, "Your own CSV file from the command line".
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from privopt.data import formats
from privopt.data.csv_spec import CsvFeature, CsvSpec, parse_csv_spec
from privopt.data.dataset import Part, RawData
from privopt.data.registry import BuildContext
from privopt.data.tabular import one_hot, record_where, tabular_layout, transform
from privopt.errors import ConfigError, DataError, close_name, debug_enabled, some

__all__ = ["csv_layout", "csv_source", "encode_csv", "read_csv_columns"]


def _file(option: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"dataset csv needs dataset_params.{option}: the path of a CSV file, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_file():
        where = "" if path.is_absolute() else f" ({Path.cwd().joinpath(path).resolve()}, from the current directory)"
        raise DataError(f"csv file {path}{where} does not exist (or is not a file)")
    return path


def _check_header(path: Path, header: list[str], columns: list[str], delimiter: str, optional=()) -> None:
    """Each declared column named once (an ``optional`` one at most once). The header's names are shown
    under ``--debug`` only: a file without a header line has a record there."""
    for name in columns:
        if header.count(name) == 1 or (name in optional and name not in header):
            continue
        if name in header:
            raise DataError(f"{path}: column {name!r} is named twice in the header line")
        sep = f"separated by {delimiter!r} (dataset_params.delimiter)"
        shown = (
            f"{close_name(name, header)}; the header line has {', '.join(map(repr, header))}, {sep}"
            if debug_enabled()
            else f" (the first line must name the columns, {sep}; privopt --debug shows the names it has)"
        )
        raise DataError(f"{path}: column {name!r} is not in the header line{shown}")


def _decode(path: Path, encoding: str) -> str:
    """The file as text in the declared ``encoding``, strictly. No fallback: a guess made for the whole
    file (another encoding when some bytes do not decode) would let one record change how every other
    record's cells read, and so which category they match."""
    raw = formats.read_bytes(path)
    try:
        return raw.decode(encoding).lstrip("\ufeff")  # a byte-order mark is not part of the first name
    except UnicodeDecodeError as err:
        line = some("line", raw[: err.start].count(b"\n"))
        raise DataError(
            f"{path}: {line} is not {encoding} text; dataset_params.encoding names the file's encoding "
            "(e.g. latin-1 or cp1252 for a file saved by older Excel)"
        ) from None


def read_csv_columns(
    path: Path, columns: list[str], *, delimiter: str = ",", encoding: str = "utf-8", optional=(), scoring=False
) -> tuple[dict, np.ndarray]:
    """``({column: stripped cells as an object array}, file line of each record)`` for ``columns``;
    a column of ``optional`` missing from the header is left out of the mapping. Blank lines are
    skipped, and lines of empty fields (``,,``: an export's trailing rows) too, but for ``scoring``:
    rows to predict, where a skipped row would shift every later prediction against the file's rows.

    Raises:
        DataError: a file that is not ``encoding`` text, an empty file, a column missing from the
            header (or named twice in it), a record with another number of fields than the header,
            no records.
    """
    text = _decode(path, encoding)
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, strict=True)  # an unclosed quote is an error
    header = next((row for row in reader if any(c.strip() for c in row)), None)
    if header is None:
        raise DataError(
            f"{path}: the file is empty (expected a header line naming the columns, then one record a line)"
        )
    header = [c.strip() for c in header]
    _check_header(path, header, columns, delimiter, optional)
    columns = [c for c in columns if c in header]
    rows, lines = [], []
    try:
        for row in reader:
            if not row or (len(row) == 1 < len(header) and not row[0].strip()):
                continue  # a blank line
            if not scoring and not any(c.strip() for c in row):
                continue  # a line of empty fields
            if len(row) != len(header):  # never which line (unless debugging), its content nor its length
                raise DataError(f"{path}: {some('line', reader.line_num - 1)} does not have {len(header)} fields")
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error:
        raise DataError(
            f"{path}: {some('line', reader.line_num - 1)} is not valid CSV (an unclosed quote, a character "
            f"after a closing quote, or a field of more than {csv.field_size_limit()} characters)"
        ) from None
    if not rows:
        raise DataError(f"{path}: no records after the header line")
    index = [header.index(c) for c in columns]
    cols = {c: np.array([r[j].strip() for r in rows], dtype=object) for c, j in zip(columns, index)}
    return cols, np.array(lines, dtype=np.int64)


def _numbers(path: Path, name: str, cells: np.ndarray, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, missing)`` of a numeric column: an empty or NaN cell is missing (value 0 then)."""
    values, ok = np.zeros(len(cells)), np.ones(len(cells), dtype=bool)
    for i, cell in enumerate(cells):
        try:
            values[i] = float(cell) if cell else np.nan
        except ValueError:
            ok[i] = False
            break
    if not ok.all():
        raise DataError(
            f"{path}: column {name!r} of {record_where(ok, lines)} is not a number "
            "(written like -1234.5: a decimal point, no thousands separator)"
        )
    missing = np.isnan(values)
    if np.isinf(values).any():
        raise DataError(f"{path}: column {name!r} of {record_where(~np.isinf(values), lines)} is not finite (inf)")
    return np.where(missing, 0.0, values), missing


_DROP_HINT = "dataset_params.missing: drop skips such records"


def _missing(spec: CsvSpec, path: Path, cols: dict, lines: np.ndarray, *, drop: bool, hint: str):
    """Numeric columns parsed, and which records have a missing cell; without ``drop``, one raises.
    A feature's own ``missing: category`` or ``fill`` overrides: its empty cells are a slot or the
    declared constant, not missing (unless the column is the group column too: a group is never guessed)."""
    numbers, missing = {}, np.zeros(len(lines), dtype=bool)
    numeric = {f.name for f in spec.features if f.kind == "numeric"}
    slotted = {f.name for f in spec.features if f.missing == "category"} - {spec.label, spec.group}
    fills = {f.name: f.fill for f in spec.features if f.fill is not None and f.name != spec.group}
    for name in cols:
        if name in numeric:
            numbers[name], empty = _numbers(path, name, cols[name], lines)
            if name in fills:
                numbers[name], empty = np.where(empty, fills[name], numbers[name]), np.zeros_like(empty)
        elif name in slotted:
            continue
        else:
            empty = cols[name] == ""
        if not drop and empty.any():
            raise DataError(
                f"{path}: column {name!r} of {record_where(~empty, lines)} is missing (an empty or NaN cell); {hint}"
            )
        missing |= empty
    return numbers, missing


def _as_written(names: tuple[str, ...]) -> str:
    """A hint from the config alone when declared names are numbers: cells are compared as text."""
    try:
        floats = [float(n) for n in names]
    except ValueError:
        return ""
    alt = lambda n, f: str(f) if n != str(f) else str(int(f)) if f.is_integer() else n
    other = ", ".join(f'"{alt(n, f)}"' for n, f in zip(names, floats) if math.isfinite(f))
    return (
        f"; names are compared as text, so a declared {names[0]} does not match a cell written otherwise "
        f"(declare them as the file writes them, e.g. [{other}])"
    )


def _ids(path: Path, what: str, cells: np.ndarray, names: tuple[str, ...], lines: np.ndarray) -> np.ndarray:
    ok = np.isin(cells, names)
    if not ok.all():  # the column, never the value (nor the line unless debugging)
        raise DataError(
            f"{path}: {what} of {record_where(ok, lines)} is not one of the declared names{_as_written(names)}"
        )
    lut = {n: i for i, n in enumerate(names)}
    return np.array([lut[c] for c in cells], dtype=np.int64)


def _transformed(path: Path, feature: CsvFeature, values: np.ndarray, lines: np.ndarray) -> np.ndarray:
    """A numeric column under its fixed transform (each defined for values >= 0, checked per record)."""
    if feature.transform == "identity":
        return values
    ok = values >= 0
    if not ok.all():  # the column, never the value (nor the line unless debugging)
        raise DataError(
            f"{path}: column {feature.name!r} of {record_where(ok, lines)} is negative; its transform "
            f"{feature.transform} (dataset_params.features.{feature.name}.transform) takes values >= 0"
        )
    return transform(feature.transform, values)


def _categories(path: Path, feature: CsvFeature, cells: np.ndarray, lines: np.ndarray) -> np.ndarray:
    """One-hot over :attr:`CsvFeature.slots`: declared categories, ``<other>``, ``<missing>``."""
    empty = cells == "" if feature.missing == "category" else np.zeros(len(cells), dtype=bool)
    known = np.isin(cells, feature.categories) | empty
    if feature.unknown == "error" and not known.all():
        raise DataError(
            f"{path}: column {feature.name!r} of {record_where(known, lines)} is not one of its declared categories "
            f"(dataset_params.features.{feature.name}.unknown: other gives such values an '<other>' slot)"
            + _as_written(feature.categories)
        )
    extra = [~known] if feature.unknown == "other" else []
    extra += [empty] if feature.missing == "category" else []
    return np.concatenate([one_hot(cells, feature.categories), *(e[:, None].astype(np.float64) for e in extra)], axis=1)


def encode_csv(
    spec: CsvSpec, path: Path, *, scoring: bool = False
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, int]:
    """``(features, label ids, group ids, records dropped)`` of one file, before the public scaling.

    Features are laid out as :func:`csv_layout` names them. For ``scoring`` (new records to predict),
    the label column is optional (``None`` without it), the group column is not read and every record
    is kept (an empty or NaN cell is an error: a dropped record would have no prediction).

    Raises:
        DataError: as :func:`read_csv_columns`, and a cell the schema cannot encode.
    """
    if scoring:
        columns, optional = list(dict.fromkeys([spec.label, *(f.name for f in spec.features)])), (spec.label,)
        drop, hint = False, "a record to score needs every feature (fill or remove it)"
    else:
        columns, optional, drop, hint = spec.columns, (), spec.missing == "drop", _DROP_HINT
    cols, lines = read_csv_columns(
        path, columns, delimiter=spec.delimiter, encoding=spec.encoding, optional=optional, scoring=scoring
    )
    numbers, missing = _missing(spec, path, cols, lines, drop=drop, hint=hint)
    keep = ~missing
    cols, lines = {c: v[keep] for c, v in cols.items()}, lines[keep]
    numbers = {c: v[keep] for c, v in numbers.items()}
    y = None
    if spec.label in cols:
        y = _ids(path, f"label column {spec.label!r}", cols[spec.label], spec.classes, lines)
    g = (
        None
        if spec.group not in cols
        else _ids(path, f"group column {spec.group!r}", cols[spec.group], spec.groups, lines)
    )
    blocks = [
        _transformed(path, f, numbers[f.name], lines)[:, None]
        if f.kind == "numeric"
        else _categories(path, f, cols[f.name], lines)
        for f in spec.features
    ]
    return np.concatenate(blocks, axis=1), y, g, int(missing.sum())


def csv_layout(spec: CsvSpec):
    """``(feature names, public scaling)`` of ``spec``'s encoding (:func:`~privopt.data.tabular.tabular_layout`)."""
    numeric = {f.name: (f.lower, f.upper) for f in spec.features if f.kind == "numeric"}
    vocab = {f.name: f.slots for f in spec.features if f.kind == "categorical"}
    return tabular_layout(numeric, vocab, source="the ranges and categories declared in dataset_params")


def _part(spec: CsvSpec, path: Path) -> tuple[Part, int]:
    """One file's records encoded (``missing: drop`` applied) and how many were dropped."""
    x, y, g, dropped = encode_csv(spec, path)
    return Part(x, y, g), dropped


def _steps(spec: CsvSpec) -> list[str]:
    """The encoding's public steps, from the schema alone."""
    unknown = [f.name for f in spec.features if f.unknown == "other"]
    slotted = [f.name for f in spec.features if f.missing == "category"]
    moved = [f"{f.transform}({f.name})" for f in spec.features if f.transform != "identity"]
    steps = [f"label = position of column {spec.label!r} in the declared classes"]
    if moved:
        steps.append(f"fixed per-record transforms, the ranges declared in their units: {', '.join(moved)}")
    steps.append(
        "numeric columns clipped to their declared ranges and min-max scaled with them; categorical "
        "columns one-hot over their declared categories"
        + (f" (values outside them: an '<other>' slot, in {', '.join(unknown)})" if unknown else "")
    )
    if slotted:
        steps.append(f"empty cells: a '<missing>' slot (per column: missing: category) in {', '.join(slotted)}")
    filled = [f"{f.name} = {f.fill:g}" for f in spec.features if f.fill is not None]
    if filled:
        steps.append(f"empty or NaN cells: the declared public constant (per column: fill) in {', '.join(filled)}")
    policy = "dropped (per record)" if spec.missing == "drop" else "an error"
    other = "another" if slotted or filled else "a"
    return [*steps, f"records with an empty or NaN cell in {other} column read: {policy}"]


def _public_meta(spec: CsvSpec, files: dict[str, Path], names: list[str]) -> dict:
    meta = {
        "source": {"format": "CSV with a header line", "files": [str(p) for p in files.values()]},
        "official_splits_present": sorted(files),
        "class_names": list(spec.classes),
        "feature_names": names,
        "preprocessing": _steps(spec),
    }
    if spec.group is not None:
        meta["group_attribute"] = spec.group
        meta["group_names"] = list(spec.groups)
    if spec.missing == "drop":  # whether or not a record was dropped: public facts never depend on the data
        meta["per_record_selection"] = ["csv missing: drop"]
    return meta


def csv_source(
    ctx: BuildContext, *, path: Any, test_path: Any, label: Any, features: Any, group: Any, **layout: Any
) -> RawData:
    """The ``csv`` dataset's builder: schema first (ConfigError), then the files (DataError).
    ``layout``: ``missing``, ``delimiter`` and ``encoding`` (:func:`parse_csv_spec`)."""
    if path is None:
        raise ConfigError("dataset csv needs dataset_params.path: the CSV file of the training records")
    spec = parse_csv_spec(label=label, features=features, group=group, **layout)
    if test_path is not None and ctx.test_fraction is not None:
        raise ConfigError("dataset csv: give dataset_params.test_path or test_fraction, not both")
    files = {"train": _file("path", path)}
    if test_path is not None:
        files["test"] = _file("test_path", test_path)
    parts, stats = {}, {"records_per_file": {}, "rows_dropped_missing": {}}
    for split, file in files.items():
        parts[split], dropped = _part(spec, file)
        stats["records_per_file"][str(file)] = len(parts[split]) + dropped
        stats["rows_dropped_missing"][split] = dropped
    names, scaling = csv_layout(spec)
    meta = _public_meta(spec, files, names)
    raw = RawData(parts["train"], parts.get("test"), "tabular", len(spec.classes), scaling, meta=meta, stats=stats)
    return ctx.with_test(raw)
