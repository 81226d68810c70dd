"""The reference engine against a per-example autograd loop, and clipping properties."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from privopt.errors import ConfigError, ModelError
from privopt.grads import clip_factors, get_engine, validate_model
from privopt.grads.flat import flat_params, params_from_flat, set_flat_grad


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def small_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.GroupNorm(1, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))


def loop_grads(model, x, y, params=None):
    """Oracle: one autograd call per example."""
    if params is not None:
        saved = flat_params(model)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(params[n])
    rows, losses = [], []
    for i in range(x.shape[0]):
        model.zero_grad()
        loss = ce(model(x[i : i + 1]), y[i : i + 1]).sum()
        loss.backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        losses.append(loss.detach())
    if params is not None:
        with torch.no_grad():
            for n, p in params_from_flat(model, saved).items():
                dict(model.named_parameters())[n].copy_(p)
    return torch.stack(losses), torch.stack(rows)


def test_per_sample_grads_match_autograd_loop():
    model = small_net()
    x, y = torch.randn(6, 1, 6, 6), torch.randint(0, 4, (6,))
    losses, g = get_engine("vmap").per_sample_grads(model, ce, x, y)
    ref_l, ref_g = loop_grads(model, x, y)
    torch.testing.assert_close(losses, ref_l, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g, ref_g, rtol=1e-5, atol=1e-6)


def test_weighted_difference_matches_loop():
    model = small_net()
    x, y = torch.randn(5, 1, 6, 6), torch.randint(0, 4, (5,))
    prev = {n: p.detach() + 0.05 * torch.randn_like(p) for n, p in model.named_parameters()}
    w = lambda loss: torch.exp(loss / 2)
    res = get_engine("vmap").clipped_sum(model, ce, x, y, clip=1e9, weights=w, params_prev=prev, weights_prev=w)
    l1, g1 = loop_grads(model, x, y)
    l0, g0 = loop_grads(model, x, y, params=prev)
    diff = w(l1)[:, None] * g1 - w(l0)[:, None] * g0
    torch.testing.assert_close(res.total, diff.sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res.norms.float(), diff.norm(dim=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.losses_prev, l0, rtol=1e-5, atol=1e-6)


def test_model_is_not_modified():
    model = small_net()
    before = flat_params(model).clone()
    x, y = torch.randn(3, 1, 6, 6), torch.randint(0, 4, (3,))
    prev = {n: p.detach() + 1.0 for n, p in model.named_parameters()}
    get_engine("vmap").clipped_sum(model, ce, x, y, clip=1.0, params_prev=prev)
    assert torch.equal(flat_params(model), before)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 7),
    clip=st.floats(1e-3, 10.0),
    scale=st.floats(0.1, 100.0),
    seed=st.integers(0, 10_000),
)
def test_clipped_terms_never_exceed_c(batch, clip, scale, seed):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    x, y = scale * torch.randn(batch, 4), torch.randint(0, 3, (batch,))
    engine = get_engine("vmap")
    _, g = engine.per_sample_grads(model, ce, x, y)
    clipped = g * clip_factors(g.norm(dim=1), clip)[:, None]
    assert (clipped.norm(dim=1) <= clip * (1 + 1e-5)).all()
    res = engine.clipped_sum(model, ce, x, y, clip=clip)
    torch.testing.assert_close(res.total, clipped.sum(0), rtol=1e-5, atol=1e-6)
    assert res.total.norm() <= batch * clip * (1 + 1e-5)


def test_neighbouring_datasets_move_clipped_sum_by_at_most_c():
    """Add/remove one (even adversarial) record: the pre-noise sum moves by <= C; replace: <= 2C."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    engine, clip = get_engine("vmap"), 0.7
    x, y = torch.randn(20, 5), torch.randint(0, 2, (20,))
    outlier_x, outlier_y = 1e3 * torch.ones(1, 5), torch.tensor([1])
    base = engine.clipped_sum(model, ce, x, y, clip=clip).total
    added = engine.clipped_sum(model, ce, torch.cat([x, outlier_x]), torch.cat([y, outlier_y]), clip=clip).total
    replaced = engine.clipped_sum(
        model, ce, torch.cat([x[:-1], outlier_x]), torch.cat([y[:-1], outlier_y]), clip=clip
    ).total
    assert (added - base).norm() <= clip * (1 + 1e-5)
    assert (replaced - base).norm() <= 2 * clip * (1 + 1e-5)
    prev = {n: p.detach() + 0.3 for n, p in model.named_parameters()}
    d0 = engine.clipped_sum(model, ce, x, y, clip=clip, params_prev=prev).total
    d1 = engine.clipped_sum(
        model, ce, torch.cat([x, outlier_x]), torch.cat([y, outlier_y]), clip=clip, params_prev=prev
    ).total
    assert (d1 - d0).norm() <= clip * (1 + 1e-5)


def test_batchnorm_rejected_and_bad_inputs():
    with pytest.raises(ModelError, match="BatchNorm2d"):
        validate_model(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)))
    with pytest.raises(ConfigError, match="unknown gradient engine"):
        get_engine("nope")
    with pytest.raises(ConfigError, match="clip threshold"):
        clip_factors(torch.ones(2), 0.0)
    with pytest.raises(ConfigError, match="weights must have the losses' shape"):
        get_engine("vmap").clipped_sum(
            nn.Linear(2, 2), ce, torch.randn(3, 2), torch.zeros(3, dtype=torch.long), clip=1.0, weights=torch.ones(4)
        )


def test_set_flat_grad_roundtrip():
    model = small_net()
    flat = torch.randn(sum(p.numel() for p in model.parameters()))
    set_flat_grad(model, flat)
    torch.testing.assert_close(torch.cat([p.grad.reshape(-1) for p in model.parameters()]), flat)


class _CountsMeans(nn.Module):
    """Updates a buffer from the batch in its forward pass (a hand-written running statistic)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.register_buffer("avg", torch.zeros(4))

    def forward(self, x):
        h = self.lin(x)
        if self.training:
            self.avg.mul_(0.9).add_(0.1 * h.detach().mean(0))
        return h


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_engines_refuse_buffers_updated_in_the_forward_pass(engine):
    model = nn.Sequential(_CountsMeans(), nn.Linear(4, 2))
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    with pytest.raises(ModelError, match="running"):
        get_engine(engine).clipped_sum(model, ce, x, y, clip=1.0)
    model.eval()  # the same module in eval mode leaves its buffer alone: accepted
    get_engine(engine).clipped_sum(model, ce, x, y, clip=1.0)
