"""Spies on a run's privacy noise and ledger: what was drawn, released and recorded, in order.

:func:`spy_run` patches every module's reference to the two noise primitives
(:func:`~privopt.grads.release.draw_gaussian_noise`, :func:`~privopt.grads.release.draw_laplace_noise`)
and the ``record`` of both ledger kinds, and observes the releases, so a test can compare what an
algorithm does per step with what its ledger says it did.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

from privopt.grads import release as rel
from privopt.grads.release import observe_releases
from privopt.privacy import ParallelLedger, PrivacyLedger


@dataclass
class Log:
    """Everything seen, in order: ``("draw", kind, spread, shape)`` (spread: Gaussian std or Laplace
    scale), ``("record", step)`` and ``("release", ReleaseEvent)``."""

    items: list = field(default_factory=list)


def _patch_everywhere(monkeypatch, original, replacement) -> int:
    """Replace ``original`` in every loaded privopt module that holds it; returns how many."""
    hits = 0
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("privopt") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                monkeypatch.setattr(mod, attr, replacement)
                hits += 1
    return hits


@contextlib.contextmanager
def spy_run(monkeypatch):
    """Yield a :class:`Log` filled while the context is open."""
    import privopt.algorithms  # every module that imports a primitive is loaded
    import privopt.training  # noqa: F401

    log = Log()
    gauss, lap = rel.draw_gaussian_noise, rel.draw_laplace_noise

    def spy_gauss(shape, *, std, **kw):
        log.items.append(("draw", "gaussian", float(std), tuple(_shape(shape))))
        return gauss(shape, std=std, **kw)

    def spy_lap(shape, *, scale, **kw):
        log.items.append(("draw", "laplace", float(scale), tuple(_shape(shape))))
        return lap(shape, scale=scale, **kw)

    assert _patch_everywhere(monkeypatch, gauss, spy_gauss) >= 3  # release, worst-group plan, svrg, ...
    assert _patch_everywhere(monkeypatch, lap, spy_lap) >= 2
    for cls in (PrivacyLedger, ParallelLedger):
        real = cls.record

        def record(self, step, _real=real):
            _real(self, step)  # a refused step raises before it is logged
            log.items.append(("record", step))

        monkeypatch.setattr(cls, "record", record)
    with observe_releases(lambda e: log.items.append(("release", e))):
        yield log


def _shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
