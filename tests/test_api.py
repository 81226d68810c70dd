"""privopt.PrivacyEngine (DP-SGD in your own loop) and privopt.fit: behaviour, privacy plumbing, errors."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import privopt
from privopt.config import RunConfig
from privopt.data import Dataset, load_dataset
from privopt.errors import ConfigError, DataError, ModelError, PrivacyBudgetExceeded
from privopt.grads.ahead import NoiseAhead
from privopt.grads.release import insecure_scale_noise_for_testing, observe_releases
from privopt.models import build_model
from privopt.rng import SecureSource
from privopt.training import train

CE = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")


def toy(n=400, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g)
    return x, (x[:, 0] > 0.5).long()


def kwargs(*, n=400, **over):
    """make_private's arguments for a small valid problem, with ``over`` replacing some."""
    x, y = toy(n)
    model = over.pop("module", None)
    model = nn.Linear(x.shape[1], 2) if model is None else model
    args = dict(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        dataset=(x, y),
        batch_size=40,
        epochs=1,
        epsilon=2.0,
        delta=1e-4,
        max_grad_norm=1.0,
    )
    args.update(over)
    return args


def make(*, model=None, n=400, engine_kw=None, **kw):
    engine = privopt.PrivacyEngine(**(engine_kw or {"accountant": "rdp"}))
    return engine, *engine.make_private(**kwargs(n=n, module=model, **kw))


def run_loop(model, optimizer, loader, passes):
    for _ in range(passes):
        for xb, yb in loader:
            optimizer.zero_grad()
            CE(model(xb), yb).mean().backward()
            optimizer.step()


# ----------------------------------------------------------------------------- the same algorithm as `train`
def test_own_loop_is_privopt_train(tmp_path):
    """Same insecure seed, model initialisation and data: the own loop and `privopt train` (dp-sgd)
    calibrate the same noise, spend the same ε and release bit-identical models."""
    params = {"epochs": 2, "batch_size": 128, "lr": 1.0, "clip": 1.0}
    cfg = RunConfig.from_dict(
        {
            "algorithm": "dp-sgd",
            "dataset": "digits",
            "model": "mlp",
            "seed": 3,
            "insecure_seed": 11,
            "algorithm_params": params,
            "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp"},  # (any accountant: same on both)
            "plots": False,
        }
    )
    rec = train(cfg, out_dir=tmp_path / "run", progress=False)
    released = torch.load(tmp_path / "run" / "model.pt")

    torch.manual_seed(3)  # what build_run does before building the model
    data = load_dataset("digits", seed=3)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    engine = privopt.PrivacyEngine(insecure_seed=11, accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        dataset=data,
        batch_size=128,
        epochs=2,
        epsilon=1.0,
        delta=1e-5,
        max_grad_norm=1.0,
    )
    run_loop(model, optimizer, loader, passes=2)

    assert engine.noise_multiplier == rec["calibration"]["noise_multipliers"]["grad"]
    assert engine.steps_taken == rec["total_steps"] == engine.planned_steps
    assert engine.get_epsilon() == rec["privacy"]["epsilon_spent"] <= 1.0
    for name, value in model.state_dict().items():
        assert torch.equal(value, released[name]), name


# ----------------------------------------------------------------------------- what a step releases
def test_step_releases_clipped_sum_plus_calibrated_noise_over_expected_batch():
    """Each step records one Poisson(q) step, then releases (Σ clip_C(∇l_i) + N(0, (zC)²)) / b:
    with the noise switched off the released gradient equals a per-example autograd loop."""
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    engine, model, optimizer, loader = make(model=model, max_grad_norm=0.05)
    seen, batches = [], []
    xb, yb = next(iter(loader))
    before = [p.detach().clone() for p in model.parameters()]
    with observe_releases(seen.append), pytest.warns(RuntimeWarning), insecure_scale_noise_for_testing(0.0):
        optimizer.step()
    batches.append((xb, yb))
    (event,) = seen
    assert event.noise_std == pytest.approx(engine.noise_multiplier * 0.05)
    assert event.normalizer == 40 and event.sampling.rate == pytest.approx(0.1)
    assert engine.accountant.num_steps == 1

    expected = torch.zeros(sum(p.numel() for p in model.parameters()))
    for i in range(len(yb)):
        model.zero_grad()
        for p, b in zip(model.parameters(), before):
            p.data.copy_(b)
        CE(model(xb[i : i + 1]), yb[i : i + 1]).sum().backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        expected += g * min(1.0, 0.05 / float(g.norm()))
    assert torch.allclose(event.value, expected / 40, atol=1e-6)


