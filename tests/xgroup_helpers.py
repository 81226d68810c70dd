"""Replace-one neighbours across groups for the worst-group algorithms (``tests/test_cross_group_neighbours.py``).

A record of group A replaced by a record of group B changes two groups at once. The neighbour is
replayed on the first world's transcript (``tests/replay_helpers.py``): :func:`run_world` records,
release by release, the pre-noise statistic each mechanism noises (for DP-FTRL's tree: the node
that closes), the per-record bound and noise spread it was given and what the algorithm received;
given another world's releases it hands those to the algorithm instead of its own, so both worlds
take the same path and only the statistics differ. ``replay_helpers.spent`` and
``replay_helpers.charged`` compare, family by family, what the pair costs with what the ledger charged.
"""

from __future__ import annotations

from privopt.algorithms import get_algorithm
from privopt.algorithms.worst_group_plan import GroupReleaseRun, TreeAggregator
from privopt.grads.release import observe_releases
from privopt.grads.sums import as_bounded
from privopt.privacy import PrivacyLedger, calibrate
from replay_helpers import Release, Transcript, flat
from wg_helpers import make_ctx


def run_world(monkeypatch, algo, *, forced: list[Release] | None = None) -> list[Release]:
    """Run ``algo`` (set up) to its end, recording every release (its bound and noise spread as the
    runtime reported them); with ``forced``, the algorithm receives ``forced[k].out`` for its k-th
    release (which must be of the same family)."""
    transcript, events = Transcript(forced), []
    give = transcript.give

    def wrap(real):
        def release(self, name, stat, **kw):
            before = len(events)
            out = real(self, name, stat, **kw)
            (event,) = events[before:]  # what the runtime noised it with
            return give(Release(name, flat(as_bounded(stat).value), event.bound, event.noise_std, out))

        return release

    real_add = TreeAggregator.add

    def add(self, leaf, *, indices=None):
        out = real_add(self, leaf, indices=indices)
        level = (self.t & -self.t).bit_length() - 1  # the node that closed with this leaf
        return give(Release("ftrl-tree", flat(self._exact[level]), self.bound, self.std, out))

    with monkeypatch.context() as mp, observe_releases(events.append):
        mp.setattr(GroupReleaseRun, "gaussian", wrap(GroupReleaseRun.gaussian))
        mp.setattr(GroupReleaseRun, "laplace", wrap(GroupReleaseRun.laplace))
        mp.setattr(TreeAggregator, "add", add)
        for t in range(algo.num_steps()):
            algo.step(t)
    return transcript.seen


def private_algo(name, data, x, y, groups, *, epsilon, delta=1e-3, neighbouring="replace_one", **params):
    """``name`` set up for a private run on ``(x, y, groups)`` with noise calibrated for ``neighbouring``
    (RDP), a ledger of that relation and fixed seeds (the same keys and noise in every world)."""
    algo = get_algorithm(name, **params)
    ctx, _ = make_ctx(data, x=x, y=y, groups=groups, model="logreg")
    ctx.extra["dataset"] = data  # for group_sizes="public"; the group ids are the ones given
    inv = algo.inventory(n=len(y))
    cal = calibrate(inv, epsilon=epsilon, delta=delta, neighbouring=neighbouring, accountant="rdp")
    ctx.noise = dict(cal.noise)
    ctx.ledger = PrivacyLedger(
        delta=delta, neighbouring=neighbouring, accountant="rdp", target_epsilon=epsilon,
        planned=inv.steps_for(cal.noise),
    )  # fmt: skip
    algo.setup(ctx)
    return algo, ctx
