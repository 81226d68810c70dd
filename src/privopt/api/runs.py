"""Use a finished run's released model: :func:`load_run` rebuilds it from the run's public files.

A run folder holds ``record.json`` (its config and public facts) and ``model.pt`` (the released
model's ``state_dict``). :func:`load_run` rebuilds the architecture the config names, loads the
weights (``torch.load(..., weights_only=True)``: no pickled object is ever run) and predicts as the
run's own evaluation did: the config's feature map, the centring on the released feature mean and
the logit adjustment's offsets. It reads nothing else (never the SECRET ``checkpoint.pt``, nor the
training data). Guide: ``docs/api.md``, "Using a trained model".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privopt.checkpoint import CHECKPOINT_NAME
from privopt.errors import ConfigError, DataError

__all__ = ["ReleasedRun", "load_run"]

_CHUNK = 2048  # records per forward pass, as the run's evaluation


def _read_record(folder: Path) -> dict[str, Any]:
    from privopt.training.outputs import RECORD_NAME

    if not folder.is_dir():
        raise DataError(f"run folder {folder} does not exist (or is not a folder)")
    path = folder / RECORD_NAME
    if not path.is_file():
        raise DataError(f"{folder} holds no {RECORD_NAME}: not a privopt run folder (privopt train --out writes one)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise DataError(f"{path} is corrupt: not a JSON run record") from None
    ok = isinstance(record, dict) and all(isinstance(record.get(k), dict) for k in ("config", "dataset", "model"))
    if not ok:
        raise DataError(f"{path} is not a privopt run record (no config, dataset and model sections)")
    return record


def _check_finished(folder: Path, record: dict[str, Any]) -> None:
    from privopt.api.run_status import current_status, resume_command
    from privopt.training.outputs import RECORD_NAME

    status = record.get("status")
    if status == "failed":
        raise ConfigError(
            f"run {folder} failed ({record.get('reason') or 'no reason recorded'}): it released no model; "
            "start a new run"
        )
    if status == "finished":
        return
    # A record saying running may be a live run's or a killed one's: the folder's lock tells.
    _, now, _ = current_status(folder / RECORD_NAME, record, lambda path: _read_record(path.parent))
    how = resume_command(folder, record)
    if now in ("running", "finished", "failed"):
        todo = "wait for it to end" if now == "running" else "load it again"
    else:
        todo = f"resume it with {how}, then load it" if how else f"it holds no {CHECKPOINT_NAME} to resume from"
    said = f"status {status!r}" + (f", {now} now" if now != status else "")
    raise ConfigError(
        f"run {folder} has not finished ({said}, step {record.get('steps_done')} of "
        f"{record.get('total_steps')}): it has no released model yet; {todo}"
    )


def _check_rebuildable(folder: Path, record: dict[str, Any]) -> None:
    if record["model"].get("source") == "api":
        raise ConfigError(
            f"run {folder} trained a model passed as a Python object ({record['model'].get('name')}): its "
            "architecture cannot be rebuilt from the config; build the module yourself and load the weights with "
            f"module.load_state_dict(torch.load({str(folder / 'model.pt')!r}, weights_only=True))"
        )


def _state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from privopt.training.outputs import MODEL_NAME

    path = folder / MODEL_NAME
    if not path.is_file():
        raise DataError(f"{path} is missing: the run finished but its released model was deleted or moved")
    try:  # weights_only: a model.pt holding any other pickled object is refused, never executed
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        raise DataError(
            f"{path} is corrupt or not a plain state_dict (read with torch.load(weights_only=True): tensors only)"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DataError(f"{path} is not a model state_dict (a mapping of parameter names to tensors)")
    return state


def _model(folder: Path, record: dict[str, Any], state: dict[str, torch.Tensor]) -> nn.Module:
    from privopt.models import build_model

    cfg, data = record["config"], record["dataset"]
    name, params = cfg.get("model"), dict(cfg.get("model_params") or {})
    try:
        shape, k = tuple(int(d) for d in data["input_shape"]), int(data["num_classes"])
        net = build_model(name, input_shape=shape, num_classes=k, seed=0, **params)
    except (KeyError, TypeError, ValueError) as e:
        plugins = cfg.get("plugins") or []  # the model may be one they register: import them first
        hint = f" (the run imported plugins {plugins}: pass them with privopt predict --plugin)" if plugins else ""
        raise DataError(f"{folder}: the record's model ({name!r}, {params}) cannot be rebuilt: {e}{hint}") from None
    try:
        net.load_state_dict(state)
    except RuntimeError:
        raise DataError(
            f"{folder}: model.pt does not fit the model the record names ({name!r} with model_params {params}, "
            f"input shape {list(shape)}, {k} classes): written by another run or another privopt version?"
        ) from None
    return net.eval()


def _offsets(folder: Path, record: dict[str, Any]) -> torch.Tensor | None:
    cfg, prediction = record["config"], record.get("prediction") or {}
    if "logit_offsets" in prediction:
        return torch.tensor(prediction["logit_offsets"], dtype=torch.float32)
    if cfg.get("logit_adjustment"):
        raise ConfigError(
            f"run {folder} predicts with a logit adjustment whose offsets its record does not hold "
            "(no prediction.logit_offsets): it cannot be reproduced from the public files"
        )
    return None


def _mean(folder: Path, record: dict[str, Any]) -> torch.Tensor | None:
    if not record["config"].get("feature_centering"):
        return None
    released = record.get("released") or {}
    if "feature_mean" not in released:  # a non-private run centres on the exact mean: diagnostics only
        raise ConfigError(
            f"run {folder} centred its features on a mean its record does not hold (a non-private run keeps the "
            "exact mean in diagnostics.NOT_PRIVATE.json only): its inputs cannot be prepared from the public files"
        )
    return torch.tensor(released["feature_mean"], dtype=torch.float32)


def load_run(path: str | Path, *, device: str = "cpu") -> ReleasedRun:
    """The released model of the finished run in ``path``, ready to predict.

    Args:
        path: a run folder written by ``privopt train --out`` or ``privopt.fit(out_dir=...)``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``: where the model computes (its outputs come back
            to the CPU).

    Returns:
        A :class:`ReleasedRun` (``.record``, ``.model`` in eval mode, ``.predict``, ``.predict_proba``).

    Raises:
        ConfigError: an unknown ``device`` or one this machine does not have (checked first); the
            run has not finished (still running; paused, interrupted or killed: the message says
            how to resume; failed), or its model was passed as a Python object (rebuild it yourself), or its
            predictions need a statistic its record does not hold.
        DataError: no run folder, or a corrupt ``record.json`` / ``model.pt``.

    Example:
        >>> import tempfile, torch, privopt
        >>> from torch import nn
        >>> from privopt.data import Dataset
        >>> x = torch.rand(300, 4, generator=torch.Generator().manual_seed(0))
        >>> y = (x[:, 0] > 0.5).long()
        >>> data = Dataset.from_tensors(x[:200], y[:200], x_test=x[200:], y_test=y[200:], num_classes=2)
        >>> folder = tempfile.mkdtemp()
        >>> record = privopt.fit(model="logreg", dataset=data, algorithm="sgd", epochs=2, batch_size=50,
        ...                      lr=0.5, out_dir=f"{folder}/run")
        >>> run = load_run(f"{folder}/run")
        >>> run.predict_proba(x[:3]).shape, run.predict_proba(x[:3]).sum(1).round(6).tolist()
        ((3, 2), [1.0, 1.0, 1.0])
        >>> float((run.predict(x[200:]) == y[200:].numpy()).mean()) == record["metrics"]["test_accuracy"]
        True
    """
    from privopt.config import resolve_device

    dev = resolve_device(device)  # before any file is read
    folder = Path(path).expanduser()
    record = _read_record(folder)
    _check_finished(folder, record)
    _check_rebuildable(folder, record)
    model = _model(folder, record, _state_dict(folder)).to(dev)
    return ReleasedRun(
        path=folder,
        record=record,
        model=model,
        logit_offsets=_offsets(folder, record),
        feature_mean=_mean(folder, record),
        device=dev,
    )


@dataclass(eq=False)
class ReleasedRun:
    """A finished run's released model (:func:`load_run`).

    Attributes:
        path: the run folder.
        record: its ``record.json``.
        model: the released ``nn.Module`` (eval mode), taking the inputs after the run's feature map.
        logit_offsets: the logit adjustment's offsets subtracted from the model's logits (or ``None``).
        feature_mean: the released feature mean the inputs are centred on (or ``None``).
        device: where :attr:`model` computes (:func:`load_run`'s ``device``).
    """

    path: Path
    record: dict[str, Any]
    model: nn.Module
    logit_offsets: torch.Tensor | None = None
    feature_mean: torch.Tensor | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def class_names(self) -> list[str]:
        """The classes' public names (``"0"``, ``"1"``, ... when the dataset has none)."""
        names = self.record["dataset"].get("class_names")
        return [str(n) for n in names] if names else [str(i) for i in range(self.num_classes)]

    @property
    def num_classes(self) -> int:
        return int(self.record["dataset"]["num_classes"])

    @property
    def config(self) -> dict[str, Any]:
        return self.record["config"]

    def prepare(self, x: Any) -> torch.Tensor:
        """The model's inputs for raw records ``x`` (``[N, ...]``, as the run's dataset gives them: after its
        own scaling, before ``features``): the feature map, then the centring, as in the run."""
        from privopt.api.run_inputs import prepare_inputs

        return prepare_inputs(self, x)

    def logits(self, x: Any) -> torch.Tensor:
        """The released predictor's logits on raw records ``x`` (the logit adjustment applied), on the CPU."""
        from privopt.eval.metrics import model_logits

        inputs = self.prepare(x)
        try:
            out = model_logits(self.model, inputs.to(self.device), chunk=_CHUNK).cpu()
        except RuntimeError:  # torch's text may quote values: the shape and type say enough
            raise DataError(
                f"the model cannot take inputs of shape {list(inputs.shape[1:])} and dtype {inputs.dtype}"
            ) from None
        if self.logit_offsets is None:
            return out
        from privopt.data.class_prior import AdjustedLogits

        return AdjustedLogits(nn.Identity(), self.logit_offsets)(out)

    def predict_proba(self, x: Any) -> np.ndarray:
        """Class probabilities ``[N, num_classes]`` (float64) of raw records ``x``.
        (Example: :func:`load_run`.)
        """
        from privopt.eval.metrics import probabilities

        return probabilities(self.logits(x), num_classes=self.num_classes)

    def predict(self, x: Any) -> np.ndarray:
        """Class ids ``[N]`` (int64) of raw records ``x``: the most probable class, as the run's evaluation.
        (Example: :func:`load_run`.)
        """
        return self.predict_proba(x).argmax(axis=1)

    def read_csv(self, path: str | Path) -> tuple[torch.Tensor, np.ndarray | None]:
        """``(raw records, label ids or None)`` of a CSV file of new records, encoded with the public schema
        of a ``dataset: csv`` run (the label column is optional; every feature column is needed).

        Raises:
            ConfigError: the run was not trained on ``dataset: csv``.
            DataError: a missing file or column, a cell the schema cannot encode, an empty or NaN cell.
        """
        from privopt.api.run_inputs import read_csv_records

        return read_csv_records(self, Path(path))