def test_poisson_batches_and_the_planned_number_of_steps():
    engine, _, optimizer, loader = make(n=400, epochs=2.5)
    assert engine.planned_steps == math.ceil(2.5 * 400 / 40) == 25
    sizes, per_pass = [], []
    for _ in range(3):  # 2.5 epochs: passes of 10, 10 and 5 batches
        count = 0
        for _, yb in loader:
            sizes.append(len(yb))
            count += 1
            optimizer.step()
        per_pass.append(count)
    assert per_pass == [10, 10, 5] and engine.steps_taken == 25
    assert len(set(sizes)) > 3, "Poisson batches have random sizes"
    assert 30 < sum(sizes) / len(sizes) < 50
    assert engine.get_epsilon() <= 2.0


def test_sample_rate_gives_the_same_calibration_as_batch_size():
    a, *_ = make(batch_size=40)
    b, *_ = make(batch_size=None, sample_rate=0.1)
    assert a.planned_steps == b.planned_steps and a.noise_multiplier == b.noise_multiplier


def test_empty_poisson_batches_still_release_noise():
    engine, model, optimizer, loader = make(n=400, batch_size=1, epochs=0.05)  # q = 1/400: mostly empty
    sizes = []
    for _, yb in loader:
        sizes.append(len(yb))
        optimizer.step()
    assert 0 in sizes and engine.steps_taken == engine.planned_steps == 20
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_budget_guard_refuses_the_step_beyond_the_target():
    engine, model, optimizer, loader = make(epochs=1)
    run_loop(model, optimizer, loader, passes=1)
    with pytest.raises(PrivacyBudgetExceeded):
        for _ in range(50):  # keep going past the plan
            next(iter(loader))
            state = [p.detach().clone() for p in model.parameters()]
            optimizer.step()
    assert all(torch.equal(p, s) for p, s in zip(model.parameters(), state)), "a refused step changes nothing"
    assert engine.get_epsilon() <= 2.0 and engine.steps_taken >= engine.planned_steps


def test_randomness_is_secret_by_default_and_seeded_only_on_request():
    def final(**engine_kw):
        torch.manual_seed(0)
        engine, model, optimizer, loader = make(model=nn.Linear(5, 2), engine_kw=engine_kw)
        run_loop(model, optimizer, loader, passes=1)
        return engine, torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    e1, secret1 = final()
    _, secret2 = final()
    noise = e1._sources["noise"]
    assert isinstance(noise, NoiseAhead) and isinstance(noise.source, SecureSource) and noise.secure
    assert not torch.equal(secret1, secret2)
    _, seeded1 = final(insecure_seed=5)
    _, seeded2 = final(insecure_seed=5)
    assert torch.equal(seeded1, seeded2)


def test_noise_drawn_ahead_is_the_synchronous_stream():
    """The user-loop API draws each step's noise ahead (as ``privopt train`` does): a seeded
    training is bit-identical to one drawing the same source's noise synchronously."""

    def final(ahead: bool):
        torch.manual_seed(0)
        engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=3)
        if not ahead:
            engine._sources["noise"] = engine._sources["noise"].source  # unwrapped: drawn in the step
        model, optimizer, loader = engine.make_private(**kwargs(n=400, module=nn.Linear(5, 2), epochs=2))
        run_loop(model, optimizer, loader, passes=2)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), engine.steps_taken

    (ahead, steps), (sync, steps_sync) = final(True), final(False)
    assert steps == steps_sync > 0 and torch.equal(ahead, sync)


def test_backward_gradient_never_reaches_the_update():
    """Whatever .grad holds (here: a huge non-private gradient) is replaced by the released one."""
    torch.manual_seed(0)
    _, model, optimizer, loader = make(engine_kw={"accountant": "rdp", "insecure_seed": 1})
    next(iter(loader))
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e6)
    optimizer.step()
    assert all(float(p.detach().abs().max()) < 100 for p in model.parameters())


