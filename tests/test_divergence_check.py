"""The ψ-divergence self-check (privopt.objectives.divergence_check): each property of the contract
is refused with its message and a witness, every built-in passes, the check runs once per class and
parameters, and a run naming a bad divergence stops before anything is written."""

import math
import re
import sys
from pathlib import Path

import pytest
import torch

import privopt
from dro_helpers import started
from privopt import cli
from privopt.algorithms import get_algorithm
from privopt.errors import ConfigError
from privopt.objectives import (
    KL,
    ChiSquare,
    CVaR,
    Divergence,
    DualObjective,
    KLRegularizedCVaR,
    divergences,
    get_divergence,
)
from privopt.objectives.divergence_check import check_divergence
from privopt.plugins import FILE_MODULE_PREFIX

BUILTINS = [
    ("chi2", {}),
    ("chi2", {"variant": 2}),
    ("chi2_half", {}),
    ("kl", {}),
    *(("kl_cvar", {"alpha": a}) for a in (0.01, 0.1, 0.5, 0.99)),
    *(("cvar", {"alpha": a}) for a in (0.01, 0.2, 0.5, 0.99)),
    *(("cressie_read", {"k": k}) for k in (1.001, 1.01, 1.2, 1.5, 1.9, 1.999, 2.0)),
]


@pytest.fixture(autouse=True)
def _forget_registrations():
    """Drop what a test registered (by a plugin file too), as in a new process."""
    before = dict(divergences.DIVERGENCES._entries)
    modules = set(sys.modules)
    yield
    divergences.DIVERGENCES._entries.clear()
    divergences.DIVERGENCES._entries.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith(FILE_MODULE_PREFIX):
            del sys.modules[name]


@pytest.mark.parametrize("name,params", BUILTINS, ids=[f"{n}{p}" for n, p in BUILTINS])
def test_every_builtin_divergence_passes(name, params):
    div = get_divergence(name, **params)
    check_divergence(div)  # directly too: get_divergence's cache may hold it from another test


def test_the_list_above_covers_every_builtin_divergence():
    builtin = {
        n
        for n in divergences.DIVERGENCES.names()
        if divergences.DIVERGENCES.lookup(n).__module__ == divergences.__name__
    }
    assert builtin == {"chi2", "kl", "kl_cvar", "cvar", "cressie_read"}
    assert builtin <= {n for n, _ in BUILTINS}


# ----------------------------------------------------------------------------- one class per property


class ShiftedChi2(ChiSquare):
    name = "shifted_chi2"

    def psi(self, t):
        return super().psi(t) + 1.0  # ψ(t) = (t−1)² + 1


class EntropyOnly(KL):
    name = "entropy_only"

    def psi(self, t):
        t = torch.as_tensor(t, dtype=torch.float64)  # t log t: ψ(1) = 0 but ψ < 0 on (0, 1)
        return torch.where(t < 0, math.inf, torch.special.xlogy(t, t))


class FiniteLeft(ChiSquare):
    name = "finite_left"

    def psi(self, t):
        return (torch.as_tensor(t, dtype=torch.float64) - 1.0) ** 2


class NanLeft(KL):
    name = "nan_left"

    def psi(self, t):
        t = torch.as_tensor(t, dtype=torch.float64)
        return torch.special.xlogy(t, t) - t + 1.0  # xlogy(t, t) is nan for t < 0


class Burg(Divergence):
    """ψ(t) = t − 1 − log t: a true divergence, but ψ* = −log(1 − s) is +inf for s ≥ 1."""

    name = "burg"

    def psi(self, t):
        t = torch.as_tensor(t, dtype=torch.float64)
        return torch.where(t <= 0, math.inf, t - 1.0 - torch.log(t.clamp(min=1e-300)))

    def psi_grad(self, t):
        return 1.0 - 1.0 / torch.as_tensor(t, dtype=torch.float64)

    def conj(self, s):
        s = torch.as_tensor(s, dtype=torch.float64)
        return torch.where(s < 1, -torch.log1p(-s.clamp(max=0.5)), math.inf)

    def conj_grad(self, s):
        s = torch.as_tensor(s, dtype=torch.float64)
        return torch.where(s < 1, 1.0 / (1.0 - s.clamp(max=0.5)), math.inf)

    def conj_hess(self, s):
        return self.conj_grad(s) ** 2


class OffsetConj(ChiSquare):
    name = "offset_conj"

    def conj(self, s):
        return super().conj(s) + 0.5


