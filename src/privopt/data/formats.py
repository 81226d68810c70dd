"""Parsers for the ORIGINAL dataset file formats (IDX, CIFAR-10 binary, UCI text, CelebA text).

Every parser reads the record count from the file itself (IDX header, file size, line count), so
the same code reads the full official files and any subset written in the same format. Anything
unexpected — bad gzip stream, wrong magic number, truncated data, wrong record size, unparsable
or non-finite numbers — raises :class:`~privopt.errors.DataError` naming the file and the problem:
a loader must never return silently wrong data.

All parsers return NumPy arrays; conversion to tensors happens in the dataset pipeline.
"""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from privopt.errors import DataError, debug_enabled, some

__all__ = [
    "read_bytes",
    "read_text",
    "read_idx",
    "read_cifar_bin",
    "read_class_names",
    "read_covtype",
    "read_adult",
    "ADULT_COLUMNS",
    "ADULT_NUMERIC",
    "read_celeba_attributes",
    "read_celeba_partition",
]

# IDX element types: third magic byte -> (numpy big-endian dtype, bytes per element).
_IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

CIFAR_RECORD = 3073  # 1 label byte + 3 * 32 * 32 pixel bytes


def _cache_key(path: Path) -> tuple[str, int, int]:
    # Cache on (path, size, mtime) so an edited/replaced file is re-read, never served stale.
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


def read_bytes(path: str | os.PathLike) -> bytes:
    """Read a file, transparently decompressing it when its name ends in ``.gz``.

    Raises:
        DataError: the file is missing or the gzip stream is corrupt/truncated.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        # gzip's own text can quote the data: the first two bytes ("Not a gzipped file (b'30')") or the
        # CRC-32 of the whole content, a fingerprint to test guesses of a record against; --debug shows it
        detail = f" ({exc})" if debug_enabled() else " (privopt --debug shows the reader's message)"
        raise DataError(f"cannot read {path}: not readable, or a corrupt or truncated gzip stream{detail}") from None


def read_text(path: str | os.PathLike) -> str:
    """Read a (possibly gzipped) text file as UTF-8 (latin-1 fallback for old UCI files)."""
    raw = read_bytes(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


# ------------------------------------------------------------------------------------------ IDX


def read_idx(path: str | os.PathLike, *, expect_ndim: int | None = None) -> np.ndarray:
    """Parse an IDX file (MNIST / Fashion-MNIST format).

    Layout: big-endian int32 magic ``0x0000TTDD`` (TT = element type, DD = number of dimensions),
    one big-endian int32 per dimension, then the data row-major.

    Args:
        path: ``*-idx?-ubyte`` file, optionally ``.gz``.
        expect_ndim: if given, the number of dimensions the header must declare (3 for images,
            1 for labels).

    Returns:
        Array of the declared shape and type (native byte order).

    Raises:
        DataError: bad magic, unexpected number of dimensions, or data size not matching the header.

    Example:
        >>> import gzip, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "x-idx1-ubyte.gz")
        >>> with gzip.open(p, "wb") as f:
        ...     _ = f.write(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
        >>> read_idx(p, expect_ndim=1).tolist()
        [7, 8, 9]
    """
    path = Path(path)
    raw = read_bytes(path)
    if len(raw) < 4:
        raise DataError(f"{path}: file too short ({len(raw)} bytes) to hold an IDX header")
    zero0, zero1, dtype_code, ndim = raw[0], raw[1], raw[2], raw[3]
    if zero0 != 0 or zero1 != 0 or dtype_code not in _IDX_TYPES or ndim == 0:
        raise DataError(
            f"{path}: bad IDX magic number 0x{int.from_bytes(raw[:4], 'big'):08X} "
            "(expected 0x00000801 labels / 0x00000803 images or another 0x0000TTDD IDX code)"
        )
    if expect_ndim is not None and ndim != expect_ndim:
        raise DataError(f"{path}: IDX header declares {ndim} dimensions, expected {expect_ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_TYPES[dtype_code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    actual = len(raw) - header
    if actual != expected:
        problem = "truncated" if actual < expected else "has trailing bytes"
        raise DataError(f"{path}: IDX data {problem}: header dims {dims} need {expected} bytes, found {actual}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


# ------------------------------------------------------------------------------------- CIFAR-10


def read_cifar_bin(path: str | os.PathLike, *, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Parse a CIFAR-10 "binary version" batch: records of 1 label byte + 3072 pixel bytes.

    Returns:
        ``(images, labels)``: uint8 ``[N, 3, 32, 32]`` (channel planes R, G, B) and int64 ``[N]``,
        with ``N = file size / 3073``.

    Raises:
        DataError: size not a positive multiple of 3073, or a label byte outside ``[0, num_classes)``.
    """
    path = Path(path)
    raw = read_bytes(path)
    if len(raw) == 0 or len(raw) % CIFAR_RECORD:
        raise DataError(
            f"{path}: wrong record size: {len(raw)} bytes is not a positive multiple of the "
            f"{CIFAR_RECORD}-byte CIFAR-10 record (1 label + 3072 pixels); file truncated or not CIFAR-10 binary"
        )
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR_RECORD)
    labels = rec[:, 0].astype(np.int64)
    bad = labels >= num_classes
    if bool(bad.any()):  # neither which record (unless debugging) nor its label: both are its data
        raise DataError(f"{path}: {some('record', _first(bad))} has a label byte outside 0..{num_classes - 1}")
    images = rec[:, 1:].reshape(-1, 3, 32, 32).copy()
    return images, labels