def test_data_loader_map_style_dataset_and_scheduler():
    class Pairs(torch.utils.data.Dataset):
        def __init__(self):
            self.x, self.y = toy(200)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    model = nn.Linear(5, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    engine = privopt.PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=opt,
        data_loader=DataLoader(Pairs(), batch_size=7),  # its batch size is not used
        batch_size=20,
        epochs=1,
        epsilon=2.0,
        delta=1e-3,
        max_grad_norm=1.0,
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for xb, yb in loader:
        assert xb.shape[1:] == (5,) and yb.dtype == torch.int64
        optimizer.step()
        scheduler.step()
    assert engine.steps_taken == 10 and opt.param_groups[0]["lr"] == pytest.approx(0.5 * 0.5**10)
    # the empty-batch path of collated datasets: a batch with no rows, still one (noise-only) step
    engine = privopt.PrivacyEngine(accountant="rdp")
    model = nn.Linear(5, 2)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(Pairs()),
        sample_rate=0.001,
        epochs=0.01,
        epsilon=2.0,
        delta=1e-3,
        max_grad_norm=1.0,
    )
    # each of the 10 Poisson batches is empty with probability 0.999**200 ≈ 0.82: one of them is
    # empty except with probability ≈ 4e-8 (the sampling is secret, so the test cannot pick a seed)
    xb, yb = next((xb, yb) for xb, yb in loader if xb.shape[0] == 0)
    assert xb.shape == (0, 5) and yb.shape == (0,)
    optimizer.step()
    assert engine.steps_taken == 1


# ----------------------------------------------------------------------------- errors
BAD = {
    "batchnorm": (ModelError, dict(module=nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)))),
    "mean loss": (ModelError, dict(criterion=lambda out, y: nn.functional.cross_entropy(out, y))),
    "wrong input size": (ModelError, dict(module=nn.Linear(3, 2))),
    "lengths": (DataError, dict(dataset=(torch.rand(10, 5), torch.zeros(9, dtype=torch.long)))),
    "nan inputs": (DataError, dict(dataset=(torch.full((10, 5), float("nan")), torch.zeros(10, dtype=torch.long)))),
    "empty": (DataError, dict(dataset=(torch.rand(0, 5), torch.zeros(0, dtype=torch.long)))),
    # A DataLoader over a TensorDataset skipped the NaN/inf check that dataset= applies.
    "nan inputs in a loader": (
        DataError,
        dict(
            dataset=None,
            data_loader=DataLoader(TensorDataset(toy()[0].index_fill(0, torch.tensor([3]), float("nan")), toy()[1])),
        ),
    ),
    "inf targets in a loader": (
        DataError,
        dict(
            dataset=None,
            data_loader=DataLoader(
                TensorDataset(toy()[0], toy()[1].float().index_fill(0, torch.tensor([3]), float("inf")))
            ),
        ),
    ),
    "not data": (DataError, dict(dataset="digits")),
    "both data": (DataError, dict(data_loader=DataLoader(TensorDataset(*toy())))),
    "no rate": (ConfigError, dict(batch_size=None)),
    "both rates": (ConfigError, dict(sample_rate=0.1)),
    "batch > n": (ConfigError, dict(batch_size=401)),
    "batch 0": (ConfigError, dict(batch_size=0)),
    "rate 0": (ConfigError, dict(batch_size=None, sample_rate=0.0)),
    "nan epsilon": (ConfigError, dict(epsilon=float("nan"))),
    "large delta": (ConfigError, dict(delta=0.01)),
    "negative epochs": (ConfigError, dict(epochs=-1)),
    "inf clip": (ConfigError, dict(max_grad_norm=float("inf"))),
    "criterion": (ConfigError, dict(criterion=3)),
    "optimizer": (ConfigError, dict(optimizer="sgd")),
    "foreign params": (ConfigError, dict(optimizer=torch.optim.SGD(nn.Linear(5, 2).parameters(), lr=0.1))),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_are_refused_by_name(case):
    error, over = BAD[case]
    with pytest.raises(error):
        privopt.PrivacyEngine(accountant="rdp").make_private(**kwargs(**over))


def test_a_large_delta_error_names_the_keyword_that_allows_it():
    with pytest.raises(ConfigError, match=r"\(allow_large_delta=True\)") as info:
        privopt.PrivacyEngine(accountant="rdp").make_private(**kwargs(delta=0.01))
    # the keyword the message names is the one make_private takes
    privopt.PrivacyEngine(accountant="rdp").make_private(**kwargs(delta=0.01, allow_large_delta=True))
    assert "allow_large=" not in str(info.value)


@pytest.mark.parametrize(
    "targets,torch_says",
    [
        (toy()[1] + 5, "labels out of range"),  # class ids beyond 2 outputs: torch's text quotes one, withheld
        (toy()[1].float(), "dtype"),  # float labels
        (toy()[1][:, None], "target"),  # [N, 1] instead of [N]
    ],
)
def test_bad_targets_are_blamed_on_the_targets_not_the_model(targets, torch_says):
    x, _ = toy()
    with pytest.raises(ModelError) as info:
        privopt.PrivacyEngine(accountant="rdp").make_private(**kwargs(dataset=(x, targets)))
    msg = str(info.value)
    assert msg.startswith("the loss cannot take the model's outputs on the training inputs (shape (2,) per example)")
    assert torch_says in msg
    assert "the model cannot take" not in msg
    assert "Target 5" not in msg and "Target 6" not in msg  # torch's "Target 5 is out of bounds" quotes a label


