"""A resume continues the same run beyond its data, model and code: on the CPU thread count the run
recorded, with a GPU's generator, the module-level values the user's code reads, and the code of its
run metrics (or it refuses)."""

import dataclasses

import pytest
import torch
from torch import nn

import privopt.training.run as run_module
from _run_helpers import cfg
from privopt.checkpoint import load_checkpoint, save_checkpoint
from privopt.errors import ConfigError, ModelError
from privopt.training import train
from privopt.training.builder import build_run
from privopt.training.fingerprints import loss_fingerprint, model_fingerprint
from privopt.training.metrics import _RUN_METRICS, RunMetric
from privopt.training.resume import restore, rng_state, verify


def _paused(run, **kw):
    return train(cfg(insecure_seed=0, **kw.pop("over", {})), out_dir=run, progress=False, max_steps=3, **kw)


def _resume(run, **kw):
    return train(None, out_dir=run, resume=True, progress=False, **kw)


@pytest.fixture
def threads():
    """Set torch's thread count in a test; the count it had is back afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


# ------------------------------------------------------------------------- CPU threads
def test_a_resume_runs_on_the_thread_count_the_run_recorded(tmp_path, monkeypatch, threads):
    threads(2)
    train(cfg(insecure_seed=0), out_dir=tmp_path / "whole", progress=False)
    _paused(tmp_path / "r")
    threads(1)  # e.g. resumed from a shell with OMP_NUM_THREADS=1
    seen, real_loop = [], run_module.run_loop

    def counting_loop(step, state, callbacks):
        seen.append(torch.get_num_threads())
        return real_loop(step, state, callbacks)

    monkeypatch.setattr(run_module, "run_loop", counting_loop)
    rec = _resume(tmp_path / "r")
    assert seen == [2] and rec["environment"]["threads"] == 2
    assert torch.get_num_threads() == 1  # the caller's count is back
    whole, resumed = torch.load(tmp_path / "whole" / "model.pt"), torch.load(tmp_path / "r" / "model.pt")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)  # as if never interrupted


def test_the_callers_thread_count_is_back_after_a_refused_resume(tmp_path, threads):
    threads(2)
    _paused(tmp_path / "r", model=_Global())
    threads(1)
    with pytest.raises(ModelError):
        _resume(tmp_path / "r", model=nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    assert torch.get_num_threads() == 1


# ------------------------------------------------------------------------- generators
def test_a_cpu_run_never_reads_a_gpu_generator(tmp_path, monkeypatch):
    def no_cuda(*a, **kw):
        raise AssertionError("a CPU run read a CUDA generator")

    monkeypatch.setattr(torch.cuda, "get_rng_state", no_cuda)
    monkeypatch.setattr(torch.cuda, "set_rng_state", no_cuda)
    _paused(tmp_path / "r")
    assert sorted(load_checkpoint(tmp_path / "r")["rng"]) == ["noise", "sampler", "torch"]
    assert _resume(tmp_path / "r")["status"] == "finished"


def _on_gpu(run):
    """The run as it would be configured on a GPU (its tensors stay on the CPU: only the rng code reads it)."""
    return dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, device="cuda:0"))


def test_a_gpu_run_checkpoints_and_restores_its_device_generator(tmp_path, monkeypatch):
    device_state = torch.arange(8, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": device_state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append((state, device)))
    _paused(tmp_path / "r")
    ckpt = load_checkpoint(tmp_path / "r")
    run = _on_gpu(build_run(cfg(insecure_seed=0)))
    state = rng_state(run)
    assert torch.equal(state["cuda"], device_state) and set(state) == {"noise", "sampler", "torch", "cuda"}
    restore(run, dict(ckpt, rng=state))
    assert len(restored) == 1 and torch.equal(restored[0][0], device_state)
    assert restored[0][1] == torch.device("cuda:0")


def test_a_gpu_run_whose_checkpoint_lacks_the_device_generator_is_refused(tmp_path):
    _paused(tmp_path / "r")
    ckpt = load_checkpoint(tmp_path / "r")  # as an earlier privopt wrote it: no "cuda" state
    with pytest.raises(ConfigError, match=r"trains on 'cuda:0' but its checkpoint.*holds no state"):
        verify(ckpt, _on_gpu(build_run(cfg(insecure_seed=0))))


# ------------------------------------------------------------------------- module-level values
SCALE = 1.0


def _scaled(x):
    return x * SCALE


class _Global(nn.Module):
    """A model whose forward reads a module-level value through a module-level function."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        return _scaled(self.lin(x.flatten(1)))


