"""``privopt bench --end-to-end`` when one of its runs (a child process) fails, end to end.

The child registers a user's model that fails quoting a "record" (tests/leaky_launcher.py, loaded
by a ``sitecustomize`` on the child's ``PYTHONPATH``: the cheapest way into a fresh interpreter).
Without ``--debug`` the parent's one line names the failure (type and where) but not its message,
nothing is printed on stdout (no half-written ``--json``), no file keeps it and the exit code is 4
(a run failed); with ``--debug`` or ``PRIVOPT_DEBUG=1`` the message and traceback are shown.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

import privopt
from jobs_helpers import SECRET
from privopt.cli import main
from privopt.errors import DEBUG_ENV

TESTS = Path(__file__).resolve().parent
ARGV = ["bench", "--end-to-end", "--models", "leaky-net", "--e2e-methods", "dp-sgd", "--dataset", "digits",
        "--epochs", "0.1", "--e2e-batch-size", "32", "--repeats", "1", "--threads", "1",
        "--accounting-cache", "off"]  # fmt: skip


@pytest.fixture
def leaky_children(tmp_path, monkeypatch):
    """Child interpreters know the model ``leaky-net``, which fails once training is under way (after
    privopt's probes of the model: their errors are about placeholders, not records); every
    temporary file of parent and children goes under ``tmp_path / "tmp"``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import leaky_launcher\nfrom privopt.models import register_model\n\n"
        "register_model('leaky-net')(leaky_launcher.leaky_net)\n"
    )
    src = str(Path(privopt.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(TESTS), src, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("LEAK_RANK", "0")
    monkeypatch.setenv("LEAK_AFTER", "4")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def _written(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*")) if p.is_file())


def test_a_failed_run_is_one_line_without_its_message_and_exit_4(leaky_children, capfd):
    code = main([*ARGV, "--json"])
    out, err = capfd.readouterr()
    assert SECRET not in out + err and "odd feature" not in err and "Traceback" not in err
    assert out == ""  # no half-written JSON
    assert code == 4
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("privopt: run failed: end-to-end run sgd on leaky-net: ValueError in ")
    assert "leaky_launcher.LeakyNet.forward, called from privopt." in lines[0] and "--debug" in lines[0]
    assert SECRET not in _written(leaky_children)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_failed_run_s_message_and_traceback(leaky_children, capfd, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv(DEBUG_ENV, "1")
    code = main([*(["--debug"] if how == "flag" else []), *ARGV, "--json"])
    out, err = capfd.readouterr()
    assert code == 4 and out == ""
    assert f"ValueError: {SECRET}: odd feature in a batch of " in err
    assert "Traceback (most recent call last)" in err and "leaky_launcher.py" in err


def test_a_user_error_in_a_run_is_quoted_in_full_with_exit_2(leaky_children, capfd):
    """privopt's own errors are public: the parent quotes the child's (a model for images on tabular data)."""
    argv = [{"leaky-net": "cnn", "digits": "breast-cancer"}.get(a, a) for a in ARGV]
    code = main([*argv, "--json"])
    out, err = capfd.readouterr()
    assert code == 2 and out == ""
    own = "model 'cnn' needs image input_shape (C, H, W), got (30,)"  # the child's own error, in full
    assert err == f"privopt: error: end-to-end run sgd on cnn: {own}\n"
