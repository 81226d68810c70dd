"""The logistic loss under the vmap engine: its label check reads values only where it can."""

from __future__ import annotations

import pytest
import torch

from privopt.grads.engine import get_engine
from privopt.training.metrics import build_loss


def _sum(engine: str, y: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    res = get_engine(engine).clipped_sum(model, build_loss("logistic"), torch.randn(6, 3), y, clip=1.0)
    return res.total if hasattr(res, "total") else res


def test_the_vmap_engine_runs_the_logistic_loss_and_agrees_with_the_ghost_engine():
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    assert torch.allclose(_sum("vmap", y), _sum("ghost", y), atol=1e-6)


def test_labels_other_than_0_and_1_are_still_refused_where_the_batch_is_seen():
    with pytest.raises(ValueError, match="labels 0 or 1"):
        _sum("ghost", torch.tensor([0, 2, 1, 0, 1, 0]))
    with pytest.raises(ValueError, match="labels 0 or 1"):
        build_loss("logistic")(torch.zeros(2, 1), torch.tensor([0, 3]))


def test_a_logistic_run_builds_with_the_vmap_engine():
    from privopt.config import RunConfig
    from privopt.training import build_run

    cfg = {
        "algorithm": "dp-sgd", "dataset": "breast-cancer", "model": "logreg", "loss": "logistic", "engine": "vmap",
        "model_params": {"bias": False, "single_logit": True}, "privacy": {"epsilon": 2.0, "delta": 1e-4},
        "insecure_seed": 1,
    }  # fmt: skip
    build_run(RunConfig.from_dict(cfg))
