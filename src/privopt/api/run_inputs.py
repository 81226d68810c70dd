"""New records for a released model (:mod:`privopt.api.runs`): checked, encoded and prepared as the run
prepared its own splits, with the public constants of its record only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from privopt.errors import ConfigError, DataError

__all__ = ["prepare_inputs", "read_csv_records", "to_records"]


def to_records(x: Any) -> torch.Tensor:
    """``x`` (a tensor or array of records ``[N, ...]``) as a CPU tensor: floats as float32, finite."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError):
            arr = None
        if arr is None or arr.dtype == object or arr.dtype.kind not in "biuf":
            raise DataError(f"inputs must be a numeric array or tensor of records [N, ...], got {type(x).__name__}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.dim() < 2 or t.shape[0] == 0:
        raise DataError(f"inputs must be a non-empty batch of records [N, ...], got shape {list(t.shape)}")
    if t.is_floating_point():
        t = t.to(torch.float32)
        if not torch.isfinite(t).all():  # which record is the user's data: not named
            raise DataError("inputs hold NaN or infinite values")
    elif t.dtype == torch.bool or t.is_complex():
        raise DataError(f"inputs must be real numbers, got dtype {t.dtype}")
    else:
        t = t.to(torch.int64)
    return t


def _features(run: Any, x: torch.Tensor) -> torch.Tensor:
    spec = dict(run.config.get("features") or {})
    if not spec:
        return x
    from privopt.data.features import features_of

    name = spec.pop("name")
    try:
        return features_of(x.to(torch.float32), name, **spec)
    except ConfigError as e:
        raise DataError(f"inputs of shape {list(x.shape[1:])} do not fit the run's feature map {name!r}: {e}") from None


def prepare_inputs(run: Any, x: Any) -> torch.Tensor:
    """The released model's inputs for raw records ``x``: the run's feature map, then its centring."""
    t = _features(run, to_records(x))
    expected = [int(d) for d in run.record["dataset"]["input_shape"]]
    if list(t.shape[1:]) != expected:
        what = "the features of records" if run.config.get("features") else "records"
        raise DataError(
            f"the run's model takes {what} of shape {expected} (one record; inputs are [N, *shape]); "
            f"got {list(t.shape[1:])}"
        )
    if run.feature_mean is not None:
        from privopt.data.centering import FeatureCentering

        centering = FeatureCentering.from_config(dict(run.config["feature_centering"]))
        t = centering.centre(t, run.feature_mean)
    return t


def _scaling_mode(params: dict[str, Any]) -> str:
    if "standardize" in params and params["standardize"] is not None:  # the deprecated alias
        return "public" if params["standardize"] else "unit"
    mode = params.get("scaling", "public")
    if mode == "data":
        raise ConfigError(
            "the run scaled its features with the exact mean/std of its training split (scaling: data, not "
            "private), which its record does not hold: new records cannot be scaled as its records were"
        )
    return mode


def read_csv_records(run: Any, path: Path) -> tuple[torch.Tensor, np.ndarray | None]:
    """``(raw records, label ids or None)`` of the CSV file ``path``, encoded with the run's public schema."""
    from privopt.data.csv_dataset import csv_layout, encode_csv
    from privopt.data.csv_spec import parse_csv_spec

    cfg = run.config
    if cfg.get("dataset") != "csv":
        raise ConfigError(
            f"the run was trained on dataset {cfg.get('dataset')!r}, not dataset: csv: a CSV file has no schema to "
            "encode it with; pass its records as an array (a .npy file to privopt predict)"
        )
    params = dict(cfg.get("dataset_params") or {})
    if "label" not in params or "features" not in params:  # a Dataset passed in: the config holds no schema
        raise ConfigError(
            "the run's record holds no CSV schema (dataset_params.label and .features): its dataset was passed in "
            "as a Dataset; encode new rows as it was encoded and pass the arrays to predict, or train with "
            "dataset='csv' and its dataset_params (privopt train --config, privopt.fit(dataset_params=...))"
        )
    keys = ("label", "features", "group", "missing", "delimiter", "encoding")
    spec = parse_csv_spec(**{k: params[k] for k in keys if k in params})
    path = path.expanduser()
    if not path.is_file():
        raise DataError(f"csv file {path} does not exist (or is not a file)")
    x, y, _, _ = encode_csv(spec, path, scoring=True)
    _, scaling = csv_layout(spec)
    return torch.from_numpy(scaling.apply(x, mode=_scaling_mode(params))), y