class HeavyWeights(KL):
    name = "heavy_weights"

    def conj_grad(self, s):
        return 1.5 * super().conj_grad(s)


class HalfStepCVaR(CVaR):
    name = "half_step_cvar"

    def conj_grad(self, s):
        return 0.5 * (torch.as_tensor(s, dtype=torch.float64) > 0).double()  # (ψ*)'(0+) = 0.5 < 1


class UnclippedChi2(ChiSquare):
    name = "unclipped_chi2"

    def conj_grad(self, s):
        return 1.0 + torch.as_tensor(s, dtype=torch.float64) / 2.0  # negative below s = −2


class FallingWeights(KL):
    name = "falling_weights"

    def conj_grad(self, s):
        s = torch.as_tensor(s, dtype=torch.float64)
        return torch.where(s <= 2.0, torch.exp(s), torch.exp(4.0 - s))


class DoubledKL(KL):
    name = "doubled_kl"

    def conj(self, s):
        return 2.0 * super().conj(s)


class BentWeights(KL):
    name = "bent_weights"

    def conj_grad(self, s):
        s = torch.as_tensor(s, dtype=torch.float64)
        return torch.exp(s) * (1.0 + 0.01 * s**2)  # ≥ 0, increasing, 1 at 0: not ψ*'s derivative


class RaisedKL(KL):
    """ψ* + 0.1 s_+² with its derivatives: consistent, above the conjugate, but not attained."""

    name = "raised_kl"

    def conj(self, s):
        s = torch.as_tensor(s, dtype=torch.float64)
        return super().conj(s) + 0.1 * s.clamp(min=0) ** 2

    def conj_grad(self, s):
        s = torch.as_tensor(s, dtype=torch.float64)
        return super().conj_grad(s) + 0.2 * s.clamp(min=0)

    def conj_hess(self, s):
        s = torch.as_tensor(s, dtype=torch.float64)
        return super().conj_hess(s) + 0.2 * (s > 0)


class NegativeCurvature(KL):
    name = "negative_curvature"

    def conj_hess(self, s):
        return -super().conj_hess(s)


class KLCVaRBaseSmoothness(KLRegularizedCVaR):
    name = "kl_cvar_base_smoothness"
    smoothness = Divergence.smoothness  # assumes (ψ*)'' non-decreasing; it drops to 0 at log(1/α)


class DoubledCurvature(KL):
    name = "doubled_curvature"

    def conj_hess(self, s):
        return 2.0 * super().conj_hess(s)


class CVaRBaseSmoothness(CVaR):
    name = "cvar_base_smoothness"
    smoothness = Divergence.smoothness  # (ψ*)'' = 0 everywhere, but (ψ*)' jumps at 0


class FlatteredKL(KL):
    name = "flattered_kl"

    def smoothness(self, *, s_max=math.inf):
        return 1.0  # e^s > 1 past 0


class OldSmoothness(KL):
    name = "old_smoothness"

    def smoothness(self):
        return math.inf


class ShiftedLogGrad(KL):
    name = "shifted_log_grad"

    def psi_grad(self, t):
        return super().psi_grad(t) + 1.0


class Crashing(KL):
    name = "crashing"

    def conj_hess(self, s):
        raise RuntimeError("not implemented yet")


class Scalar(KL):
    name = "scalar"

    def psi(self, t):
        return 0.0


class Float32KL(KL):
    name = "float32_kl"

    def conj(self, s):
        return super().conj(s).float()


