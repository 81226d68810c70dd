"""Progress "auto" (``progress=None``, the default of ``privopt.fit``): a bar only on a terminal and
only for a run that lasts, silent in tests, notebooks and logs."""

import inspect
import io
import sys
import time

import pytest
import torch

import privopt
from privopt.data import Dataset
from privopt.training import LoopState, run_loop
from privopt.training.callbacks import ProgressCallback


class Tty(io.StringIO):
    def isatty(self):
        return True


def _loop(stream, *, enabled, steps=20, step_s=0.0):
    def step(t):
        time.sleep(step_s)
        return {}

    run_loop(
        step, LoopState(step=0, total=steps), [ProgressCallback(desc="x", summary=dict, enabled=enabled, stream=stream)]
    )
    return stream.getvalue()


def test_auto_is_silent_when_the_stream_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(ProgressCallback, "AUTO_DELAY_S", 0.0)
    assert _loop(io.StringIO(), enabled=None) == ""
    assert "x: step 20/20 (100%)" in _loop(io.StringIO(), enabled=True)  # True still prints lines


def test_auto_shows_a_bar_on_a_terminal_only_once_the_run_has_lasted(monkeypatch):
    assert _loop(Tty(), enabled=None, steps=5) == ""  # over before the default delay
    monkeypatch.setattr(ProgressCallback, "AUTO_DELAY_S", 0.05)
    assert _loop(Tty(), enabled=None, steps=2) == ""
    shown = _loop(Tty(), enabled=None, steps=10, step_s=0.02)
    assert "\r" in shown and "x:" in shown and "step 10/10" not in shown  # a tqdm bar, not lines
    assert _loop(Tty(), enabled=False, steps=10, step_s=0.02) == ""
    assert "\r" in _loop(Tty(), enabled=True, steps=2)  # True: a bar at once


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 4, generator=g)
    y = (x[:, 0] > 0.5).long()
    return Dataset.from_tensors(x[:200], y[:200], x_test=x[200:], y_test=y[200:], num_classes=2)


@pytest.mark.parametrize(
    ("stream", "progress", "expect"),
    [(Tty, None, "bar"), (io.StringIO, None, ""), (Tty, False, ""), (io.StringIO, True, "lines")],
)
def test_fit_progress_defaults_to_auto(monkeypatch, stream, progress, expect):
    assert inspect.signature(privopt.fit).parameters["progress"].default is None
    monkeypatch.setattr(ProgressCallback, "AUTO_DELAY_S", 0.0)
    err = stream()
    monkeypatch.setattr(sys, "stderr", err)
    kw = {} if progress is None else {"progress": progress}
    rec = privopt.fit(model=torch.nn.Linear(4, 2), dataset=_data(), epsilon=1.0, delta=1e-4, epochs=1, **kw)
    assert rec["status"] == "finished"
    out = "".join(ln for ln in err.getvalue().splitlines(keepends=True) if "dp-sgd" in ln)
    if expect == "bar":
        assert "\r" in out and "dp-sgd: step" not in out
    elif expect == "lines":
        assert "dp-sgd: step" in out and "\r" not in out
    else:
        assert out == ""
