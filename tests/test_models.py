"""privopt.models: shapes, parameter counts, no BatchNorm, seeded init, per-sample independence."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from privopt.errors import ConfigError, ModelError
from privopt.grads import validate_model
from privopt.models import available_models, build_model, count_parameters

SHAPES = [(1, 28, 28), (3, 32, 32), (1, 8, 8)]


def test_registry_lists_models():
    assert available_models() == ["cnn", "logreg", "mlp", "resnet20"]


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn", "resnet20"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_shapes_and_no_batchnorm(name, shape):
    m = build_model(name, input_shape=shape, num_classes=7, seed=0)
    out = m(torch.randn(3, *shape))
    assert out.shape == (3, 7) and torch.isfinite(out).all()
    assert not any(isinstance(mod, nn.modules.batchnorm._BatchNorm) for mod in m.modules())


def test_tabular_models():
    assert build_model("logreg", input_shape=(54,), num_classes=1)(torch.randn(4, 54)).shape == (4, 1)
    assert build_model("mlp", input_shape=(108,), num_classes=2)(torch.randn(4, 108)).shape == (4, 2)
    with pytest.raises(ConfigError, match="image input_shape"):
        build_model("resnet20", input_shape=(54,), num_classes=2)
    with pytest.raises(ConfigError, match="image input_shape"):
        build_model("cnn", input_shape=(54,), num_classes=2)


def test_parameter_counts():
    # MNIST and CIFAR MLPs: 784*128 + 128 + 128*10 + 10 and 3072*128 + 128 + 1280 + 10.
    assert count_parameters(build_model("mlp", input_shape=(1, 28, 28), num_classes=10)) == 101_770
    assert count_parameters(build_model("mlp", input_shape=(3, 32, 32), num_classes=10)) == 394_634
    assert count_parameters(build_model("logreg", input_shape=(54,), num_classes=1)) == 55
    r = count_parameters(build_model("resnet20", input_shape=(3, 32, 32), num_classes=10))
    assert 260_000 < r < 280_000  # He et al.: ResNet20 has 0.27M parameters
    assert count_parameters(build_model("cnn", input_shape=(1, 28, 28), num_classes=10)) < 50_000


def test_resnet20_uses_groupnorm_with_16_groups():
    m = build_model("resnet20", input_shape=(1, 28, 28), num_classes=10)
    gns = [mod for mod in m.modules() if isinstance(mod, nn.GroupNorm)]
    assert len(gns) == 19  # stem + 2 per block * 9 blocks
    assert {g.num_groups for g in gns} == {16}
    convs = [mod for mod in m.modules() if isinstance(mod, nn.Conv2d)]
    assert len(convs) == 19 and convs[0].in_channels == 1
    with pytest.raises(ModelError, match="groups=5"):
        build_model("resnet20", input_shape=(3, 32, 32), num_classes=10, groups=5)


def test_seeded_initialisation_is_deterministic_and_local():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("cnn", input_shape=(3, 32, 32), num_classes=10, seed=1)
    after = torch.rand(1)
    assert torch.equal(before, after)  # seed= does not consume the global RNG
    b = build_model("cnn", input_shape=(3, 32, 32), num_classes=10, seed=1)
    c = build_model("cnn", input_shape=(3, 32, 32), num_classes=10, seed=2)
    for (n, p), (_, q), (_, _r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q), n
    assert any(not torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))
    torch.manual_seed(5)
    d = build_model("mlp", input_shape=(10,), num_classes=2)
    torch.manual_seed(5)
    e = build_model("mlp", input_shape=(10,), num_classes=2)
    assert all(torch.equal(p, q) for p, q in zip(d.parameters(), e.parameters()))


def test_mlp_init_follows_spec():
    m = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, seed=0)
    lin = [mod for mod in m.modules() if isinstance(mod, nn.Linear)]
    assert all(torch.count_nonzero(layer.bias) == 0 for layer in lin)
    # Kaiming normal (fan_in, ReLU gain): std = sqrt(2 / 784)
    assert abs(float(lin[0].weight.detach().std()) - (2 / 784) ** 0.5) < 0.002


def test_unknown_model_and_options():
    with pytest.raises(ConfigError, match="unknown model 'resnet18'.*resnet20"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['hiden'\].*hidden"):
        build_model("mlp", input_shape=(4,), num_classes=2, hiden=3)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("mlp", input_shape=(4,), num_classes=0)


@pytest.mark.parametrize("name,shape", [("cnn", (1, 12, 12)), ("resnet20", (3, 8, 8))])
def test_per_sample_gradients_do_not_mix_samples(name, shape):
    """With GroupNorm a sample's gradient is the same alone or inside a batch (BatchNorm would fail)."""
    m = build_model(name, input_shape=shape, num_classes=3, seed=0)  # train mode: BatchNorm would mix here
    params = {k: v.detach() for k, v in m.named_parameters()}
    x, y = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 1])

    def loss(p, xi, yi):
        out = functional_call(m, p, (xi.unsqueeze(0),))
        return nn.functional.cross_entropy(out, yi.unsqueeze(0))

    batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    alone = grad(loss)(params, x[2], y[2])
    for k in params:
        torch.testing.assert_close(batched[k][2], alone[k], atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- the model validator, per case


class _RunningMean(nn.Module):
    """A custom layer keeping a running mean of its inputs (a data-dependent buffer)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("running_mean", torch.zeros(4))

    def forward(self, x):
        return self.lin(x)


class _TracksStats(nn.Module):
    track_running_stats = True

    def forward(self, x):
        return x


MIXING = {
    "BatchNorm1d": lambda: nn.BatchNorm1d(4),
    "BatchNorm2d": lambda: nn.BatchNorm2d(4),
    "BatchNorm3d": lambda: nn.BatchNorm3d(4),
    "BatchNorm1d-no-stats": lambda: nn.BatchNorm1d(4, track_running_stats=False),  # batch statistics still mix
    "LazyBatchNorm1d": lambda: nn.LazyBatchNorm1d(),
    "LazyBatchNorm2d": lambda: nn.LazyBatchNorm2d(),
    "SyncBatchNorm": lambda: nn.SyncBatchNorm(4),
}
RUNNING_STATS = {
    "InstanceNorm1d": lambda: nn.InstanceNorm1d(4, track_running_stats=True),
    "InstanceNorm2d": lambda: nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
    "InstanceNorm3d": lambda: nn.InstanceNorm3d(4, track_running_stats=True),
    "LazyInstanceNorm2d": lambda: nn.LazyInstanceNorm2d(track_running_stats=True),
    "_RunningMean": _RunningMean,
    "_TracksStats": _TracksStats,
}


@pytest.mark.parametrize("case", list(MIXING))
def test_validator_rejects_sample_mixing_layers(case):
    layer = MIXING[case]()
    with pytest.raises(ModelError) as err:
        validate_model(nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Identity(), layer)))
    msg = str(err.value)
    assert f"layer '1.1' ({type(layer).__name__}) mixes samples across the batch" in msg
    assert "nn.GroupNorm" in msg


@pytest.mark.parametrize("case", list(RUNNING_STATS))
def test_validator_rejects_running_statistics(case):
    layer = RUNNING_STATS[case]()
    with pytest.raises(ModelError) as err:
        validate_model(nn.Sequential(nn.Linear(4, 4), layer))
    msg = str(err.value)
    assert f"layer '1' ({type(layer).__name__}) keeps running statistics of the batch" in msg
    assert "without noise" in msg and "track_running_stats=False" in msg
    if case in ("InstanceNorm1d", "_RunningMean"):
        assert "'running_mean'" in msg


@pytest.mark.parametrize(
    "layer",
    [
        nn.InstanceNorm1d(4),  # per-sample statistics only: fine
        nn.InstanceNorm2d(4, affine=True),
        nn.GroupNorm(2, 4),
        nn.LayerNorm(4),
        nn.LocalResponseNorm(2),
    ],
)
def test_validator_accepts_per_sample_normalisation(layer):
    validate_model(nn.Sequential(nn.Conv1d(2, 4, 3), layer, nn.Flatten(), nn.LazyLinear(2)))


def test_validator_names_the_model_itself_and_empty_models():
    with pytest.raises(ModelError, match=r"^the model \(BatchNorm1d\) mixes samples"):
        validate_model(nn.BatchNorm1d(3))
    with pytest.raises(ModelError, match="no trainable parameters"):
        validate_model(nn.Sequential(nn.ReLU()))


# ---------------------------------------------------------------- logreg's scaled bias


def _ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def test_logreg_bias_scale_is_the_same_function_with_a_scaled_bias():
    torch.manual_seed(0)
    m = build_model("logreg", input_shape=(2, 3), num_classes=3, zero_init=False, bias_scale=8.0)
    w = m[-1].weight.detach()
    x = torch.randn(5, 2, 3)
    expected = x.flatten(1) @ w[:, :6].T + 8.0 * w[:, 6]
    torch.testing.assert_close(m(x), expected)
    plain = build_model("logreg", input_shape=(6,), num_classes=2)
    assert plain[-1].bias is not None and plain[-1].weight.shape == (2, 6)  # s = 1: the ordinary layer


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_logreg_bias_scale_per_sample_gradients_match_an_autograd_loop(engine):
    """Each engine's per-sample gradients and clipped sums of the scaled head equal a per-example loop."""
    from privopt.grads import get_engine

    torch.manual_seed(1)
    m = build_model("logreg", input_shape=(7,), num_classes=2, zero_init=False, bias_scale=16.0).double()
    x, y = torch.randn(6, 7, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1, 0])
    rows = []
    for i in range(6):
        m.zero_grad()
        _ce(m(x[i : i + 1]), y[i : i + 1]).sum().backward()
        rows.append(m[-1].weight.grad.flatten().clone())
    loop = torch.stack(rows)
    # the bias column's gradient is s times the output gradient (an ordinary bias's gradient)
    dz = torch.softmax(m(x), dim=1).detach() - nn.functional.one_hot(y, 2).double()
    torch.testing.assert_close(loop.reshape(6, 2, 8)[:, :, 7], 16.0 * dz)
    eng = get_engine(engine)
    _, g = eng.per_sample_grads(m, _ce, x, y)
    torch.testing.assert_close(g, loop, atol=1e-10, rtol=1e-10)
    clip = 0.5
    s = eng.clipped_sum(m, _ce, x, y, clip=clip)
    factors = (clip / loop.norm(dim=1)).clamp(max=1.0)
    torch.testing.assert_close(s.total, (loop * factors[:, None]).sum(0), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), True, "8"])
def test_logreg_bias_scale_rejects_bad_values(value):
    with pytest.raises(ConfigError, match="bias_scale"):
        build_model("logreg", input_shape=(4,), num_classes=2, bias_scale=value)
    with pytest.raises(ConfigError, match="needs bias=true"):
        build_model("logreg", input_shape=(4,), num_classes=2, bias=False, bias_scale=2.0)
