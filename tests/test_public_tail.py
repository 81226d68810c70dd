"""What a parent quotes of a failed torchrun launch: the child's error, not torchrun's own report."""

import subprocess

import pytest

from _run_helpers import torchrun
from privopt.errors import DEBUG_ENV
from privopt.quiet import public_tail

SECRET = "row 3 holds 7.25"

# torchrun 2.x's stderr when its one worker raised (trimmed: the launcher's traceback is longer).
TORCHRUN_STDERR = f"""Traceback (most recent call last):
  File "fail_child.py", line 1, in <module>
    raise ValueError("{SECRET}")
ValueError: {SECRET}
E1125 07:30:05.750000 5849 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
fail_child.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_07:30:05
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 5854)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""  # noqa: W291  (torchrun's line ends with a space)


def test_debugging_quotes_the_childs_error_not_torchruns_report(monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert public_tail(TORCHRUN_STDERR) == f"ValueError: {SECRET}"
    assert public_tail("privopt: failed: x\n" + "=" * 60 + "\n***\n") == "privopt: failed: x"
    assert public_tail("=" * 60 + "\n") == "?"


def test_without_debugging_the_childs_error_type_only():
    quoted = public_tail(TORCHRUN_STDERR)
    assert quoted.startswith("ValueError (its message may quote private data") and SECRET not in quoted
    own = "privopt: failed: ValueError in m.f (its message and traceback ...)"
    assert public_tail(f"{own}\n{TORCHRUN_STDERR}") == own
    assert public_tail("ValueError: x\n---\n").startswith("ValueError (")


def test_a_real_torchrun_failure(tmp_path, monkeypatch):
    """Against the installed torchrun's own wording, not a copy of it."""
    child = tmp_path / "child.py"
    child.write_text(f"raise ValueError({SECRET!r})\n")
    proc = subprocess.run(
        [torchrun(), "--standalone", "--nproc_per_node=1", str(child)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and "ChildFailedError" in proc.stderr
    assert public_tail(proc.stderr).startswith("ValueError (")
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert public_tail(proc.stderr) == f"ValueError: {SECRET}"


@pytest.mark.parametrize("line", ["=" * 60, "-" * 60, "*" * 50, "~~~"])
def test_decorative_rules_are_never_the_quote(line, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert public_tail(f"KeyError: 'a'\n{line}\n") == "KeyError: 'a'"