NUM = r"-?[\d.]+(e-?\d+)?"
BAD = [
    (
        ShiftedChi2(),
        r"divergence 'shifted_chi2' \(variant=1\): psi\(1\) = 1\.0, must be 0 \(the uniform distribution is the "
        r"unpenalised optimum\)$",
    ),
    (EntropyOnly(), r"^divergence 'entropy_only': psi\(1e-06\) = -1\.3815510\d*e-05, must be >= 0 for t >= 0"),
    (FiniteLeft(), r"'finite_left' \(variant=1\): psi\(-1000\.0\) = 1002001\.0, must be \+inf for t < 0"),
    (NanLeft(), r"'nan_left': psi\(-1000\.0\) = nan, must be \+inf for t < 0"),
    (Burg(), r"'burg': psi\*\(1\.0\) = inf, must be finite for every s \(psi must grow faster than linearly"),
    (OffsetConj(), r"psi\*\(0\) = 0\.5, must be 0"),
    (HeavyWeights(), r"'heavy_weights': \(psi\*\)'\(0\) = 1\.5, must be 1 \(the uniform distribution"),
    (
        HalfStepCVaR(alpha=0.2),
        r"'half_step_cvar' \(alpha=0\.2\): \(psi\*\)'\(0\) = 0\.0 and \(psi\*\)'\(1e-12\) = 0\.5, must be 1 "
        r"\(at a kink at 0",
    ),
    (UnclippedChi2(), r"\(psi\*\)'\(-30\.0\) = -14\.0, must be >= 0 \(it is the weight"),
    (FallingWeights(), rf"\(psi\*\)'\(2\.0\) = 7\.389{NUM} > \(psi\*\)'\(2\.25\) = 5\.75{NUM}, must be non-decreasing"),
    (DoubledKL(), r"psi\*\(-30\.0\) = -2\.0 < s\*t - psi\(t\) = -1\.0 at t = 0\.0, must be the convex conjugate"),
    (
        BentWeights(),
        rf"\(psi\*\)'\({NUM}\) = {NUM}, but the one-sided difference quotients of psi\* there are {NUM} and "
        rf"{NUM}: \(psi\*\)' must be the derivative of psi\*",
    ),
    (RaisedKL(), rf"at s = 0\.001, t = \(psi\*\)'\(s\) = {NUM}: psi\(t\) \+ psi\*\(s\) - s\*t = 1\.19{NUM}, must be 0"),
    (NegativeCurvature(), rf"\(psi\*\)''\(-20\.5\) = -{NUM}, must be >= 0 \(psi\* is convex\)"),
    (
        KLCVaRBaseSmoothness(alpha=0.1),
        rf"\(psi\*\)''\(2\.25\) = 9\.48{NUM} > \(psi\*\)''\(2\.5\) = 0\.0, must be non-decreasing "
        r"\(Divergence\.smoothness",
    ),
    (DoubledCurvature(), r"\(psi\*\)'' must be the derivative of \(psi\*\)'"),
    (
        CVaRBaseSmoothness(alpha=0.2),
        r"\(psi\*\)' rises from 0\.0 at s = 0\.0 to 5\.0 at s = 0\.001 \(slope 5000\.0\), more than "
        r"smoothness\(s_max=0\.001\) = 0\.0 allows",
    ),
    (FlatteredKL(), r"\(psi\*\)' rises from 1\.0 at s = 0\.0 .* more than smoothness\(s_max=0\.001\) = 1\.0 allows"),
    (OldSmoothness(), r"smoothness\(s_max=\.\.\.\) failed: TypeError"),
    (ShiftedLogGrad(), r"psi'\(1e-06\) = -12\.8\d*, but the one-sided difference quotients of psi there"),
    (Crashing(), r"'crashing': conj_hess failed on a float64 tensor: RuntimeError: not implemented yet"),
    (Scalar(), r"'scalar': psi must work elementwise: shape \(1,\) in, shape \(\) out"),
    (Float32KL(), r"'float32_kl': conj returned torch\.float32 for float64 input, must compute in float64"),
]


@pytest.mark.parametrize("div,message", BAD, ids=[type(d).__name__ for d, _ in BAD])
def test_each_broken_property_is_refused_with_its_message(div, message):
    with pytest.raises(ConfigError, match=message):
        check_divergence(div)
    with pytest.raises(ConfigError, match=message):
        get_divergence(div)  # an instance given to the DRO objectives is checked as a name is


def test_a_registered_bad_divergence_is_refused_by_every_entry_point():
    divergences.register_divergence(ShiftedChi2)
    for build in (
        lambda: get_divergence("Shifted-Chi2"),
        lambda: DualObjective(divergence="shifted_chi2", lam=1.0),
        lambda: get_algorithm("dp-double-spider", divergence="shifted_chi2"),
        lambda: get_algorithm("dp-sgda", divergence="shifted_chi2"),
        lambda: get_algorithm("dp-sgd-joint", divergence="shifted_chi2"),
    ):
        with pytest.raises(ConfigError, match=r"'shifted_chi2' \(variant=1\): psi\(1\) = 1\.0, must be 0"):
            build()


# ----------------------------------------------------------------------------- once, and early


class OnceKL(KL):
    name = "once_kl_test"


