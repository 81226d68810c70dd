"""A torchrun run that fails, end to end: one process per client (gloo, 2 processes) with a user's
model that fails on one rank (tests/leaky_launcher.py), quoting a "record" in its message.

Without ``--debug`` neither the console nor any file written (the run's outputs, torchrun's own
temporary files) quotes it: the failed rank prints one line (type and where), exits 4 and torchrun
reports that exit code; with ``--debug`` or ``PRIVOPT_DEBUG=1`` the message is shown. A rank that
dies outright does not leave the others waiting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import privopt
from _run_helpers import torchrun
from jobs_helpers import SECRET
from privopt.errors import DEBUG_ENV
from privopt.quiet import PEER_FAILED, public_tail

LAUNCHER = Path(__file__).with_name("leaky_launcher.py")
TIMEOUT_S = 90  # a hang fails the test, not the suite (a run takes ~10 s)


def _config() -> dict:
    params = {"clients": 2, "epochs": 1, "b1": 64, "b2": 16, "lr": 0.2, "max_steps": 8, "kappa": 0.05}
    return {
        "algorithm": "gauss-psgd",
        "algorithm_params": params,
        "dataset": "digits",
        "model": "leaky-net",
        "privacy": {"epsilon": 2.0, "delta": 1e-5},
        "insecure_seed": 3,
        "plots": False,
    }


def _launch(tmp_path: Path, *pre: str, rank: int, how: str = "raise", debug_env: bool = False):
    """torchrun with 2 processes, rank ``rank`` failing ``how``; (process, seconds taken)."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(_config()))
    src = str(Path(privopt.__file__).resolve().parents[1])  # this checkout's privopt in every rank
    env = {k: v for k, v in os.environ.items() if k != DEBUG_ENV}
    env.update(LEAK_RANK=str(rank), LEAK_HOW=how, TMPDIR=str(tmp_path / "tmp"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
    if debug_env:
        env[DEBUG_ENV] = "1"
    cmd = [torchrun(), "--standalone", "--nproc_per_node=2", str(LAUNCHER), *pre, "train",
           "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run"), "--quiet"]  # fmt: skip
    t0 = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path) as p:
        try:
            out, err = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.terminate()  # torchrun stops its workers (each in a session of its own) before it exits
            out, err = p.communicate(timeout=60)
            pytest.fail(f"torchrun still ran after {TIMEOUT_S} s (a rank waits for a failed one):\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), time.monotonic() - t0


def _written(root: Path) -> str:
    """Every file under ``root`` (the run's outputs and torchrun's temporary files), as text."""
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*")) if p.is_file())


def _exit_codes(stderr: str) -> dict[int, int]:
    """Each failed rank's exit code, from torchrun's report. A rank still exiting when torchrun stops
    the others (once it saw one fail) shows -15 (SIGTERM): which one that is, is a race."""
    found = re.findall(r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", stderr)
    return {int(r): int(c) for r, c in found}


def _privopt_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("privopt: ")]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0])
def test_a_failing_rank_prints_one_line_exits_4_and_quotes_nothing(tmp_path, rank):
    proc, seconds = _launch(tmp_path, rank=rank)
    assert seconds < 60, f"the other rank waited {seconds:.0f} s for the failed one"
    console = proc.stdout + proc.stderr
    assert SECRET not in console and "odd feature" not in console
    assert SECRET not in _written(tmp_path)
    assert proc.returncode == 1  # torchrun's code for a failed worker; the worker's own is in its report
    codes = _exit_codes(proc.stderr)
    assert set(codes) <= {0, 1} and set(codes.values()) <= {4, -15} and 4 in codes.values(), codes
    failed, *others = sorted(_privopt_lines(proc.stderr), key=lambda ln: "ValueError" not in ln)
    assert failed.startswith("privopt: failed: ValueError in __main__.LeakyNet.forward, called from privopt.")
    assert "--debug" in failed
    left = f"privopt: run failed: client process {1 - rank}: the "  # sum or broadcast it was waiting in
    assert others == [] or [ln.startswith(left) and PEER_FAILED in ln for ln in others] == [True]  # unless stopped
    assert public_tail(proc.stderr) == failed  # what `privopt reproduce sosp --launcher torchrun` quotes
    # the server (rank 0) writes the run's record: the run failed, and why as far as that is public
    reason = json.loads((tmp_path / "run" / "record.json").read_text())["reason"]
    assert reason.startswith("ValueError (its message is not" if rank == 0 else "RunFailed: client process 0: the sum")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_failing_rank_s_message(tmp_path, how):
    proc, _ = _launch(tmp_path, *(["--debug"] if how == "flag" else []), rank=1, debug_env=how == "env")
    assert proc.returncode == 1 and 4 in _exit_codes(proc.stderr).values()
    assert f"ValueError: {SECRET}: odd feature in a batch of " in proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr


@pytest.mark.slow
def test_a_rank_that_dies_does_not_leave_the_other_waiting(tmp_path):
    proc, seconds = _launch(tmp_path, rank=1, how="kill")
    assert seconds < 60, f"the surviving rank waited {seconds:.0f} s"
    assert proc.returncode == 1 and "Signal 9 (SIGKILL)" in proc.stderr
    assert _exit_codes(proc.stderr)[1] == -9 and _exit_codes(proc.stderr).get(0, 4) in (4, -15)
    # the survivor noticed by itself (not stopped by torchrun after its grace period) and said so
    assert "privopt: run failed: client process 0: the sum with the other client processes failed" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr + _written(tmp_path)