def _loss(out, y):
    return nn.functional.cross_entropy(out * SCALE, y, reduction="none")


def test_fingerprints_cover_the_module_level_values_user_code_reads(monkeypatch):
    model, loss = model_fingerprint(_Global()), loss_fingerprint(_loss)
    monkeypatch.setattr(f"{__name__}.SCALE", 3.0)  # e.g. edited in the script between two processes
    assert model_fingerprint(_Global()) != model and loss_fingerprint(_loss) != loss
    monkeypatch.setattr(f"{__name__}.SCALE", 1.0)
    assert model_fingerprint(_Global()) == model and loss_fingerprint(_loss) == loss


SHARED = nn.Parameter(torch.ones(10))  # a trained tensor the forward reads by its global name


class _Shared(_Global):
    def __init__(self):
        super().__init__()
        self.shared = SHARED

    def forward(self, x):
        return super().forward(x) * SHARED


def test_a_trained_tensor_read_by_its_global_name_is_not_a_setting():
    before = model_fingerprint(_Shared())
    with torch.no_grad():
        SHARED.add_(1.0)  # a step updated it (the checkpoint holds its values, as the model's)
    assert model_fingerprint(_Shared()) == before


def test_a_method_replaced_on_the_instance_is_covered():
    a, b = _Global(), _Global()
    a.forward = lambda x: a.lin(x.flatten(1))
    b.forward = lambda x: torch.tanh(b.lin(x.flatten(1)))
    assert len({model_fingerprint(m) for m in (_Global(), a, b)}) == 3


def test_a_resume_refuses_a_model_or_loss_whose_module_level_value_changed(tmp_path, monkeypatch):
    run = tmp_path / "r"
    _paused(run, model=_Global(), loss=_loss)
    monkeypatch.setattr(f"{__name__}.SCALE", 3.0)
    with pytest.raises(ModelError, match="the model's architecture differs"):
        _resume(run, model=_Global(), loss=_loss)
    monkeypatch.setattr(f"{__name__}.SCALE", 1.0)
    assert _resume(run, model=_Global(), loss=_loss)["status"] == "finished"


# ------------------------------------------------------------------------- run metrics
@pytest.fixture
def metric(monkeypatch):
    """Register the run metric ``env-test`` with the given function (as one process, then another,
    would); unregistered afterwards."""
    return lambda fn: monkeypatch.setitem(_RUN_METRICS._entries, "env-test", RunMetric("env-test", fn, "eval", False))


def test_a_resume_refuses_a_run_metric_whose_code_changed(tmp_path, metric):
    run = tmp_path / "r"
    metric(lambda *, data, **kw: {"n_test": len(data.y_test)})
    _paused(run, over={"metrics": ["env-test"]})
    metric(lambda *, data, **kw: {"n_test": 2 * len(data.y_test)})  # another process registered another one
    with pytest.raises(ConfigError, match=r"the code of the run metrics \['env-test'\] differs"):
        _resume(run)
    metric(lambda *, data, **kw: {"n_test": len(data.y_test)})
    assert _resume(run)["status"] == "finished"


def test_a_checkpoint_without_the_metrics_fingerprint_resumes_only_a_run_without_metrics(tmp_path, metric):
    for name, over in (("plain", {}), ("metric", {"metrics": ["env-test"]})):
        metric(lambda *, data, **kw: {"n_test": len(data.y_test)})
        _paused(tmp_path / name, over=over)
        ckpt = load_checkpoint(tmp_path / name)
        del ckpt["provenance"]["code"]["metrics"]  # as an earlier privopt wrote it
        save_checkpoint(tmp_path / name, ckpt)
    assert _resume(tmp_path / "plain")["status"] == "finished"
    with pytest.raises(ConfigError, match="does not record it"):
        _resume(tmp_path / "metric")