def read_class_names(path: str | os.PathLike) -> list[str]:
    """Class names, one per non-empty line (CIFAR ``batches.meta.txt``)."""
    return [ln.strip() for ln in read_text(path).splitlines() if ln.strip()]


# ------------------------------------------------------------------------------------ Covertype


def read_covtype(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Parse UCI ``covtype.data``: comma-separated integers, 54 features + Cover_Type (1..7).

    Returns:
        ``(features float64 [N, 54], cover_type int64 [N] in 1..7)``; ``N`` = number of data lines.

    Raises:
        DataError: a line without 55 numeric fields, non-finite values, or a label outside 1..7.
    """
    # Parsed arrays are cached (read-only); callers get private copies they may modify.
    x, y = _read_covtype_cached(_cache_key(Path(path)))
    return x.copy(), y.copy()


@functools.lru_cache(maxsize=4)
def _read_covtype_cached(key) -> tuple[np.ndarray, np.ndarray]:
    path = Path(key[0])
    numbered = [(i, ln) for i, ln in enumerate(read_text(path).splitlines()) if ln.strip()]
    lines = [ln for _, ln in numbered]
    if not lines:
        raise DataError(f"{path}: no data rows (expected comma-separated covtype rows of 55 integers)")

    # Errors name the file and the field, never the line, its value or how many lines are bad:
    # which line holds a bad record, and what it holds, are that record's data (a user debugging
    # their own file gets the line under PRIVOPT_DEBUG: errors.some).
    def line(bad) -> str:
        return some("line", numbered[_first(bad)][0])

    if any(ln.count(",") != 54 for ln in lines):
        raise DataError(
            f"{path}: {line([ln.count(',') != 54 for ln in lines])} does not have 55 fields (54 features + label)"
        )
    try:
        data = np.array([ln.split(",") for ln in lines], dtype=np.float64)
    except ValueError:
        k, field = _first_non_number(ln.split(",") for ln in lines)
        raise DataError(f"{path}: field {field} of {line(np.arange(len(lines)) == k)} is not a number") from None
    if not np.isfinite(data).all():
        raise DataError(f"{path}: {line(~np.isfinite(data).all(axis=1))} has a non-finite value (NaN/inf)")
    labels = data[:, 54]
    ok = (labels >= 1) & (labels <= 7) & (labels == np.round(labels))
    if not bool(ok.all()):
        raise DataError(f"{path}: field 55 (Cover_Type) of {line(~ok)} is not an integer 1..7")
    x, y = data[:, :54], labels.astype(np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _first(mask) -> int | None:
    """The index of the first true entry of ``mask`` (for :func:`privopt.errors.some`)."""
    hits = np.flatnonzero(np.asarray(mask))
    return int(hits[0]) if hits.size else None


def _first_non_number(rows) -> tuple[int | None, int]:
    """(row index, 1-based field) of the first value of ``rows`` (lists of fields) that does not parse
    as a number. Error messages name the field, never the line (unless debugging) or the value: both
    are a record's data."""
    for i, fields in enumerate(rows):
        for j, f in enumerate(fields):
            try:
                float(f)
            except ValueError:
                return i, j + 1
    return None, 0  # unreachable when numpy's parse failed on the same fields


# ---------------------------------------------------------------------------------------- Adult

ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "income",
)  # fmt: skip
ADULT_NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")


