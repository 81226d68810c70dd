"""Shared fixtures of the DRO algorithm tests: a small classification problem, contexts, models."""

import torch
from torch import nn

from privopt.algorithms.base import RunContext
from privopt.grads import get_engine

N, D = 120, 4


BIG = 1e9  # clip thresholds that never bind


def loss_fn(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def make_data(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    y = ((x[:, 0] + 0.7 * torch.randn(n, generator=g)) > 0.3).long()
    return x, y


def make_ctx(model, *, ledger=None, noise=None, seed=0, data=None):
    x, y = data if data is not None else make_data()
    return RunContext(
        model=model,
        loss_fn=loss_fn,
        x_train=x,
        y_train=y,
        engine=get_engine("vmap"),
        ledger=ledger,
        noise=noise or {},
        noise_rng=torch.Generator().manual_seed(seed + 1),
        sampler_rng=torch.Generator().manual_seed(seed + 2),
    )


def fresh_model(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(D, 2)


def flat_grad_of(model, scalar_fn):
    """Autograd gradient of scalar_fn(model) w.r.t. the model's parameters, flat."""
    model.zero_grad()
    val = scalar_fn(model)
    grads = torch.autograd.grad(val, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def exact_inner(model, x, y, lam, c):
    """Full-data (∇_x h2, ∂_λ h2, h2) for h = exp((ℓ − c)/λ) by autograd."""
    lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
    losses = loss_fn(model(x), y).detach().to(torch.float64)
    h2 = torch.exp((losses - c) / lam_t).mean()
    du = torch.autograd.grad(h2, lam_t)[0]
    v = flat_grad_of(model, lambda m: torch.exp((loss_fn(m(x), y).to(torch.float64) - c) / lam).mean().float())
    return v, float(du), float(h2.detach())


def started(name, *, ledger=None, noise=None, **params):
    """(algorithm set up on the standard problem, its model, the context)."""
    from privopt.algorithms import get_algorithm

    model = fresh_model()
    ctx = make_ctx(model, ledger=ledger, noise=noise)
    algo = get_algorithm(name, **params)
    algo.setup(ctx)
    return algo, model, ctx


# Full batches and thresholds that never bind: the estimators then equal exact full-data quantities.
FULL_DS = dict(N1=N, N2=N, N3=N, N4=N)
NO_CLIP_DS = dict(clip_eta=BIG, clip_x=BIG, gamma_eta=BIG, gamma_x=BIG, weight_cap=BIG)
FULL_RS = dict(b1=N, b2=N, b3=N, b4=N, s_batch=N)
NO_CLIP_RS = dict(clip_v=BIG, clip_u=BIG, clip_s=BIG, gamma_v=BIG, gamma_u=BIG, weight_cap=1e6)
