"""dp-sgd's ``chunk_size``: the same batch, noise and charge, its clipped sum computed in chunks."""

import pytest
import torch

from _run_helpers import cfg, read_record
from privopt.errors import ConfigError
from privopt.training import train


def _run(tmp_path, name, **params):
    out = tmp_path / name
    train(cfg(algorithm_params=params, insecure_seed=3), out_dir=out, progress=False)
    return read_record(out), torch.load(out / "model.pt")


def test_chunks_give_the_same_run_and_bound_the_engines_batch(tmp_path, monkeypatch):
    from privopt.grads.ghost.engine import GhostEngine

    sizes, real = [], GhostEngine.clipped_sum

    def spy(self, model, loss_fn, x, y, **kw):
        sizes.append(int(x.shape[0]))
        return real(self, model, loss_fn, x, y, **kw)

    monkeypatch.setattr(GhostEngine, "clipped_sum", spy)
    whole, whole_state = _run(tmp_path, "whole")
    whole_sizes, sizes[:] = list(sizes), []
    chunked, chunked_state = _run(tmp_path, "chunked", chunk_size=16)
    assert max(whole_sizes) > 16 and max(sizes) <= 16  # batches of ~100 went in at once, now 16 at most
    assert sum(sizes) == sum(whole_sizes)  # the same records, the same batches
    assert whole["privacy"]["epsilon_spent"] == chunked["privacy"]["epsilon_spent"]
    assert whole["steps_done"] == chunked["steps_done"]
    for k, v in whole_state.items():  # same batches and noise: only the summation order differs
        torch.testing.assert_close(chunked_state[k], v, rtol=1e-5, atol=1e-6)
    assert chunked["hyperparameters"]["chunk_size"] == 16


@pytest.mark.parametrize("bad", [0, -3, 2.5, "16", True])
def test_a_bad_chunk_size_is_refused_before_any_output(tmp_path, bad):
    with pytest.raises(ConfigError, match="chunk_size"):
        train(cfg(algorithm_params={"chunk_size": bad}, insecure_seed=3), out_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