def read_adult(path: str | os.PathLike, *, lines: bool = False) -> tuple:
    """Parse UCI ``adult.data`` / ``adult.test`` (fields separated by ``", "``, ``?`` = missing).

    ``adult.test`` starts with a ``|1x3 Cross validator`` line and ends labels with a dot
    (``>50K.``); both are handled. Blank lines are skipped.

    Returns:
        ``(columns, label)``: ``columns`` maps each of the 14 attribute names to an array (float64
        for numeric columns, str for categorical ones, ``"?"`` kept for missing), ``label`` is int64
        (1 for ``>50K``). With ``lines=True`` also the 1-based file line of each record (int64), for
        errors that name a record's line under ``--debug`` only (:func:`privopt.errors.some`).

    Raises:
        DataError: a row without 15 fields, a non-numeric numeric field, or an unknown income label.
    """
    cols, label, where = _read_adult_cached(_cache_key(Path(path)))
    out = {k: v.copy() for k, v in cols.items()}, label.copy()
    return (*out, where.copy()) if lines else out


@functools.lru_cache(maxsize=2)
def _read_adult_cached(key) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    path = Path(key[0])
    rows = []
    for i, ln in enumerate(read_text(path).splitlines()):
        if not ln.strip() or ln.startswith("|"):
            continue
        fields = [f.strip() for f in ln.split(",")]
        if len(fields) != len(ADULT_COLUMNS):  # never which line (unless debugging), nor its content
            raise DataError(f"{path}: {some('line', i)} does not have {len(ADULT_COLUMNS)} fields")
        rows.append((i + 1, fields))
    if not rows:
        raise DataError(f"{path}: no data rows (expected UCI Adult rows of {len(ADULT_COLUMNS)} fields)")
    cols: dict[str, np.ndarray] = {}
    for j, name in enumerate(ADULT_COLUMNS[:-1]):
        values = [r[1][j] for r in rows]
        if name in ADULT_NUMERIC:
            try:
                arr = np.array(values, dtype=np.float64)
            except ValueError:
                k, _ = _first_non_number([v] for v in values)
                line = some("line", None if k is None else rows[k][0] - 1)
                raise DataError(f"{path}: field {j + 1} ({name!r}) of {line} is not a number") from None
            if not np.isfinite(arr).all():
                line = some("line", rows[_first(~np.isfinite(arr))][0] - 1)
                raise DataError(f"{path}: field {j + 1} ({name!r}) of {line} is not finite (NaN/inf)")
            cols[name] = arr
        else:
            cols[name] = np.array(values, dtype=object)
    label = np.empty(len(rows), dtype=np.int64)
    for k, (line, fields) in enumerate(rows):
        inc = fields[-1].rstrip(".")
        if inc == ">50K":
            label[k] = 1
        elif inc == "<=50K":
            label[k] = 0
        else:
            raise DataError(f"{path}: field 15 (income) of {some('line', line - 1)} is neither '<=50K' nor '>50K'")
    return cols, label, np.array([r[0] for r in rows], dtype=np.int64)


