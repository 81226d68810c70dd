"""The declared schema of the ``csv`` dataset: which columns to read and their PUBLIC encoding.

Everything that shapes a record's features comes from here, never from the file: the classes of
the label, the groups, each numeric feature's range and each categorical feature's vocabulary. A
mistake in the schema is a :class:`~privopt.errors.ConfigError` raised before any file is opened.
Guide: ``docs/data.md``, "Your own CSV file from the command line".

Example:
    >>> spec = parse_csv_spec(
    ...     label={"column": "y", "classes": ["no", "yes"]},
    ...     features={"age": {"range": [17, 90]}, "job": {"categories": ["a", "b"], "unknown": "other"}},
    ... )
    >>> [(f.name, f.kind) for f in spec.features], spec.classes
    ([('age', 'numeric'), ('job', 'categorical')], ('no', 'yes'))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from privopt.data.tabular import TRANSFORMS
from privopt.errors import ConfigError, close_name

__all__ = [
    "CsvSpec", "CsvFeature", "parse_csv_spec", "OTHER", "MISSING", "MISSING_POLICIES", "UNKNOWN_POLICIES",
    "TRANSFORM_NAMES",
]  # fmt: skip

OTHER = "<other>"  # the one-hot slot of values outside a vocabulary declared with unknown: other
MISSING = "<missing>"  # the one-hot slot of empty cells in a column declared with missing: category
MISSING_POLICIES = ("error", "drop")  # dataset-wide; a categorical column's own missing: category overrides
COLUMN_MISSING = ("category",)
UNKNOWN_POLICIES = ("error", "other")
TRANSFORM_NAMES = tuple(TRANSFORMS)  # identity (the default), log1p, sqrt
_WHERE = "dataset_params"


@dataclass(frozen=True)
class CsvFeature:
    """One feature column: ``numeric`` (public ``lower``/``upper``, in the units of its fixed
    ``transform``; ``fill``: a public constant for its empty cells) or ``categorical`` (public
    ``categories``; ``missing="category"``: empty cells have their own slot); either overrides the
    dataset-wide ``missing`` for the column's cells."""

    name: str
    kind: str
    lower: float = 0.0
    upper: float = 1.0
    categories: tuple[str, ...] = ()
    unknown: str = "error"
    transform: str = "identity"
    missing: str | None = None
    fill: float | None = None

    @property
    def slots(self) -> tuple[str, ...]:
        """The one-hot categories, then the ``<other>`` slot (unknown: other), then ``<missing>``."""
        other = (OTHER,) if self.unknown == "other" else ()
        return (*self.categories, *other, *((MISSING,) if self.missing == "category" else ()))


@dataclass(frozen=True)
class CsvSpec:
    """The parsed ``label``, ``group``, ``features``, ``missing`` and ``delimiter`` options."""

    label: str
    classes: tuple[str, ...]
    group: str | None
    groups: tuple[str, ...]
    features: tuple[CsvFeature, ...]
    missing: str = "error"
    delimiter: str = ","
    encoding: str = "utf-8"

    @property
    def columns(self) -> list[str]:
        """Every column the schema reads (label, group, features), each once."""
        used = [self.label, *([self.group] if self.group else []), *(f.name for f in self.features)]
        return list(dict.fromkeys(used))