def test_a_model_the_engine_cannot_differentiate_per_example_is_refused_by_make_private():
    from _run_helpers import PythonGate

    module = nn.Sequential(PythonGate(5), nn.Linear(5, 2))
    with pytest.raises(ModelError, match="cannot compute per-example gradients of the model on the training inputs"):
        privopt.PrivacyEngine(accountant="rdp").make_private(**kwargs(module=module))


def test_nan_learning_rate_and_step_misuse():
    model = nn.Linear(5, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ConfigError, match="learning rate"):
        privopt.PrivacyEngine().make_private(**kwargs(module=model, optimizer=opt))
    engine, model, optimizer, loader = make()
    with pytest.raises(ConfigError, match="new batch"):
        optimizer.step()  # nothing drawn yet
    next(iter(loader))
    optimizer.step()
    with pytest.raises(ConfigError, match="new batch"):
        optimizer.step()  # the same batch twice
    assert engine.steps_taken == 1 == engine.accountant.num_steps
    with pytest.raises(ConfigError, match="already"):
        engine.make_private(**kwargs())


def test_keyword_only():
    with pytest.raises(TypeError):
        privopt.PrivacyEngine().make_private(nn.Linear(5, 2))


def test_import_privopt_is_light():
    code = "import sys, privopt; print('torch' in sys.modules); privopt.PrivacyEngine; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


# ----------------------------------------------------------------------------- fit
def small_data(n=300):
    x, y = toy(n + 100, d=4)
    return Dataset.from_tensors(x[:n], y[:n], x_test=x[n:], y_test=y[n:], num_classes=2, name="mine")


def test_fit_runs_the_shared_loop_with_a_custom_loss(tmp_path):
    calls = []

    def loss(out, y):
        calls.append(len(y))
        return nn.functional.cross_entropy(out, y, reduction="none")

    model = nn.Linear(4, 2)
    before = model.weight.detach().clone()
    record = privopt.fit(
        model=model,
        loss=loss,
        dataset=small_data(),
        algorithm="dp-sgd",
        epsilon=1.0,
        delta=1e-4,
        accountant="rdp",
        out_dir=tmp_path / "run",
        epochs=1,
        batch_size=50,
        lr=0.5,
    )
    assert record["status"] == "finished" and record["privacy"]["epsilon_spent"] <= 1.0
    assert record["config"]["loss"] == "custom" and calls and not torch.equal(model.weight, before)
    assert (tmp_path / "run" / "record.json").exists()


def test_a_run_with_its_own_loss_resumes_only_with_it(tmp_path):
    cfg = RunConfig.from_dict(
        {"algorithm": "dp-sgd", "algorithm_params": {"epochs": 1, "batch_size": 50}, "plots": False,
         "privacy": {"epsilon": 1.0, "delta": 1e-4, "accountant": "rdp"}}
    )  # fmt: skip
    kw = dict(dataset=small_data(), model=nn.Linear(4, 2))
    rec = train(cfg, out_dir=tmp_path / "run", progress=False, max_steps=2, loss=CE, **kw)
    assert rec["status"] == "paused" and rec["config"]["loss"] == "custom"
    with pytest.raises(ConfigError, match="loss"):
        train(None, out_dir=tmp_path / "run", resume=True, **kw)
    rec = train(None, out_dir=tmp_path / "run", resume=True, loss=CE, progress=False, **kw)
    assert rec["status"] == "finished"


@pytest.mark.parametrize(
    "over,error,match",
    [
        ({"algorithm": "nope"}, ConfigError, "unknown algorithm"),
        ({"delta": None}, ConfigError, "delta"),
        ({"algorithm": "sgd"}, ConfigError, "not private"),
        ({"lr": float("nan")}, ConfigError, "lr"),
        ({"batch_size": -3}, ConfigError, "batch_size"),
        ({"learning_rate": 0.1}, ConfigError, "learning_rate"),
        ({"dataset": (torch.rand(4, 4), torch.zeros(4))}, Exception, "Dataset"),
        ({"model": "no-such-model"}, ConfigError, "no-such-model"),
        ({"loss": 7}, ConfigError, "criterion"),
    ],
)
def test_fit_refuses_bad_arguments(over, error, match):
    kw = dict(model=nn.Linear(4, 2), dataset=small_data(), algorithm="dp-sgd", epsilon=1.0, delta=1e-4)
    kw.update(over)
    with pytest.raises(error, match=match):
        privopt.fit(**kw)
