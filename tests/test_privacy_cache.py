"""The on-disk accounting cache: a cached noise equals a fresh one, a bad entry is never trusted."""

from __future__ import annotations

import json

import pytest
from tests._run_helpers import cfg, read_record

from privopt.privacy import Inventory, PlannedStep, Poisson, PrivacyLedger, calibrate, epsilon_of
from privopt.privacy import accountant as acc_mod
from privopt.privacy import cache as cache_mod
from privopt.privacy import calibration as cal_mod
from privopt.training import train


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """The accounting cache in a fresh directory; in-process caches emptied before and after."""
    root = tmp_path / "acache"
    monkeypatch.setenv("PRIVOPT_ACCOUNTING_CACHE", str(root))
    forget()
    yield root
    forget()


def forget():
    cal_mod._CACHE.clear()
    acc_mod._epsilon_cached.cache_clear()


def inventory(steps=300, rate=0.013):
    return Inventory((PlannedStep(Poisson(rate), (("grad", 1.0),), steps),))


def entries(root, kind):
    return sorted((root / kind).glob("*.json"))


class Calls:
    """Counts full calibrations (a cache hit makes none)."""

    def __init__(self, monkeypatch):
        self.n = 0
        run = cal_mod._Calibrator.run

        def counted(this, accountant):
            self.n += 1
            return run(this, accountant)

        monkeypatch.setattr(cal_mod._Calibrator, "run", counted)


def test_a_cached_noise_equals_a_fresh_one_and_costs_no_search(disk, monkeypatch):
    calls = Calls(monkeypatch)
    first = calibrate(inventory(), epsilon=1.2, delta=1e-6)
    assert calls.n == 1 and len(entries(disk, "calibration")) == 1 and entries(disk, "epsilon")
    forget()  # a new process: only the disk remembers
    again = calibrate(inventory(), epsilon=1.2, delta=1e-6)
    assert calls.n == 1 and again == first
    monkeypatch.setenv("PRIVOPT_ACCOUNTING_CACHE", "off")
    forget()
    fresh = calibrate(inventory(), epsilon=1.2, delta=1e-6)
    assert calls.n == 2 and fresh == first and fresh.epsilon <= 1.2


@pytest.mark.parametrize(
    "change",
    [
        dict(epsilon=1.3),
        dict(delta=1e-7),
        dict(accountant="rdp"),
        dict(inv=inventory(steps=301)),
        dict(inv=inventory(rate=0.014)),
        dict(ratios={"grad": 2.0}),
    ],
)
def test_every_input_is_part_of_the_key(disk, monkeypatch, change):
    base = dict(inv=inventory(), epsilon=1.2, delta=1e-6)
    calibrate(base.pop("inv"), **base)
    forget()
    calls = Calls(monkeypatch)
    kw = dict(dict(inv=inventory(), epsilon=1.2, delta=1e-6), **change)
    got = calibrate(kw.pop("inv"), **kw)
    assert calls.n == 1 and got.epsilon <= kw["epsilon"]


def test_a_new_accountant_code_never_reads_old_answers(disk, monkeypatch):
    calibrate(inventory(), epsilon=1.2, delta=1e-6)
    forget()
    monkeypatch.setattr(cache_mod, "code_fingerprint", lambda: "another version of privopt.privacy")
    calls = Calls(monkeypatch)
    calibrate(inventory(), epsilon=1.2, delta=1e-6)
    assert calls.n == 1


def test_corrupt_entries_are_ignored_and_recomputed(disk, monkeypatch):
    first = calibrate(inventory(), epsilon=1.2, delta=1e-6)
    for path in entries(disk, "calibration") + entries(disk, "epsilon"):
        path.write_text(path.read_text()[:-7])  # a torn write
    forget()
    calls = Calls(monkeypatch)
    assert calibrate(inventory(), epsilon=1.2, delta=1e-6) == first and calls.n == 1


def test_an_entry_with_a_bad_checksum_is_ignored(disk):
    step_counts = inventory().steps_for({"grad": 1.1})
    exact = epsilon_of(step_counts, delta=1e-6)
    (path,) = entries(disk, "epsilon")
    entry = json.loads(path.read_text())
    entry["value"]["epsilon"] = exact.epsilon / 2  # a smaller epsilon, without the matching checksum
    path.write_text(json.dumps(entry))
    forget()
    assert epsilon_of(step_counts, delta=1e-6) == exact


def test_a_stored_noise_too_small_for_the_target_is_never_used(disk, monkeypatch):
    first = calibrate(inventory(), epsilon=1.2, delta=1e-6)
    (path,) = entries(disk, "calibration")
    entry = json.loads(path.read_text())
    key = json.loads(entry["key"])["key"]
    weak = dict(entry["value"], scale=first.scale / 2, noise={"grad": first.scale / 2})
    cal_mod._DISK.put(key, weak)  # a well-formed entry (valid checksum) claiming half the noise
    forget()
    calls = Calls(monkeypatch)
    again = calibrate(inventory(), epsilon=1.2, delta=1e-6)
    assert calls.n == 1 and again == first


def test_an_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PRIVOPT_ACCOUNTING_CACHE", str(blocker / "cache"))
    forget()
    assert calibrate(inventory(), epsilon=1.2, delta=1e-6).epsilon <= 1.2
    assert blocker.read_text() == "not a directory"
    forget()


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVOPT_CACHE", str(tmp_path))
    monkeypatch.setenv("PRIVOPT_ACCOUNTING_CACHE", "off")
    forget()
    calibrate(inventory(), epsilon=1.2, delta=1e-6)
    assert cache_mod.cache_root() is None and not list(tmp_path.iterdir())
    monkeypatch.delenv("PRIVOPT_ACCOUNTING_CACHE")
    assert cache_mod.cache_root() == tmp_path / "accounting"
    forget()


def test_training_rows_bound_epsilon_and_the_final_one_is_exact(tmp_path):
    rec = train(cfg(eval_every=2, plots=False), out_dir=tmp_path / "run", progress=False)
    exact = PrivacyLedger.from_dict(rec["privacy"]["ledger"])
    spent = [h["epsilon_spent"] for h in rec["history"]]
    assert spent == sorted(spent) and spent[-1] == exact.epsilon() == rec["privacy"]["epsilon_spent"]
    assert rec["metrics"]["epsilon_spent"] == exact.epsilon() <= 2.0
    # every earlier row is a valid (RDP) upper bound on what was spent at that step
    counts = list(exact.counts.items())
    assert len(counts) == 1
    (step, _), middle = counts[0], rec["history"][len(spent) // 2]
    pld = epsilon_of({step: middle["step"]}, delta=1e-5, accountant="pld").epsilon
    assert pld <= middle["epsilon_spent"] <= pld * 1.5
    assert read_record(tmp_path / "run")["privacy"]["epsilon_spent"] == exact.epsilon()
