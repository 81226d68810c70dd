"""Private model selection's releases on neighbouring held-out sets, every Lanczos step of every candidate.

``sel-curv`` with ``method="lanczos"`` queries per-record Hessian-vector products along Lanczos
vectors built from the earlier *noisy* releases, so a noiseless replay of a neighbour would query
other vectors. Here a private run on D (real noise, insecure seeds) records every client's releases
and the neighbour D' is replayed on D's transcript (``tests/replay_helpers.py``): each release of
D' hands the server D's message, so both worlds see the same public history and query the same
vectors at the same candidates, and only the clients' pre-noise statistics differ. Each statistic
of the client whose held-out set differs must move by at most what its ledger charged the release
for (noise std / the recorded dp_accounting event's multiplier: the bound times the relation's
factor, read, not restated); the other client's statistics must not move; the noise and the
accounting must be the same in both worlds. Records: far along the first layer's null space (the
hidden units do not saturate, so the curvature grows with the square of the norm: clipped at every
step), a mislabelled record with features ±1e6, float32's largest, zero; added or removed (both ways) and
replaced (label flipped, swapped for zero or for an ordinary record).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from privopt.algorithms.federation import Client, Federation
from privopt.algorithms.private_selection import PrivateModelSelection
from privopt.distributed import LocalComm
from privopt.grads.flat import flat_params
from privopt.grads.release import PrivateBatch, observe_releases
from privopt.grads.sums import as_bounded
from privopt.privacy import calibrate, make_ledger
from privopt.rng import TorchSource
from replay_helpers import Release, Transcript, accounted_sensitivity, charged, flat, spent
from wg_helpers import ce

SEL = dict(alpha=1e-9, rho=1.0, omega=0.1, method="lanczos", lanczos_steps=4, grad_clip=0.5, hvp_clip=0.3)
DELTA, EPSILON = 1e-5, 1000.0  # little noise (z ≈ 0.1): no candidate passes, every step of each is run


def _model():
    with torch.random.fork_rng():  # leaves the global generator of other tests alone
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 2))  # 2 hidden units: W1 has a null space


MODEL = _model()
W = flat_params(MODEL).detach()
CANDIDATES = [W, 0.5 * W, -W]  # the same null space of W1
NULL = torch.linalg.svd(MODEL[0].weight.detach()).Vh[-1]  # unit, W1 @ NULL = 0
RECORDS = {  # name: (features, label)
    "null-space": (1e3 * NULL, 0),
    "null-space-relabelled": (1e3 * NULL, 1),
    "mislabelled-1e6": (1e6 * torch.tensor([1.0, -1.0, 1.0]), 0),  # every candidate predicts 1
    "float32-max": (3e38 * torch.tensor([1.0, -1.0, 1.0]), 0),
    "zero": (torch.zeros(3), 1),
}


def _shards():
    """Client 0 (30 records, the one whose set changes) and client 1 (20: the smaller, so the
    public thresholds, set by the smallest shard, are the same in every world)."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(50, 3, generator=g), torch.randint(0, 2, (50,), generator=g)
    return (x[:30], y[:30]), (x[30:], y[30:])


@functools.cache
def _noise(neighbouring: str) -> tuple:
    inv = PrivateModelSelection(**SEL).inventory(candidates=len(CANDIDATES))
    return tuple(calibrate(inv, epsilon=EPSILON, delta=DELTA, neighbouring=neighbouring).noise.items())


def _federation(shards, neighbouring):
    sel = PrivateModelSelection(**SEL)
    inv, noise = sel.inventory(candidates=len(CANDIDATES)), dict(_noise(neighbouring))
    clients = [
        Client(j, x, y, TorchSource(10 + j), TorchSource(20 + j),
               make_ledger(inv, noise, delta=DELTA, neighbouring=neighbouring, target_epsilon=EPSILON))
        for j, (x, y) in enumerate(shards)
    ]  # fmt: skip
    sizes = [len(y) for _, y in shards]
    return sel, Federation(clients, num_clients=len(shards), shard_sizes=sizes, trust="local", comm=LocalComm()), noise


def run_selection(monkeypatch, shards, neighbouring, *, forced=None):
    """One private ``select`` over :data:`CANDIDATES`: its transcript (every client's releases, each
    with the pre-noise statistic), its result and its federation; with ``forced``, every client's
    message is the one of the transcript ``forced`` (see the module docstring)."""
    sel, fed, noise = _federation(shards, neighbouring)
    transcript, events, real = Transcript(forced), [], PrivateBatch.gaussian
    rngs = [c.noise_rng for c in fed.clients]

    def gaussian(self, name, stat, *, normalizer):
        before = len(events)
        out = real(self, name, stat, normalizer=normalizer)
        (event,) = events[before:]  # what the runtime noised it with
        who = next(i for i, r in enumerate(rngs) if r is self._rng)
        return transcript.give(Release(name, flat(as_bounded(stat).value), event.bound, event.noise_std, out, who))

    with monkeypatch.context() as mp, observe_releases(events.append):
        mp.setattr(PrivateBatch, "gaussian", gaussian)
        res = sel.select(CANDIDATES, federation=fed, model=MODEL, loss_fn=ce, noise=noise, private=True)
    return transcript.seen, res, fed


def _positions(world):
    """Per release: ``(candidate, step)``, step 0 for ``sel-grad`` and j for the j-th Lanczos step."""
    out, cand, j = [], -1, 0
    for rel in world:
        if rel.name == "sel-grad":
            cand, j = cand + (rel.source == 0), 0
        else:
            j += rel.source == 0
        out.append((cand, j))
    return out


