"""The ``privopt predict`` command: score new records with a finished run's released model
(:func:`privopt.api.load_run`) and write one CSV row of predictions per record."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

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

    out = Path(args.out)
    if out.exists():  # before any work: a prediction file is never replaced
        raise PrivoptError(f"--out {out} exists; give a new file name (an earlier output is never overwritten)")
    run = load_run(args.run)
    x, y = _inputs(run, Path(args.input))
    proba = run.predict_proba(x)
    atomic_write_text(out, _table(run, proba))
    result = {"records": int(proba.shape[0]), "out": str(out), "classes": run.class_names}
    if y is not None:
        result["accuracy"] = float((proba.argmax(axis=1) == y).mean())
    if args.json:
        print(json.dumps(result))
    elif not args.quiet:
        acc = "" if y is None else f"; accuracy {result['accuracy']:.4f} against the file's labels"
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
    p.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="new records: a .csv/.csv.gz file (dataset: csv runs) or a .npy array [N, ...] (other datasets)",
    )
    p.add_argument("--out", required=True, metavar="PREDS_CSV", help="CSV file to write (an existing one is refused)")
    p.add_argument("--quiet", action="store_true", help="no summary line")
    p.add_argument("--json", action="store_true", help="print the summary (records, accuracy, output) as JSON")
    p.set_defaults(func=_cmd_predict)
