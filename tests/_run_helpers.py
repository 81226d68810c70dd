"""Small configs shared by the training-loop tests (tiny runs on the embedded digits data)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from privopt.config import RunConfig

BASE: dict[str, Any] = {
    "algorithm": "dp-sgd",
    "dataset": "digits",
    "model": "logreg",
    "algorithm_params": {"epochs": 2, "batch_size": 100, "lr": 0.5, "clip": 1.0},
    "privacy": {"epsilon": 2.0, "delta": 1e-5},
    "checkpoint_every": 5,
    "eval_every": 5,
}


def cfg_dict(**over: Any) -> dict[str, Any]:
    """BASE with top-level keys replaced, or merged one level deep when both are mappings."""
    d = copy.deepcopy(BASE)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    return d


def cfg(**over: Any) -> RunConfig:
    return RunConfig.from_dict(cfg_dict(**over))


def read_record(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "record.json").read_text())


def ledger_epsilon(record: dict[str, Any]) -> float:
    """The ε the record's own ledger gives (a record must never state another one)."""
    from privopt.privacy import PrivacyLedger

    return PrivacyLedger.from_dict(record["privacy"]["ledger"]).epsilon()


class PythonGate(nn.Module):
    """A learned scale behind a data-dependent Python branch: it runs forward, but torch.func cannot
    take its per-example gradients (``float(tensor)`` under vmap)."""

    def __init__(self, d: int):
        super().__init__()
        self.s = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.s if float(x.sum()) > -1e9 else x


def gaussian_epsilon(noise_to_sensitivity: float, delta: float) -> float:
    """epsilon of one Gaussian mechanism whose noise std is ``noise_to_sensitivity`` times its
    sensitivity, straight from dp_accounting's RDP accountant (a reference independent of privopt's
    translation of its events)."""
    import dp_accounting as dpa

    acc = dpa.rdp.RdpAccountant()
    acc.compose(dpa.GaussianDpEvent(noise_to_sensitivity))
    return acc.get_epsilon(delta)


def torchrun() -> str:
    """The ``torchrun`` beside this Python (else on PATH); skips the test when there is none."""
    import shutil
    import sys

    import pytest

    exe = Path(sys.executable).with_name("torchrun")
    if not exe.exists():
        found = shutil.which("torchrun")
        if found is None:
            pytest.skip("torchrun is not installed")
        exe = Path(found)
    return str(exe)