def test_the_check_runs_once_per_class_and_parameters_not_per_step(monkeypatch):
    divergences.register_divergence(OnceKL)
    checks, lookups = [], []
    real_check, real_checked = divergences.check_divergence, divergences._checked
    monkeypatch.setattr(divergences, "check_divergence", lambda d: (checks.append(repr(d)), real_check(d))[1])
    monkeypatch.setattr(divergences, "_checked", lambda d: (lookups.append(repr(d)), real_checked(d))[1])
    for name, kw in (
        ("dp-double-spider", dict(steps=6, q=2, N1=60, N2=20, N3=60, N4=20, lam=1.0, eta_init=0.5)),
        ("dp-sgda", dict(steps=6, batch_size=20, lam=1.0)),
    ):
        algo, _, _ = started(name, divergence="once_kl_test", private=False, **kw)
        for t in range(algo.num_steps()):
            algo.step(t)
    assert checks == ["OnceKL()"]  # the first lookup; every later one (and every step) hits the cache
    assert len(lookups) >= 4, lookups
    get_divergence("kl_cvar", alpha=0.123)
    get_divergence("kl_cvar", alpha=0.123)
    get_divergence("kl_cvar", alpha=0.124)
    assert checks[1:] == ["KLRegularizedCVaR(alpha=0.123)", "KLRegularizedCVaR(alpha=0.124)"]


class TemperedKL(KL):
    """τ(t log t − t + 1): valid for τ > 0; keeps τ without listing it in ``params``."""

    name = "tempered_kl_test"

    def __init__(self, *, tau=1.0):
        self.tau = tau

    def psi(self, t):
        return self.tau * super().psi(t)

    def conj(self, s):
        return self.tau * torch.expm1(torch.as_tensor(s, dtype=torch.float64) / self.tau)

    def conj_grad(self, s):
        return torch.exp(torch.as_tensor(s, dtype=torch.float64) / self.tau)

    def conj_hess(self, s):
        return self.conj_grad(s) / self.tau

    def psi_grad(self, t):
        return self.tau * super().psi_grad(t)


def test_the_cache_tells_instances_apart_by_their_attributes():
    divergences.register_divergence(TemperedKL)
    assert get_divergence("tempered_kl_test", tau=0.5).tau == 0.5
    with pytest.raises(ConfigError, match=r"'tempered_kl_test': psi\(0\.0\) = -0\.5, must be >= 0"):
        get_divergence("tempered_kl_test", tau=-0.5)  # same class, same (empty) params: checked anyway


def test_a_failed_check_is_not_cached():
    div = ShiftedChi2()
    for _ in range(2):
        with pytest.raises(ConfigError, match="psi\\(1\\) = 1\\.0"):
            get_divergence(div)


PLUGIN = """\
from privopt.objectives import ChiSquare, register_divergence


@register_divergence
class ShiftedChi2(ChiSquare):
    name = "shifted_chi2"

    def psi(self, t):
        return super().psi(t) + 1.0
"""


def test_a_config_naming_a_bad_divergence_fails_before_anything_is_written(tmp_path, monkeypatch, capsys):
    (tmp_path / "mydiv.py").write_text(PLUGIN)
    (tmp_path / "run.yaml").write_text(
        "plugins: [mydiv.py]\nalgorithm: dp-double-spider\nalgorithm_params: {epochs: 1, divergence: shifted_chi2}\n"
        "model: logreg\ndataset: digits-st\nplots: false\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--config", "run.yaml", "--out", "runs/a"]) == 2
    err = capsys.readouterr().err
    assert "divergence 'shifted_chi2' (variant=1): psi(1) = 1.0, must be 0" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()
    # The same divergence through the Python API (registered by the plugin above): refused before training.
    with pytest.raises(ConfigError, match=r"psi\(1\) = 1\.0"):
        privopt.fit(model="logreg", dataset="digits", algorithm="dp-double-spider", epsilon=1.0, delta=1e-5,
                    divergence="shifted_chi2", out_dir=tmp_path / "runs" / "b", progress=False)  # fmt: skip
    assert not (tmp_path / "runs").exists()


def test_the_docs_example_divergence_passes_for_several_alphas():
    """docs/api.md's capped χ² ("Extending privopt"): the contract's own example passes, kinks and all."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "capped-chi2-example" in b)
    namespace = {"__name__": "docs_example_divergence"}
    exec(compile(block.split("\n\nobjective = ")[0], "docs/api.md", "exec"), namespace)
    for alpha in (0.01, 0.25, 0.5, 0.99):
        check_divergence(namespace["CappedChi2"](alpha=alpha))
    with pytest.raises(ConfigError, match=r"psi\(1\) = inf, must be 0"):
        check_divergence(namespace["CappedChi2"](alpha=2.0))
