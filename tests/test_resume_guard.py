"""A resume refuses to continue on anything it cannot reproduce: another privopt/torch/Python version,
a model whose code or plain attributes changed, an algorithm's or engine's edited code, a rebuilt
run whose record would state another calibration, and checkpoints of an older format."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import privopt
import privopt.training.builder as builder_module
import privopt.training.run as run_module
from _run_helpers import cfg, read_record
from privopt.algorithms.base import register_algorithm
from privopt.algorithms.dpsgd import DPSGD
from privopt.checkpoint import load_checkpoint, save_checkpoint
from privopt.cli import main
from privopt.errors import ConfigError, DataError, ModelError
from privopt.grads import get_engine
from privopt.training import train


def _paused(run, **kw):
    """A run of the tiny default config paused after 3 steps."""
    return train(cfg(insecure_seed=0, **kw.pop("over", {})), out_dir=run, progress=False, max_steps=3, **kw)


def _resume(run, **kw):
    return train(None, out_dir=run, resume=True, progress=False, **kw)


# ------------------------------------------------------------------------- versions
def test_another_privopt_or_torch_version_is_refused_naming_both(tmp_path, monkeypatch):
    run = tmp_path / "r"
    _paused(run)
    before = (run / "record.json").read_bytes()
    monkeypatch.setattr(privopt, "__version__", "9.9.9")
    with pytest.raises(ConfigError, match=r"privopt 0\.1\.0 in the checkpoint, 9\.9\.9 here"):
        _resume(run)
    monkeypatch.setattr(privopt, "__version__", "0.1.0")
    monkeypatch.setattr(torch, "__version__", "0.0.1-other")
    with pytest.raises(ConfigError, match=r"torch \S+ in the checkpoint, 0\.0\.1-other here"):
        _resume(run)
    assert (run / "record.json").read_bytes() == before  # refused before writing anything


def test_allow_version_change_continues_and_the_record_states_it(tmp_path, monkeypatch):
    run = tmp_path / "r"
    _paused(run)
    monkeypatch.setattr(privopt, "__version__", "9.9.9")
    rec = _resume(run, allow_version_change=True, max_steps=2)  # paused again at step 5, under 9.9.9
    change = {"at_step": 3, "from": {"privopt": "0.1.0"}, "to": {"privopt": "9.9.9"}}
    got = [
        {k: (v if k == "at_step" else {"privopt": v["privopt"]}) for k, v in c.items()} for c in rec["version_changes"]
    ]
    assert got == [change] and rec["privopt_version"] == "9.9.9"
    done = _resume(run)  # the same (new) version: no flag needed, the change stays stated
    assert done["status"] == "finished" and read_record(run)["version_changes"] == rec["version_changes"]
    with pytest.raises(ConfigError, match="applies only to a resume"):
        train(cfg(), out_dir=tmp_path / "new", progress=False, allow_version_change=True)


def test_allow_version_change_is_refused_after_a_failure_past_the_checkpoint(tmp_path, monkeypatch):
    run, real_loop = tmp_path / "r", run_module.run_loop

    def failing_loop(step, state, callbacks):  # the run fails at step 7, after its checkpoint at step 5
        def step_or_fail(t):
            if t == 7:
                raise RuntimeError("disk on fire")
            return step(t)

        return real_loop(step_or_fail, state, callbacks)

    monkeypatch.setattr(run_module, "run_loop", failing_loop)
    with pytest.raises(RuntimeError):
        train(cfg(insecure_seed=0), out_dir=run, progress=False)
    monkeypatch.setattr(run_module, "run_loop", real_loop)
    assert read_record(run)["status"] == "failed" and load_checkpoint(run)["step"] == 5
    monkeypatch.setattr(privopt, "__version__", "9.9.9")
    with pytest.raises(ConfigError, match="cannot be honoured.*status 'running', step 5"):
        _resume(run, allow_version_change=True)
    monkeypatch.setattr(privopt, "__version__", "0.1.0")
    assert _resume(run)["status"] == "finished"  # where it started, the run resumes


def test_a_checkpoint_of_the_previous_format_is_refused_clearly(tmp_path):
    run = tmp_path / "r"
    _paused(run)
    ckpt = load_checkpoint(run)
    ckpt["format"] = 2  # as privopt wrote it before it kept the versions and code fingerprints
    for key in ("versions", "code"):
        del ckpt["provenance"][key]
    save_checkpoint(run, ckpt)
    with pytest.raises(DataError, match=r"an earlier version of privopt \(privopt 0\.1\.0, checkpoint format 2\)"):
        _resume(run)


def test_the_cli_refuses_a_version_change_unless_allowed(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    _paused(run)
    monkeypatch.setattr(privopt, "__version__", "9.9.9")
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    assert "privopt 0.1.0 in the checkpoint, 9.9.9 here" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--quiet", "--allow-version-change"]) == 0
    assert read_record(run)["status"] == "finished" and read_record(run)["version_changes"]
    assert main(["train", "--out", str(tmp_path / "new"), "--allow-version-change"]) == 2
    assert "only to --resume" in capsys.readouterr().err


# ------------------------------------------------------------------------- the model
class Scaled(nn.Module):
    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.lin = nn.Linear(64, 10)
        self.scale = scale  # read by forward, not in the repr

    def forward(self, x):
        return self.lin(x.flatten(1)) * self.scale


def _twin(squash: bool) -> nn.Module:
    """Two classes of one name and one source, with different forward()s (a factory's)."""

    class Net(Scaled):
        if squash:

            def forward(self, x):
                return torch.tanh(super().forward(x))

    return Net()


def _from_exec(body: str) -> nn.Module:
    """A class Python has no source of (a notebook's cell run by exec): fingerprinted by its bytecode."""
    space = {"Scaled": Scaled, "torch": torch, "__name__": "notebook_cell"}
    exec(f"class Net(Scaled):\n    def forward(self, x):\n        return {body}\n", space)
    return space["Net"]()


def _hooked(factor: float) -> nn.Module:
    model = Scaled(1.0)
    model.lin.register_forward_hook(lambda module, args, out: out * factor)
    return model


@pytest.mark.parametrize(
    ("first", "other"),
    [
        (lambda: Scaled(1.0), lambda: Scaled(3.0)),
        (lambda: Scaled(1.0), lambda: _hooked(2.0)),
        (lambda: _hooked(1.0), lambda: _hooked(2.0)),
        (lambda: _twin(False), lambda: _twin(True)),
        (lambda: _from_exec("self.lin(x.flatten(1))"), lambda: _from_exec("torch.relu(self.lin(x.flatten(1)))")),
    ],
    ids=["plain-attribute", "hook-added", "hook-changed", "forward", "forward-without-source"],
)
def test_a_model_with_other_code_or_settings_is_refused(tmp_path, first, other):
    run = tmp_path / "r"
    _paused(run, model=first())
    with pytest.raises(ModelError, match=r"code \(forward, its class, hooks\) or settings \(plain attributes\)"):
        _resume(run, model=other())
    assert _resume(run, model=first())["status"] == "finished"  # the same model is still accepted


def test_an_object_for_a_part_the_config_built_is_refused(tmp_path):
    from privopt.data import load_dataset

    run = tmp_path / "r"
    _paused(run)  # digits and logreg from the config
    with pytest.raises(ConfigError, match=r"built its model from its config.*without model="):
        _resume(run, model=Scaled())
    with pytest.raises(ConfigError, match=r"built its dataset from its config.*without dataset="):
        _resume(run, dataset=load_dataset("digits", seed=0))
    assert _resume(run)["status"] == "finished"


# ------------------------------------------------------------------------- code and calibration
@register_algorithm
class GuardTestSGD(DPSGD):
    """A user's algorithm (registered, rebuilt by name on resume)."""

    name = "guard-test-sgd"


@pytest.mark.parametrize("part", ["algorithm", "engine"])
def test_edited_algorithm_or_engine_code_is_refused(tmp_path, monkeypatch, part):
    run = tmp_path / "r"
    _paused(run, over={"algorithm": "guard-test-sgd"})
    cls, method = (GuardTestSGD, "step") if part == "algorithm" else (type(get_engine("auto")), "clipped_sum")
    real = getattr(cls, method)

    def edited(self, *a, **kw):  # e.g. the class's file edited between the two processes
        return real(self, *a, **kw)

    monkeypatch.setattr(cls, method, edited)
    with pytest.raises(ConfigError, match=f"the code of the {part} .* differs"):
        _resume(run)
    monkeypatch.undo()
    assert _resume(run)["status"] == "finished"


def test_a_rebuilt_run_with_another_calibration_is_refused(tmp_path, monkeypatch):
    run = tmp_path / "r"
    _paused(run)
    real = builder_module.calibrate

    def drifted(*a, **kw):  # an accountant that changed without a version bump (an editable install)
        c = real(*a, **kw)
        return dataclasses.replace(c, noise={k: v * 1.01 for k, v in c.noise.items()})

    monkeypatch.setattr(builder_module, "calibrate", drifted)
    with pytest.raises(ConfigError, match=r"differs from the checkpointed one .*calibration\.noise_multipliers"):
        _resume(run)
    assert "version_changes" not in json.loads((run / "record.json").read_text())


# ------------------------------------------------------------------------- across processes
_SET_LITERALS = """
import torch
from torch import nn
from privopt.training.fingerprints import loss_fingerprint, model_fingerprint

def loss(out, y, kind="ce"):
    if kind in {"ce", "cross_entropy", "xent", "nll", "softmax", "logits"}:
        return nn.functional.cross_entropy(out, y, reduction="none")

class Net(nn.Linear):
    def forward(self, x, mode="a"):
        return super().forward(x) if mode in {"a", "b", "c", "d", "e", "f"} else x

print(loss_fingerprint(loss), model_fingerprint(Net(3, 2)))
"""


def test_fingerprints_of_code_with_set_literals_are_the_same_in_every_process():
    """A resume runs in another process, whose string hash seed orders a frozenset constant otherwise."""
    src = str(Path(__file__).resolve().parent.parent / "src")
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=src)
        done = subprocess.run([sys.executable, "-c", _SET_LITERALS], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        outs.add(done.stdout.strip())
    assert len(outs) == 1, outs
