"""The ``privopt predict`` command: score new records with a finished run's released model
(:func:`privopt.api.load_run`) and write one CSV row of predictions per record; with labels (a CSV's
label column, or ``--labels`` for a .npy input), print the accuracy and balanced accuracy too."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from privopt.cliargs import DEVICES, add_plugin_option
from privopt.errors import DataError, PrivoptError

__all__ = ["add_predict_parser"]


def _is_csv(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".csv") or name.endswith(".csv.gz")


def _inputs(run, path: Path):
    """``(raw records, label ids or None)`` of ``--input``: a CSV file for a csv run, else a .npy array."""
    if run.config.get("dataset") == "csv":
        if not _is_csv(path):
            raise PrivoptError(f"--input {path}: the run was trained on dataset: csv; give a .csv (or .csv.gz) file")
        return run.read_csv(path)
    if not path.name.lower().endswith(".npy"):
        shape = run.record["dataset"]["input_shape"]
        feats = " before the run's feature map" if run.config.get("features") else ""
        raise PrivoptError(
            f"--input {path}: for a run on dataset {run.config.get('dataset')!r}, give a .npy array of records "
            f"[N, ...] as the dataset gives them{feats} (the model takes shape {shape}); CSV files are read only "
            "for runs on dataset: csv"
        )
    import numpy as np

    if not path.is_file():
        raise DataError(f"--input {path} does not exist (or is not a file)")
    try:
        return np.load(path, allow_pickle=False), None  # never unpickle an input file
    except (ValueError, OSError, EOFError):
        raise DataError(f"--input {path} is not a NumPy .npy array of numbers") from None


def _labels(run, path: Path, n: int):
    """Class ids ``[n]`` from the .npy file ``path``: integer ids ``0..k-1`` or the run's class names."""
    import numpy as np

    if not path.name.lower().endswith(".npy") or not path.is_file():
        raise DataError(f"--labels {path}: give an existing .npy file of {n} labels, one per record of --input")
    try:
        y = np.load(path, allow_pickle=False)  # never unpickle an input file
    except (ValueError, OSError, EOFError):
        raise DataError(f"--labels {path} is not a NumPy .npy array (of class ids or class names)") from None
    if y.shape != (n,):
        raise DataError(f"--labels {path} has shape {list(y.shape)}; expected [{n}]: one label per record of --input")
    names, k = run.class_names, run.num_classes
    if y.dtype.kind == "U":  # class names, compared as text
        ok = np.isin(y, names)
        ids = np.array([names.index(v) if good else -1 for v, good in zip(y.tolist(), ok)], dtype=np.int64)
    elif y.dtype.kind in "iu":
        ids = y.astype(np.int64)
    else:
        raise DataError(f"--labels {path} holds {y.dtype} values; give integer class ids 0..{k - 1} or class names")
    bad = int(((ids < 0) | (ids >= k)).sum())
    if bad:  # how many, never which values
        raise DataError(
            f"--labels {path}: {bad} of {n} labels are not one of the run's {k} classes "
            f"(ids 0..{k - 1} or the names {', '.join(names)})"
        )
    return ids


def _scores(pred, y) -> dict:
    """Accuracy, and balanced accuracy (the mean per-class recall over the classes present in ``y``)."""
    import numpy as np

    recalls = [float((pred[y == c] == c).mean()) for c in np.unique(y)]
    return {"accuracy": float((pred == y).mean()), "balanced_accuracy": float(np.mean(recalls))}


def _table(run, proba) -> str:
    names = run.class_names
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["prediction", *(f"p_{n}" for n in names)])
    for row in proba:
        w.writerow([names[int(row.argmax())], *(f"{p:.6g}" for p in row)])
    return buf.getvalue()


def _cmd_predict(args) -> int:
    from privopt.api import load_run
    from privopt.checkpoint import atomic_write_text
    from privopt.plugins import import_plugins

    out = Path(args.out)
    if out.exists():  # before any work: a prediction file is never replaced
        raise PrivoptError(f"--out {out} exists; give a new file name (an earlier output is never overwritten)")
    if args.labels is not None and _is_csv(Path(args.input)):
        raise PrivoptError("--labels applies to a .npy --input; a CSV file's label column gives its labels")
    import_plugins(args.plugin)  # e.g. the run's model was registered by a plugin (its record's config names them)
    run = load_run(args.run, device=args.device)  # an unavailable device fails here, before any output
    x, y = _inputs(run, Path(args.input))
    if args.labels is not None:
        y = _labels(run, Path(args.labels), int(x.shape[0]))
    proba = run.predict_proba(x)
    atomic_write_text(out, _table(run, proba))
    result = {"records": int(proba.shape[0]), "out": str(out), "classes": run.class_names}
    if y is not None:
        result.update(_scores(proba.argmax(axis=1), y))
    if args.json:
        print(json.dumps(result))
    elif not args.quiet:
        against = "--labels" if args.labels is not None else "the file's labels"
        acc = (
            ""
            if y is None
            else (f"; accuracy {result['accuracy']:.4f} (balanced {result['balanced_accuracy']:.4f}) against {against}")
        )
        print(f"predicted {result['records']} records with {args.run}{acc}; wrote {out}")
    return 0


def add_predict_parser(sub) -> None:
    p = sub.add_parser(
        "predict",
        help="score new records with a finished run's released model (docs/api.md, 'Using a trained model')",
        description="Rebuild a finished run's released model from RUN/record.json and RUN/model.pt and predict the "
        "records of --input: a CSV file with the feature columns of a dataset: csv run (encoded with the run's "
        "public schema; with the label column, the accuracy is printed too), or a .npy array of records for other "
        "datasets. Writes one CSV row per record: the predicted class and one probability column p_<class> per class.",
    )
    p.add_argument("--run", required=True, metavar="RUN_DIR", help="folder of a finished run (privopt train --out)")
    add_plugin_option(p, what="the run's record can name")
    p.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="new records: a .csv/.csv.gz file (dataset: csv runs) or a .npy array [N, ...] (other datasets)",
    )
    p.add_argument(
        "--labels",
        metavar="FILE.npy",
        help="with a .npy --input: the true labels [N] (class ids 0..k-1 or class names); the accuracy and "
        "balanced accuracy of the predictions are printed",
    )
    p.add_argument("--device", choices=DEVICES, default="cpu", help="compute on cpu (default) or cuda")
    p.add_argument("--out", required=True, metavar="PREDS_CSV", help="CSV file to write (an existing one is refused)")
    p.add_argument("--quiet", action="store_true", help="no summary line")
    p.add_argument("--json", action="store_true", help="print the summary (records, accuracy, output) as JSON")
    p.set_defaults(func=_cmd_predict)