# ---------------------------------------------------------------------------------------- CelebA


def read_celeba_attributes(path: str | os.PathLike) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Parse ``list_attr_celeba.txt``: count line, attribute-name line, then ``image v1 .. v40``.

    Returns:
        ``(attribute_names, image_ids, attributes)`` with ``image_ids`` str ``[N]`` and
        ``attributes`` int8 ``[N, A]`` mapped from ±1 to 1/0. ``N`` must equal the count line.

    Raises:
        DataError: count line not an integer or not matching the rows, a row of the wrong length,
            an image with more than one row, or a value other than ``1``/``-1``.
    """
    names, ids, attrs = _read_celeba_attributes_cached(_cache_key(Path(path)))
    return list(names), ids.copy(), attrs.copy()


@functools.lru_cache(maxsize=2)
def _read_celeba_attributes_cached(key):
    path = Path(key[0])
    lines = read_text(path).splitlines()
    if len(lines) < 2:
        raise DataError(f"{path}: expected a row-count line and an attribute-name line, found {len(lines)} lines")
    try:
        count = int(lines[0].strip())
    except ValueError:
        raise DataError(f"{path}: line 1 is not the row count (an integer)") from None
    names = tuple(lines[1].split())
    body = [ln for ln in lines[2:] if ln.strip()]  # "row 3" (debugging only): the third of these
    if len(body) != count:
        raise DataError(f"{path}: header says {count} rows but the file has {len(body)} (truncated?)")
    width = len(names) + 1
    tokens = " ".join(body).split()
    if len(tokens) != count * width:  # never which row (unless debugging), nor its content: a record's data
        bad = _first([len(ln.split()) != width for ln in body])
        raise DataError(f"{path}: {some('row', bad)} does not have {width} fields (image id + {len(names)} attributes)")
    table = np.array(tokens, dtype=object).reshape(count, width)
    ids = table[:, 0].astype(str)
    uniq, counts = np.unique(ids, return_counts=True)
    if counts.size and counts.max() > 1:  # one person's record would count twice: the privacy unit breaks
        which = f"image {str(uniq[counts > 1][0])!r}" if debug_enabled() else "an image"  # an id names a record
        raise DataError(f"{path}: {which} has more than one row; each image must appear once")
    vals = table[:, 1:]
    pos, neg = vals == "1", vals == "-1"
    if not np.all(pos | neg):
        r, c = (int(v) for v in np.argwhere(~(pos | neg))[0])  # the attribute is public; the row is a record
        raise DataError(f"{path}: field {c + 2} (attribute {names[c]!r}) of {some('row', r)} is neither 1 nor -1")
    attrs = pos.astype(np.int8)
    ids.setflags(write=False)
    attrs.setflags(write=False)
    return names, ids, attrs


def read_celeba_partition(path: str | os.PathLike) -> dict[str, int]:
    """Parse ``list_eval_partition.txt`` (``<image> <0|1|2>`` per line) into ``{image: partition}``.

    Raises:
        DataError: a line of the wrong length, a partition other than 0/1/2, an image listed twice.
    """
    path = Path(path)
    out: dict[str, int] = {}
    for i, ln in enumerate(read_text(path).splitlines()):
        if not ln.strip():
            continue
        parts = ln.split()
        if len(parts) != 2:
            raise DataError(f"{path}: line {i + 1} does not have 2 fields ('<image> <0|1|2>')")
        if parts[1] not in ("0", "1", "2"):
            raise DataError(f"{path}: line {i + 1}, field 2 (partition) is not 0, 1 or 2")
        if parts[0] in out:  # a second entry would silently override the first (or place it twice)
            raise DataError(f"{path}: image {parts[0]!r} is listed more than once (line {i + 1})")
        out[parts[0]] = int(parts[1])
    if not out:
        raise DataError(f"{path}: empty partition list")
    return out
