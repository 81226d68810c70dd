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
from privopt.data.tabular import one_hot, record_where, tabular_layout
from privopt.errors import ConfigError, DataError, close_name, debug_enabled, some

__all__ = ["csv_source", "read_csv_columns"]


def _file(option: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"dataset csv needs dataset_params.{option}: the path of a CSV file, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_file():
        where = "" if path.is_absolute() else f" ({Path.cwd().joinpath(path).resolve()}, from the current directory)"
        raise DataError(f"csv file {path}{where} does not exist (or is not a file)")
    return path


def _check_header(path: Path, header: list[str], columns: list[str], delimiter: str) -> None:
    """Each declared column named once. The header's names are shown under ``--debug`` only: a file
    without a header line has a record there."""
    for name in columns:
        if header.count(name) == 1:
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
    path: Path, columns: list[str], *, delimiter: str = ",", encoding: str = "utf-8"
) -> tuple[dict, np.ndarray]:
    """``({column: stripped cells as an object array}, file line of each record)`` for ``columns``.

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
    _check_header(path, header, columns, delimiter)
    rows, lines = [], []
    try:
        for row in reader:
            if not any(c.strip() for c in row):
                continue  # a blank line
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


def _missing(spec: CsvSpec, path: Path, cols: dict, lines: np.ndarray) -> tuple[dict, np.ndarray]:
    """Numeric columns parsed, and which records have a missing cell; ``missing: error`` raises on one."""
    numbers, missing = {}, np.zeros(len(lines), dtype=bool)
    numeric = {f.name for f in spec.features if f.kind == "numeric"}
    for name in spec.columns:
        if name in numeric:
            numbers[name], empty = _numbers(path, name, cols[name], lines)
        else:
            empty = cols[name] == ""
        if spec.missing == "error" and empty.any():
            raise DataError(
                f"{path}: column {name!r} of {record_where(~empty, lines)} is missing (an empty or NaN cell); "
                "dataset_params.missing: drop skips such records"
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


def _categories(path: Path, feature: CsvFeature, cells: np.ndarray, lines: np.ndarray) -> np.ndarray:
    known = np.isin(cells, feature.categories)
    if feature.unknown == "error" and not known.all():
        raise DataError(
            f"{path}: column {feature.name!r} of {record_where(known, lines)} is not one of its declared categories "
            f"(dataset_params.features.{feature.name}.unknown: other gives such values an '<other>' slot)"
            + _as_written(feature.categories)
        )
    block = one_hot(cells, feature.categories)
    return (
        np.concatenate([block, (~known)[:, None].astype(np.float64)], axis=1) if feature.unknown == "other" else block
    )


def _part(spec: CsvSpec, path: Path) -> tuple[Part, int]:
    """One file's records encoded (``missing: drop`` applied) and how many were dropped."""
    cols, lines = read_csv_columns(path, spec.columns, delimiter=spec.delimiter, encoding=spec.encoding)
    numbers, missing = _missing(spec, path, cols, lines)
    keep = ~missing
    cols, lines = {c: v[keep] for c, v in cols.items()}, lines[keep]
    numbers = {c: v[keep] for c, v in numbers.items()}
    y = _ids(path, f"label column {spec.label!r}", cols[spec.label], spec.classes, lines)
    g = None if spec.group is None else _ids(path, f"group column {spec.group!r}", cols[spec.group], spec.groups, lines)
    blocks = [
        numbers[f.name][:, None] if f.kind == "numeric" else _categories(path, f, cols[f.name], lines)
        for f in spec.features
    ]
    return Part(np.concatenate(blocks, axis=1), y, g), int(missing.sum())


def _public_meta(spec: CsvSpec, files: dict[str, Path], names: list[str]) -> dict:
    unknown = [f.name for f in spec.features if f.unknown == "other"]
    meta = {
        "source": {"format": "CSV with a header line", "files": [str(p) for p in files.values()]},
        "official_splits_present": sorted(files),
        "class_names": list(spec.classes),
        "feature_names": names,
        "preprocessing": [
            f"label = position of column {spec.label!r} in the declared classes",
            "numeric columns clipped to their declared ranges and min-max scaled with them; categorical "
            "columns one-hot over their declared categories"
            + (f" (values outside them: an '<other>' slot, in {', '.join(unknown)})" if unknown else ""),
            "records with an empty or NaN cell in a column read: "
            + ("dropped (per record)" if spec.missing == "drop" else "an error"),
        ],
    }
    if spec.group is not None:
        meta["group_attribute"] = spec.group
        meta["group_names"] = list(spec.groups)
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
    numeric = {f.name: (f.lower, f.upper) for f in spec.features if f.kind == "numeric"}
    vocab = {f.name: f.slots for f in spec.features if f.kind == "categorical"}
    names, scaling = tabular_layout(numeric, vocab, source="the ranges and categories declared in dataset_params")
    meta = _public_meta(spec, files, names)
    raw = RawData(parts["train"], parts.get("test"), "tabular", len(spec.classes), scaling, meta=meta, stats=stats)
    return ctx.with_test(raw)