ALL_STEPS = {(t, "sel-grad", 0) for t in range(len(CANDIDATES))} | {
    (t, "sel-curv", j) for t in range(len(CANDIDATES)) for j in range(1, SEL["lanczos_steps"] + 1)
}


def _check_pair(monkeypatch, base, neighbour, neighbouring):
    """Replay ``neighbour`` on ``base``'s transcript; check every release; return client 0's movement
    per (candidate, family, Lanczos step) in units of what it was charged for."""
    d, d_res, d_fed = run_selection(monkeypatch, base, neighbouring)
    n, n_res, n_fed = run_selection(monkeypatch, neighbour, neighbouring, forced=d)
    assert len(n) == len(d) == len(CANDIDATES) * (1 + SEL["lanczos_steps"]) * 2  # every step, both clients
    ledgers = [c.ledger for c in d_fed.clients]
    assert [c.ledger.counts for c in n_fed.clients] == [lg.counts for lg in ledgers]  # the same accounting
    ratios = {}
    for a, b, (cand, step) in zip(d, n, _positions(d), strict=True):
        assert (a.name, a.source, a.bound, a.spread) == (b.name, b.source, b.bound, b.spread)  # data-independent noise
        assert a.spread > 0 and a.value.isfinite().all() and b.value.isfinite().all()
        move = float((a.value - b.value).norm())
        if a.source != 0:
            assert move == 0.0, (a.name, cand, step)  # the other client's records and queries are the same
            continue
        allowed = accounted_sensitivity(ledgers[0], a.name, a.spread)
        assert move <= allowed * (1 + 1e-5), (a.name, cand, step, move, allowed)
        key = (cand, a.name, step)
        ratios[key] = max(ratios.get(key, 0.0), move / allowed)
    for family in ("sel-grad", "sel-curv"):
        assert spent(d, n, family, source=0) <= charged(ledgers[0], family) * (1 + 1e-5)
    assert d_res.index is None and d_res == n_res  # the same public history, thresholds and outcome
    return ratios


def _worst(acc, ratios):
    for key, r in ratios.items():
        acc[key] = max(acc.get(key, 0.0), r)


def _with(shard, record: str, *, at: int | None = None):
    """``shard`` with ``record`` (a :data:`RECORDS` name) appended, or put at index ``at``."""
    x, y = shard[0].clone(), shard[1].clone()
    rx, ry = RECORDS[record]
    if at is None:
        return torch.cat([x, rx.reshape(1, 3)]), torch.cat([y, torch.tensor([ry])])
    x[at], y[at] = rx, ry
    return x, y


def test_every_lanczos_step_moves_by_at_most_what_add_remove_charges(monkeypatch):
    """One record added to or removed from client 0's held-out set, replayed both ways: every
    ``sel-grad`` and every Lanczos step's ``sel-curv`` moves by at most C (the add/remove charge);
    the null-space record reaches it at every step of every candidate (its HVP is clipped to C)."""
    shards, worst = _shards(), {}
    for name in ("null-space", "mislabelled-1e6", "zero"):
        bigger = (_with(shards[0], name), shards[1])
        for base, neighbour in ((shards, bigger), (bigger, shards)):
            _worst(worst, _check_pair(monkeypatch, base, neighbour, "add_remove"))
    assert set(worst) == ALL_STEPS
    assert min(worst.values()) >= 0.99, worst  # C attained at every step of every candidate


def test_every_lanczos_step_moves_by_at_most_what_replace_one_charges(monkeypatch):
    """One of client 0's records replaced, the ledgers of relation ``replace_one`` (charged 2C): the
    null-space record with its label flipped, replayed both ways (its clipped gradients and clipped
    HVPs point nearly opposite ways: 2C reached at every step), or swapped for zero, and float32's
    largest record for an ordinary one."""
    shards, worst = _shards(), {}
    flipped = [
        (_with(shards[0], "null-space", at=0), shards[1]),
        (_with(shards[0], "null-space-relabelled", at=0), shards[1]),
    ]
    pairs = [
        (flipped[0], flipped[1]),
        (flipped[1], flipped[0]),
        (flipped[0], (_with(shards[0], "zero", at=0), shards[1])),
        ((_with(shards[0], "float32-max", at=0), shards[1]), shards),
    ]
    for base, neighbour in pairs:
        _worst(worst, _check_pair(monkeypatch, base, neighbour, "replace_one"))
    assert set(worst) == ALL_STEPS
    assert min(worst.values()) >= 0.95, worst  # nearly 2C at every step of every candidate


def test_later_lanczos_queries_depend_on_the_released_history(monkeypatch):
    """Why the replay: the first Lanczos vector is public (a fixed seed), later ones are built from
    the noisy releases. Run on its own (not replayed), the neighbour's later releases query other
    vectors, so even the unchanged client's later statistics differ; its gradient and first-step
    statistics do not."""
    shards = _shards()
    d, _, _ = run_selection(monkeypatch, shards, "add_remove")
    free, _, _ = run_selection(monkeypatch, (_with(shards[0], "null-space"), shards[1]), "add_remove")
    other = {
        pos: float((a.value - b.value).norm())
        for a, b, pos in zip(d, free, _positions(d), strict=True)
        if a.source == 1
    }
    assert all(m == 0.0 for (_, step), m in other.items() if step <= 1), other
    assert all(m > 0.0 for (_, step), m in other.items() if step >= 2), other
