"""Gaps a resume closes: a checkpoint of the earlier format is refused for what it is (not blamed on
the model), values a model reads through attribute chains (``config.SCALE``, ``self.cfg.scale``)
are part of its fingerprint and an error names the one that changed, and a resume whose recorded
thread count oversubscribes the usable cores says so on stderr."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from torch import nn

import privopt
import privopt.cores as cores_module
from _run_helpers import cfg, read_record
from privopt.checkpoint import load_checkpoint, save_checkpoint
from privopt.cli import main
from privopt.errors import DataError, ModelError
from privopt.training import train
from privopt.training.fingerprints import model_items
from privopt.training.resume import CHECKPOINT_FORMAT
from privopt.training.rundir import LOCK_NAME

# A user's config module (``import config``), read by the model as ``config.SCALE``.
config = types.ModuleType("resume_gaps_config")
config.SCALE = 1.0


class ReadsModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        return self.lin(x.flatten(1)) * config.SCALE


class ReadsObject(nn.Module):
    """Reads its settings through a plain object it holds: ``self.cfg.scale``."""

    def __init__(self, scale: float = 1.0, cfg=None):
        super().__init__()
        self.lin = nn.Linear(64, 10)
        self.cfg = cfg if cfg is not None else types.SimpleNamespace(scale=scale, name="run")

    def forward(self, x):
        return self.lin(x.flatten(1)) * self.cfg.scale


class Outer(nn.Module):
    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.body = ReadsObject(scale)

    def forward(self, x):
        return self.body(x)


def _paused(run, **kw):
    return train(cfg(insecure_seed=0, **kw.pop("over", {})), out_dir=run, progress=False, max_steps=3, **kw)


def _resume(run, **kw):
    return train(None, out_dir=run, resume=True, progress=False, **kw)


def _files(run: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a run directory (hidden ones too) with its bytes and modification time; not
    the lock file, whose owner's pid each run writes."""
    return {
        str(p.relative_to(run)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


def _as_earlier_format(run: Path) -> None:
    """Rewrite the checkpoint as the previous format wrote it: one model hash, other fingerprints."""
    ckpt = load_checkpoint(run)
    ckpt["format"] = CHECKPOINT_FORMAT - 1
    model = ckpt["provenance"]["model"]
    del model["items"]
    model["fingerprint"] = "0" * 40  # taken otherwise: comparing it would blame the model
    save_checkpoint(run, ckpt)


# ------------------------------------------------------------------------- 1. the format
def test_the_format_was_bumped_with_the_model_items():
    assert CHECKPOINT_FORMAT == 4


def test_an_earlier_format_is_refused_naming_the_format_and_nothing_is_written(tmp_path):
    run = tmp_path / "r"
    _paused(run, model=ReadsModule())
    _as_earlier_format(run)
    before = _files(run)
    with pytest.raises(DataError) as caught:
        _resume(run, model=ReadsModule())
    msg = str(caught.value)
    assert f"an earlier version of privopt (privopt {privopt.__version__}, checkpoint format 3)" in msg
    assert "resumes checkpoint format 4 only" in msg and "start a new run" in msg
    assert "architecture" not in msg
    assert _files(run) == before


def test_the_cli_refuses_an_earlier_format_as_a_user_error_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "r"
    _paused(run)  # digits and logreg, rebuilt from the config
    _as_earlier_format(run)
    before = _files(run)
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("privopt: error: this checkpoint was written by an earlier version")
    assert "checkpoint format 3" in err[0] and "architecture" not in err[0]
    assert _files(run) == before


def test_a_newer_format_says_newer(tmp_path):
    run = tmp_path / "r"
    _paused(run)
    ckpt = load_checkpoint(run)
    ckpt["format"] = CHECKPOINT_FORMAT + 1
    save_checkpoint(run, ckpt)
    with pytest.raises(DataError, match=r"by a newer version of privopt .*checkpoint format 5\)"):
        _resume(run)


def test_a_finished_run_of_the_earlier_format_still_gets_its_outputs_written_again(tmp_path):
    run = tmp_path / "r"
    train(cfg(insecure_seed=0), out_dir=run, progress=False)
    _as_earlier_format(run)
    (run / "record.json").unlink()  # e.g. killed while writing its outputs
    assert _resume(run)["status"] == "finished" and read_record(run)["status"] == "finished"


# ------------------------------------------------------------------------- 2. attribute chains
def _changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def test_a_value_read_through_a_module_is_an_item_of_its_own(monkeypatch):
    before = model_items(ReadsModule())
    monkeypatch.setattr(config, "SCALE", 3.0)
    assert _changed(before, model_items(ReadsModule())) == [f"module-level value {__name__}.config.SCALE"]


def test_a_value_read_through_an_object_the_model_holds_is_an_item_of_its_own():
    before = model_items(ReadsObject(1.0))
    assert _changed(before, model_items(ReadsObject(3.0))) == ["attribute cfg.scale"]
    assert _changed(model_items(Outer(1.0)), model_items(Outer(3.0))) == ["attribute body.cfg.scale"]
    # What forward does not read is not a setting of the model: another name is accepted.
    other = types.SimpleNamespace(scale=1.0, name="another")
    assert _changed(before, model_items(ReadsObject(cfg=other))) == []


class _Counting:
    """A settings object whose ``scale`` is a property: a fingerprint must not run it."""

    reads = 0

    @property
    def scale(self):
        type(self).reads += 1
        return 1.0


def test_attributes_are_read_statically_no_property_runs():
    model = ReadsObject(cfg=_Counting())
    model_items(model)
    assert _Counting.reads == 0
    model(torch.zeros(2, 64))
    assert _Counting.reads == 1  # (forward does run it: the property's code is not covered)


def test_a_resume_names_the_value_read_through_a_module_that_changed(tmp_path, monkeypatch):
    run = tmp_path / "r"
    _paused(run, model=ReadsModule())
    monkeypatch.setattr(config, "SCALE", 3.25)  # e.g. config.py edited between pause and resume
    with pytest.raises(ModelError) as caught:
        _resume(run, model=ReadsModule())
    msg = str(caught.value)
    assert f"in: module-level value {__name__}.config.SCALE." in msg and "3.25" not in msg
    monkeypatch.setattr(config, "SCALE", 1.0)
    assert _resume(run, model=ReadsModule())["status"] == "finished"


def test_a_resume_names_the_value_read_through_an_object_that_changed(tmp_path):
    run = tmp_path / "r"
    _paused(run, model=Outer(1.0))
    with pytest.raises(ModelError, match=r"\(Outer\) in: attribute body\.cfg\.scale\. ") as caught:
        _resume(run, model=Outer(3.25))
    assert "3.25" not in str(caught.value)
    assert _resume(run, model=Outer(1.0))["status"] == "finished"


# ------------------------------------------------------------------------- 4. threads
@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _warnings(tmp_path, monkeypatch, threads, capsys, *, cores: int, jobs: int = 1) -> list[str]:
    """The warning lines of a resume of a run recorded on 2 threads, with ``cores`` usable cores,
    in a worker process of a pool of ``jobs``."""
    threads(2)
    _paused(tmp_path / "r")
    threads(1)
    monkeypatch.setattr(cores_module, "usable_cores", lambda: cores)
    monkeypatch.setattr(cores_module, "_POOL_JOBS", jobs)
    capsys.readouterr()
    _resume(tmp_path / "r")
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("privopt: warning:")]


def test_a_resume_on_more_threads_than_usable_cores_warns_once(tmp_path, monkeypatch, threads, capsys):
    warned = _warnings(tmp_path, monkeypatch, threads, capsys, cores=1)
    assert len(warned) == 1
    assert "runs on the 2 CPU threads the run recorded, more than the 1 usable cores here" in warned[0]


def test_threads_times_worker_processes_are_counted(tmp_path, monkeypatch, threads, capsys):
    warned = _warnings(tmp_path, monkeypatch, threads, capsys, cores=2, jobs=2)
    assert len(warned) == 1 and "in each of 2 worker processes (4 in all), more than the 2 usable cores" in warned[0]


def test_no_warning_when_the_cores_suffice(tmp_path, monkeypatch, threads, capsys):
    assert _warnings(tmp_path, monkeypatch, threads, capsys, cores=2) == []
