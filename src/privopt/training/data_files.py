"""Where a run reads the files its config names (``dataset: csv``'s ``dataset_params.path`` and
``test_path``).

A relative path read from a config file (``privopt train --config exp/run.yaml``) is relative to
that file's folder; one given with ``--set`` or through the Python API, to the current directory
(:func:`privopt.config.file_folders`). The run reads the absolute paths; its SECRET checkpoint keeps
them, so a resume reads the same files from any current directory. The record states the paths as
written (no machine path). Guide: ``docs/data.md``, "Your own CSV file from the command line".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from privopt.config import FILE_OPTIONS, RunConfig, file_folders
from privopt.errors import DataError

__all__ = ["load_config_dataset", "resolve_files"]

_FILE_DATASETS = ("csv",)


def resolve_files(cfg: RunConfig, recorded: dict[str, str] | None = None) -> dict[str, str]:
    """``{option: absolute path}`` of the files ``cfg`` names; ``recorded`` (a checkpoint's) are kept as they are."""
    if cfg.dataset not in _FILE_DATASETS:
        return {}
    folders, out = file_folders(cfg), {}
    for key in FILE_OPTIONS:
        value = cfg.dataset_params.get(key)
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            continue  # the builder says what it needs
        if recorded and isinstance(recorded.get(key), str):
            out[key] = recorded[key]
            continue
        base = Path(folders[key][0]) if key in folders else Path.cwd()
        out[key] = os.path.normpath(base / Path(value).expanduser())  # an absolute value stays itself
    return out


def _where(cfg: RunConfig, key: str, recorded: dict[str, str] | None) -> str:
    if recorded and key in recorded:
        return "where the run read it when it started: its checkpoint keeps that location"
    folders = file_folders(cfg)
    if key in folders:
        return f"relative to the folder of the config file {folders[key][1]}"
    return "absolute" if Path(cfg.dataset_params[key]).expanduser().is_absolute() else "from the current directory"


def load_config_dataset(cfg: RunConfig, recorded: dict[str, str] | None = None) -> tuple[Any, dict[str, str]]:
    """``(dataset, files read)``: :func:`privopt.data.load_dataset` of ``cfg`` with its files' absolute paths.

    Raises:
        DataError: as :func:`~privopt.data.load_dataset`; a missing file is named as given and as resolved.
    """
    from privopt.data import load_dataset

    files = resolve_files(cfg, recorded)
    params = {**cfg.dataset_params, **files}
    try:
        data = load_dataset(cfg.dataset, data_dir=cfg.data_dir, seed=cfg.seed, **params)
    except DataError:  # the schema is checked first (ConfigError): a missing file is said here, with its origin
        for key, file in files.items():
            if not Path(file).is_file():
                raise DataError(
                    f"dataset_params.{key}: file {cfg.dataset_params[key]} ({file}, {_where(cfg, key, recorded)}) "
                    "does not exist (or is not a file)"
                ) from None
        raise
    return data, files
