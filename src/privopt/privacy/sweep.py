"""Budget planning for DP-SGD: the epsilon a noise multiplier gives, and sweeps over settings.

:func:`dp_sgd_epsilon` answers the inverse of :func:`~privopt.privacy.dp_sgd_noise`: the epsilon
that noise multiplier ``z`` spends at ``delta`` after ``steps`` DP-SGD steps, by
:func:`~privopt.privacy.epsilon_of` on the same plan. :func:`dp_sgd_sweep` runs either question
over every combination of batch sizes, lengths (steps or epochs) and targets (epsilons or noise
multipliers), one row per combination. See docs/accounting.md, "`privopt account`".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from privopt.errors import ConfigError
from privopt.privacy.accountant import EpsilonResult, epsilon_of
from privopt.privacy.calibration import CalibrationProgress, dp_sgd_inventory, dp_sgd_noise
from privopt.privacy.checks import check_accountant, check_count, check_delta, check_epsilon, is_real

__all__ = ["MAX_SWEEP_ROWS", "dp_sgd_epsilon", "dp_sgd_steps", "dp_sgd_sweep"]

# More combinations than this are refused: each may calibrate for up to its time limit.
MAX_SWEEP_ROWS = 200


def dp_sgd_steps(*, dataset_size: int, batch_size: int, epochs: float) -> int:
    """Steps of ``epochs`` passes as ``privopt train`` plans DP-SGD: ``ceil(epochs·n/b)``, at least 1.

    Example:
        >>> dp_sgd_steps(dataset_size=60_000, batch_size=256, epochs=20)
        4688
    """
    n = check_count(dataset_size, name="dataset_size", minimum=1)
    b = check_count(batch_size, name="batch_size", minimum=1)
    return max(1, math.ceil(check_epsilon(epochs, name="epochs") * n / b))


def dp_sgd_epsilon(
    *,
    dataset_size: int,
    batch_size: int,
    steps: int,
    noise_multiplier: float,
    delta: float,
    accountant: str = "auto",
    sampling: str = "poisson",
    neighbouring: str | None = None,
) -> EpsilonResult:
    """Epsilon of ``steps`` DP-SGD steps with noise multiplier ``noise_multiplier`` at ``delta``.

    The inverse of :func:`~privopt.privacy.dp_sgd_noise`: the same plan, accounted by
    :func:`~privopt.privacy.epsilon_of` (``"auto"``: the smaller of PLD and RDP).

    Args:
        dataset_size: n.
        batch_size: Expected (Poisson) or exact (``"wor"``) batch size b <= n.
        steps: Number of noisy gradient steps.
        noise_multiplier: z > 0 (noise std on the clipped sum = z · C).
        delta: Delta in (0, 1).
        accountant: ``"auto"``, ``"pld"`` or ``"rdp"``.
        sampling: ``"poisson"`` (add/remove) or ``"wor"`` (replace-one; RDP only).
        neighbouring: Defaults to the relation the sampling scheme is analysed under.

    Returns:
        :class:`~privopt.privacy.EpsilonResult` (``epsilon`` is ``inf`` if no finite epsilon reaches ``delta``).

    Example:
        >>> from privopt.privacy import dp_sgd_epsilon
        >>> res = dp_sgd_epsilon(dataset_size=10_000, batch_size=1000, steps=512, noise_multiplier=9.662, delta=1e-6)
        >>> res.epsilon <= 1.0, round(res.epsilon, 3), res.accountant
        (True, 1.0, 'pld')
    """
    inv, relation = dp_sgd_inventory(dataset_size=dataset_size, batch_size=batch_size, steps=steps, sampling=sampling)
    if not (is_real(noise_multiplier) and 0 < noise_multiplier < math.inf):
        raise ConfigError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier!r}")
    return epsilon_of(
        inv.steps_for({"gradient": float(noise_multiplier)}),
        delta=delta,
        neighbouring=relation if neighbouring is None else neighbouring,
        accountant=accountant,
    )


def _checked(values, name: str, check) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ConfigError(f"{name} must be a non-empty list, got {values!r}")
    return [check(v, name=f"{name}[{i}]") for i, v in enumerate(values)]


def _combinations(n: int, batch_sizes, lengths, targets, *, inverse: bool, max_rows: int) -> list[tuple]:
    """(b, steps, epochs or None, target) per row, the x axis of a plot varying fastest: the targets
    (epsilons) when calibrating, the lengths when accounting."""
    total = len(batch_sizes) * len(lengths) * len(targets)
    if total > max_rows:
        raise ConfigError(
            f"{len(batch_sizes)} batch sizes x {len(lengths)} lengths x {len(targets)} "
            f"{'noise multipliers' if inverse else 'epsilons'} make {total} combinations; at most {max_rows}"
        )
    for b in batch_sizes:
        if b > n:
            raise ConfigError(f"batch size {b} exceeds dataset_size={n}")
    rows = []
    order = (
        itertools.product(batch_sizes, targets, lengths)
        if inverse
        else itertools.product(batch_sizes, lengths, targets)
    )
    for b, first, second in order:
        (target, length) = (first, second) if inverse else (second, first)
        steps, epochs = length
        if epochs is not None:
            steps = dp_sgd_steps(dataset_size=n, batch_size=b, epochs=epochs)
        rows.append((b, steps, epochs, target))
    return rows


def _lengths(steps, epochs) -> list[tuple[int | None, float | None]]:
    if (steps is None) == (epochs is None):
        raise ConfigError("pass exactly one of steps= and epochs=")
    if steps is not None:
        return [(s, None) for s in _checked(steps, "steps", lambda v, name: check_count(v, name=name, minimum=1))]
    return [(None, e) for e in _checked(epochs, "epochs", check_epsilon)]


def _targets(epsilons, noise_multipliers) -> tuple[bool, list[float]]:
    """(whether the noise is given, the targets)."""
    if (epsilons is None) == (noise_multipliers is None):
        raise ConfigError("pass exactly one of epsilons= and noise_multipliers=")
    if noise_multipliers is not None:
        return True, _checked(noise_multipliers, "noise_multipliers", check_epsilon)
    return False, _checked(epsilons, "epsilons", check_epsilon)


def _row(n: int, b: int, steps: int, epochs, target: float, *, inverse: bool, delta: float, kw: dict) -> dict:
    """One combination, as ``privopt account --json`` prints it (plus n and b)."""
    size = {"dataset_size": n, "batch_size": b}
    tail = {"sampling_rate": b / n, "steps": steps, **({} if epochs is None else {"epochs": epochs})}
    if inverse:
        res = dp_sgd_epsilon(dataset_size=n, batch_size=b, steps=steps, noise_multiplier=target, delta=delta, **kw)
        relation = dp_sgd_inventory(dataset_size=n, batch_size=b, steps=steps, sampling=kw["sampling"])[1]
        head = {"noise_multiplier": target, "epsilon": res.epsilon, "delta": delta, "accountant": res.accountant}
        return {**size, **head, "sampling": kw["sampling"], "neighbouring": relation, **tail}
    cal = dp_sgd_noise(dataset_size=n, batch_size=b, steps=steps, epsilon=target, delta=delta, **kw)
    head = {"noise_multiplier": cal.noise["gradient"], "epsilon": cal.epsilon, "epsilon_target": target}
    head.update(delta=delta, accountant=cal.accountant, sampling=kw["sampling"], neighbouring=cal.neighbouring)
    return {**size, **head, **tail, "search_complete": not cal.extra}


def dp_sgd_sweep(
    *,
    dataset_size: int,
    batch_sizes: Sequence[int],
    delta: float,
    steps: Sequence[int] | None = None,
    epochs: Sequence[float] | None = None,
    epsilons: Sequence[float] | None = None,
    noise_multipliers: Sequence[float] | None = None,
    accountant: str = "auto",
    sampling: str = "poisson",
    time_limit: float | None = None,
    progress: Callable[[CalibrationProgress], None] | None = None,
    on_row: Callable[[int, int, dict], None] | None = None,
    max_rows: int = MAX_SWEEP_ROWS,
) -> list[dict]:
    """DP-SGD's noise (given ``epsilons``) or epsilon (given ``noise_multipliers``) for every combination,
    every argument validated before the first one is accounted.

    Args:
        dataset_size: n.
        batch_sizes: Batch sizes b <= n.
        delta: Delta in (0, 1) (the caller checks it against 1/n: :func:`~privopt.privacy.check_delta_for_size`).
        steps: Numbers of steps; or ``epochs``: passes, ``ceil(epochs·n/b)`` steps (:func:`dp_sgd_steps`).
        epsilons: Targets to calibrate the noise for (:func:`~privopt.privacy.dp_sgd_noise`); or
            ``noise_multipliers``: noise to account (:func:`dp_sgd_epsilon`).
        accountant: ``"auto"``, ``"pld"`` or ``"rdp"``; sampling: ``"poisson"`` or ``"wor"``.
        time_limit: Seconds each calibration may search (see :func:`~privopt.privacy.calibrate`).
        progress: Passed to each calibration.
        on_row: Called with (index, number of rows, row) after each row. max_rows: more are refused.

    Returns:
        One dict per combination, batch size outermost and the epsilons (or, given noise multipliers,
        the lengths) innermost: ``dataset_size``, ``batch_size``, ``noise_multiplier``, ``epsilon``,
        ``delta``, ``accountant``, ``sampling``, ``neighbouring``, ``sampling_rate``, ``steps``,
        ``epochs`` (given epochs) and, when calibrating, ``epsilon_target`` and ``search_complete``.

    Raises:
        ConfigError: an invalid argument (named with its index), or too many combinations.

    Example:
        >>> rows = dp_sgd_sweep(dataset_size=10_000, batch_sizes=[100], steps=[100, 1000],
        ...                     noise_multipliers=[1.0], delta=1e-6, accountant="rdp")
        >>> [round(r["epsilon"], 2) for r in rows]
        [1.51, 2.44]
    """
    n, delta = check_count(dataset_size, name="dataset_size", minimum=1), check_delta(delta)
    lengths, (inverse, targets) = _lengths(steps, epochs), _targets(epsilons, noise_multipliers)
    sizes = _checked(batch_sizes, "batch_sizes", lambda v, name: check_count(v, name=name, minimum=1))
    combos = _combinations(n, sizes, lengths, targets, inverse=inverse, max_rows=max_rows)
    if sampling not in ("poisson", "wor"):
        raise ConfigError(f"unknown sampling {sampling!r}; use 'poisson' or 'wor'")
    kw = {"accountant": check_accountant(accountant), "sampling": sampling}
    kw.update({} if inverse else {"time_limit": time_limit, "progress": progress})
    rows = []
    for i, (b, t, e, target) in enumerate(combos):
        rows.append(_row(n, b, t, e, target, inverse=inverse, delta=delta, kw=kw))
        if on_row is not None:
            on_row(i, len(combos), rows[-1])
    return rows