def _mapping(what: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    """``value`` as a mapping with only ``allowed`` keys (a misspelt key is named, with the close one)."""
    if not isinstance(value, dict):
        keys = ", ".join(f"{k}: ..." for k in required or allowed)
        raise ConfigError(f"{_WHERE}.{what} must be a mapping ({{{keys}}}), got {value!r}")
    for key in value:
        if key not in allowed:
            hint = close_name(str(key), allowed)
            raise ConfigError(f"unknown key {key!r} in {_WHERE}.{what}{hint}; its keys: {', '.join(allowed)}")
    for key in required:
        if key not in value:
            raise ConfigError(f"{_WHERE}.{what} needs {key!r}")
    return value


def _text(what: str, value: Any) -> str:
    """A declared name as the text a CSV cell holds (``0`` -> ``"0"``)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f'{_WHERE}.{what}: {value!r} is not a name (write it as text, e.g. "{value}")')
    return str(value).strip()


def _names(what: str, value: Any, *, at_least: int) -> tuple[str, ...]:
    """A list of ``at_least`` or more distinct names (classes, groups, categories)."""
    if not isinstance(value, (list, tuple)) or len(value) < at_least:
        raise ConfigError(f"{_WHERE}.{what} must be a list of at least {at_least} names, got {value!r}")
    names = tuple(_text(what, v) for v in value)
    if len(set(names)) != len(names):
        raise ConfigError(f"{_WHERE}.{what} names a value twice: {list(names)}")
    return names


def _column(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{_WHERE}.{what}.column must be a column name (a string), got {value!r}")
    return value.strip()


def _range(name: str, value: Any, transform: str) -> tuple[float, float]:
    what = f"{_WHERE}.features.{name}.range"
    units = "" if transform == "identity" else f" (in {transform} units: transform: {transform})"
    real = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(real(v) for v in value):
        raise ConfigError(f"{what} must be [lower, upper], two finite numbers{units}, got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not lo < hi:
        raise ConfigError(f"{what} needs lower < upper{units}, got [{value[0]}, {value[1]}]")
    return lo, hi


def _numeric(name: str, entry: dict) -> CsvFeature:
    what = f"{_WHERE}.features.{name}"
    for key in ("unknown", "missing"):
        if key in entry:
            fill = "; a numeric column's empty cells take fill: <a public constant>" if key == "missing" else ""
            raise ConfigError(f"{what}.{key} applies to categorical columns (categories: [...]) only{fill}")
    transform = entry.get("transform", "identity")
    if transform not in TRANSFORMS:
        hint = close_name(str(transform), TRANSFORM_NAMES)
        raise ConfigError(f"{what}.transform must be one of {', '.join(TRANSFORM_NAMES)}, got {transform!r}{hint}")
    lo, hi = _range(name, entry["range"], transform)
    return CsvFeature(name, "numeric", lower=lo, upper=hi, transform=transform, fill=_fill(name, entry, transform))


def _fill(name: str, entry: dict, transform: str) -> float | None:
    """The public constant of a numeric column's empty cells, a value as a cell would hold it."""
    value = entry.get("fill")
    if value is None:
        return None
    what = f"{_WHERE}.features.{name}.fill"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number (a public constant, never a statistic of the file)")
    if transform != "identity" and value < 0:
        raise ConfigError(f"{what} must be >= 0: it is a cell value, and transform {transform} takes values >= 0")
    return float(value)


def _categorical(name: str, entry: dict) -> CsvFeature:
    what = f"{_WHERE}.features.{name}"
    for key in ("transform", "fill"):
        if key in entry:
            raise ConfigError(f"{what}.{key} applies to numeric columns (range: [lower, upper]) only")
    unknown, missing = entry.get("unknown", "error"), entry.get("missing")
    if unknown not in UNKNOWN_POLICIES:
        raise ConfigError(f"{what}.unknown must be one of {', '.join(UNKNOWN_POLICIES)}, got {unknown!r}")
    if missing is not None and missing not in COLUMN_MISSING:
        raise ConfigError(
            f"{what}.missing must be category (empty cells get a {MISSING!r} slot), got {missing!r}"
            f"{close_name(str(missing), COLUMN_MISSING)}; the dataset-wide dataset_params.missing is error or drop"
        )
    cats = _names(f"features.{name}.categories", entry["categories"], at_least=1)
    for slot, used in ((OTHER, unknown == "other"), (MISSING, missing is not None)):
        if used and slot in cats:
            raise ConfigError(f"{what}.categories: {slot!r} is the slot the feature's options add")
    return CsvFeature(name, "categorical", categories=cats, unknown=unknown, missing=missing)


def _feature(name: Any, entry: Any) -> CsvFeature:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{_WHERE}.features: {name!r} is not a column name")
    what = f"features.{name}"
    entry = _mapping(what, entry, ("range", "categories", "unknown", "transform", "missing", "fill"))
    if ("range" in entry) == ("categories" in entry):
        raise ConfigError(
            f"{_WHERE}.{what} needs exactly one of range: [lower, upper] (a numeric column) or "
            "categories: [...] (a categorical column)"
        )
    return (_numeric if "range" in entry else _categorical)(name.strip(), entry)


def _check_encoding(encoding: Any) -> None:
    try:
        ok = isinstance(encoding, str) and bool("a".encode(encoding))  # a codec that is not a text encoding fails
    except LookupError:
        ok = False
    if not ok:
        raise ConfigError(f"{_WHERE}.encoding must name a text encoding (e.g. utf-8, latin-1), got {encoding!r}")


def parse_csv_spec(
    *, label: Any, features: Any, group: Any = None, missing: Any = "error", delimiter: Any = ",",
    encoding: Any = "utf-8",
) -> CsvSpec:  # fmt: skip
    """Validate the schema options of the ``csv`` dataset (see the module docstring).

    Raises:
        ConfigError: a missing or unknown key (with the close name), a class/group/category list
            that is not a list of distinct names, a range with lower >= upper, a feature that is
            the label column, an unknown ``missing``/``unknown`` policy or ``transform`` (with the
            close name), a ``transform`` on a categorical column or a ``missing``/``unknown`` on a
            numeric one.
    """
    label = _mapping("label", label, ("column", "classes"), ("column", "classes"))
    column, classes = _column("label", label["column"]), _names("label.classes", label["classes"], at_least=2)
    gcol, groups = None, ()
    if group is not None:
        group = _mapping("group", group, ("column", "groups"), ("column", "groups"))
        gcol, groups = _column("group", group["column"]), _names("group.groups", group["groups"], at_least=1)
    if not isinstance(features, dict) or not features:
        raise ConfigError(
            f"{_WHERE}.features must map at least one column to its public encoding, e.g. "
            "{age: {range: [17, 90]}, job: {categories: [a, b]}}; got " + repr(features)
        )
    feats = tuple(_feature(name, entry) for name, entry in features.items())
    if column in [f.name for f in feats]:
        raise ConfigError(f"{_WHERE}.features: {column!r} is the label column; it cannot be a feature too")
    if missing not in MISSING_POLICIES:
        raise ConfigError(f"{_WHERE}.missing must be one of {', '.join(MISSING_POLICIES)}, got {missing!r}")
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '"\r\n':
        raise ConfigError(f"{_WHERE}.delimiter must be one character (e.g. ',' or ';'), got {delimiter!r}")
    _check_encoding(encoding)
    numeric = tuple(f for f in feats if f.kind == "numeric")  # the layout's order: numeric, then one-hot
    return CsvSpec(column, classes, gcol, groups, (*numeric, *(f for f in feats if f.kind != "numeric")),
                   missing, delimiter, encoding)  # fmt: skip
