"""Mirror-descent geometry: constraint sets with a mirror map and its Bregman proximal step.

A :class:`MirrorGeometry` bundles a convex constraint set ``K`` in ``R^dim`` with a mirror map
``w`` (a distance-generating function, 1-strongly convex w.r.t. a norm ``||.||``) and its Bregman
divergence ``D(u, v) = w(u) - w(v) - <grad w(v), u - v>``. What every mirror-descent method needs
is the proximal step

    prox_step(x, g, step) = argmin_{u in K} <g, u> + D(u, x) / step

plus the set's Euclidean projection, its centre (the minimiser of ``w``), its size and a linear
minimisation oracle (for Frank-Wolfe duality-gap certificates). The built-in
geometries (``docs/algorithms/erm.md``, "Mirror-descent geometry"):

=================  ==========================  ===========================  =====================
name               set                         mirror map / step            dual norm of ``g``
=================  ==========================  ===========================  =====================
``"simplex"``      probability simplex         entropy: multiplicative      ``||g||_inf``
                                               weights ``x * exp(-step g)``
``"l1-ball"``      ``||x||_1 <= radius``       entropy on the 2·dim-simplex ``radius * ||g||_inf``
                                               (exponentiated gradient ±)
``"l2-ball"``      ``||x||_2 <= radius``       Euclidean: projected step    ``||g||_2``
=================  ==========================  ===========================  =====================

**States.** Mirror descent iterates on the map's domain, which for the ℓ1 ball is not the ball:
``x = radius * (u[:dim] - u[dim:])`` with ``u`` on the simplex of ``2·dim`` coordinates. So the
steps take and return a *state* (``start``, ``prox_step``, ``bregman``), and :meth:`to_primal`
/ :meth:`from_primal` convert between states and points of ``K``. For the simplex and the ℓ2 ball
a state is the point itself (both conversions return a copy).

Everything is float64 numpy; any array-like (including a CPU torch tensor) is accepted.

Example:
    >>> import numpy as np
    >>> simplex = get_geometry("simplex", dim=3)
    >>> lam = simplex.start()                   # the uniform distribution
    >>> lam = simplex.prox_step(lam, np.array([1.0, 0.0, 0.0]), step=np.log(2.0))
    >>> np.round(lam, 4)                        # multiplicative weights: x_i * exp(-step * g_i), normalised
    array([0.2, 0.4, 0.4])
    >>> ball = get_geometry("l1-ball", dim=2, radius=1.0)
    >>> z = ball.prox_step(ball.start(), np.array([1.0, -2.0]), step=10.0)
    >>> ball.to_primal(z).round(4).tolist()     # the mass moves to +x_1 (and a trace to -x_0)
    [-0.0, 1.0]
    >>> float(ball.project(np.array([3.0, 1.0]))[0])   # Euclidean projection onto the ball
    1.0
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from privopt.errors import ConfigError
from privopt.registry import Registry

__all__ = [
    "EntropicL1Ball",
    "EntropicSimplex",
    "EuclideanBall",
    "MirrorGeometry",
    "available_geometries",
    "get_geometry",
    "project_l1_ball",
    "project_simplex",
    "register_geometry",
]


def _vector(x: Any, size: int, what: str) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64).reshape(-1)
    if v.shape[0] != size:
        raise ConfigError(f"{what} must have {size} entries, got shape {tuple(np.shape(x))}")
    if not np.all(np.isfinite(v)):
        raise ConfigError(f"{what} contains NaN or inf")
    return v


def _step(step: float) -> float:
    if not (isinstance(step, (int, float, np.floating, np.integer)) and math.isfinite(step) and step > 0):
        raise ConfigError(f"step must be a finite number > 0, got {step!r}")
    return float(step)


def project_simplex(v: Any, *, total: float = 1.0) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{x >= 0, sum(x) = total}`` (sort-based, O(d log d)).

    Example:
        >>> project_simplex([0.5, 0.5, 3.0]).tolist()
        [0.0, 0.0, 1.0]
    """
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    if not (math.isfinite(total) and total > 0):
        raise ConfigError(f"total must be a finite number > 0, got {total!r}")
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - total
    k = np.arange(1, v.shape[0] + 1)
    rho = int(np.nonzero(u - cumulative / k > 0)[0][-1])  # last index kept positive (always exists)
    theta = cumulative[rho] / (rho + 1)
    return np.maximum(v - theta, 0.0)


def project_l1_ball(v: Any, *, radius: float) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{||x||_1 <= radius}``.

    Example:
        >>> project_l1_ball([3.0, -1.0], radius=1.0).tolist()
        [1.0, -0.0]
    """
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    if np.abs(v).sum() <= radius:
        return v.copy()
    return np.sign(v) * project_simplex(np.abs(v), total=radius)


class MirrorGeometry(abc.ABC):
    """A constraint set with a mirror map (see the module docstring for states vs points).

    Attributes:
        name: registry name.
        dim: dimension of the points of the set.
        state_dim: dimension of a state (``dim``, or ``2·dim`` for the ℓ1 ball).
    """

    name: ClassVar[str] = "abstract"

    def __init__(self, *, dim: int):
        if not (isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim >= 1):
            raise ConfigError(f"dim must be an integer >= 1, got {dim!r}")
        self.dim = int(dim)

    @property
    def state_dim(self) -> int:
        return self.dim

    # ------------------------------------------------------------------ the mirror map
    @abc.abstractmethod
    def start(self) -> np.ndarray:
        """The state minimising the mirror map (where mirror descent starts)."""

    @abc.abstractmethod
    def prox_step(self, state: Any, grad: Any, *, step: float) -> np.ndarray:
        """``argmin_{u} <grad, to_primal(u)> + D(u, state) / step`` over the set's states.

        Args:
            state: current state (``state_dim`` entries).
            grad: a (noisy) gradient with respect to the POINT (``dim`` entries).
            step: step size ``> 0``.
        """

    @abc.abstractmethod
    def bregman(self, u: Any, v: Any) -> float:
        """Bregman divergence ``D(u, v)`` between two states (``inf`` if ``u`` is not reachable from ``v``)."""

    @abc.abstractmethod
    def bregman_radius(self) -> float:
        """``max_u D(u, start())`` over the set: the ``D_0`` of mirror-descent rates."""

    @abc.abstractmethod
    def dual_norm(self, grad: Any) -> float:
        """Dual norm of a gradient w.r.t. the norm in which the mirror map is 1-strongly convex."""

    @abc.abstractmethod
    def dual_norm_factor(self) -> float:
        """The smallest ``k`` with ``dual_norm(g) <= k * ||g||_2`` for every ``g``: a function that is
        L-smooth in ℓ2 is ``k^2 L``-smooth in the map's norm (how accelerated methods scale their
        mirror steps)."""

    def to_primal(self, state: Any) -> np.ndarray:
        """The point of the set a state represents (a copy)."""
        return _vector(state, self.state_dim, "state").copy()

    def from_primal(self, x: Any) -> np.ndarray:
        """A state representing the point ``x`` of the set (``x`` is projected onto the set first)."""
        return self.project(x)

    # ------------------------------------------------------------------ the set
    @abc.abstractmethod
    def project(self, x: Any) -> np.ndarray:
        """Euclidean projection of a point onto the set."""

    def center(self) -> np.ndarray:
        """The point of the set at which the mirror map is minimal (``to_primal(start())``)."""
        return self.to_primal(self.start())

    @abc.abstractmethod
    def diameter(self) -> float:
        """Euclidean (ℓ2) diameter of the set."""

    @abc.abstractmethod
    def linear_minimizer(self, grad: Any) -> np.ndarray:
        """A point of the set minimising ``<grad, x>`` (a Frank-Wolfe vertex). ``<grad, x - s>`` with
        ``s`` this point bounds ``f(x) - min f`` for a convex ``f`` with gradient ``grad`` at ``x``."""

    def contains(self, x: Any, *, tol: float = 1e-9) -> bool:
        """Whether ``x`` lies in the set (up to ``tol`` in ℓ2 distance)."""
        x = _vector(x, self.dim, "x")
        return bool(np.linalg.norm(x - self.project(x)) <= tol)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim})"


class EntropicSimplex(MirrorGeometry):
    """Probability simplex with the negative entropy ``w(x) = sum x_i log x_i``.

    The proximal step is multiplicative weights (exponentiated gradient), ``D`` is the KL
    divergence, the map is 1-strongly convex w.r.t. ``||.||_1`` (Pinsker) and
    ``bregman_radius() = log(dim)``. A coordinate at exactly 0 stays at 0.
    """

    name = "simplex"

    def start(self) -> np.ndarray:
        return np.full(self.dim, 1.0 / self.dim)

    def prox_step(self, state: Any, grad: Any, *, step: float) -> np.ndarray:
        x = _simplex_state(state, self.state_dim)
        g = _vector(grad, self.dim, "grad")
        return _multiplicative_weights(x, g, _step(step))

    def bregman(self, u: Any, v: Any) -> float:
        return _kl(_simplex_state(u, self.state_dim), _simplex_state(v, self.state_dim))

    def bregman_radius(self) -> float:
        return math.log(self.dim)

    def dual_norm(self, grad: Any) -> float:
        return float(np.abs(_vector(grad, self.dim, "grad")).max())

    def dual_norm_factor(self) -> float:
        return 1.0

    def project(self, x: Any) -> np.ndarray:
        return project_simplex(_vector(x, self.dim, "x"))

    def diameter(self) -> float:
        return math.sqrt(2.0) if self.dim > 1 else 0.0

    def linear_minimizer(self, grad: Any) -> np.ndarray:
        return np.eye(self.dim)[int(np.argmin(_vector(grad, self.dim, "grad")))]


class EntropicL1Ball(MirrorGeometry):
    """ℓ1 ball ``{||x||_1 <= radius}`` with the entropy map on the ``2·dim``-simplex.

    A state ``u`` (``2·dim`` entries, ``u >= 0``, ``sum u = 1``) represents
    ``x = radius * (u[:dim] - u[dim:])``; a gradient ``g`` w.r.t. ``x`` is ``radius * (g, -g)``
    w.r.t. ``u``, so the proximal step is exponentiated gradient ± (Kivinen and Warmuth). The map is
    1-strongly convex w.r.t. ``||x||_1 / radius`` (dual norm ``radius * ||g||_inf``) and
    ``bregman_radius() = log(2·dim)``: the dimension enters only logarithmically.
    """

    name = "l1-ball"

    def __init__(self, *, dim: int, radius: float = 1.0):
        super().__init__(dim=dim)
        self.radius = _radius(radius)

    @property
    def state_dim(self) -> int:
        return 2 * self.dim

    def start(self) -> np.ndarray:
        return np.full(self.state_dim, 1.0 / self.state_dim)

    def prox_step(self, state: Any, grad: Any, *, step: float) -> np.ndarray:
        u = _simplex_state(state, self.state_dim)
        g = _vector(grad, self.dim, "grad")
        return _multiplicative_weights(u, self.radius * np.concatenate([g, -g]), _step(step))

    def bregman(self, u: Any, v: Any) -> float:
        return _kl(_simplex_state(u, self.state_dim), _simplex_state(v, self.state_dim))

    def bregman_radius(self) -> float:
        return math.log(self.state_dim)

    def dual_norm(self, grad: Any) -> float:
        return float(self.radius * np.abs(_vector(grad, self.dim, "grad")).max())

    def dual_norm_factor(self) -> float:
        return self.radius

    def to_primal(self, state: Any) -> np.ndarray:
        u = _vector(state, self.state_dim, "state")
        return self.radius * (u[: self.dim] - u[self.dim :])

    def from_primal(self, x: Any) -> np.ndarray:
        """The state that puts ``|x_i| / radius`` on ``+e_i`` or ``-e_i`` and spreads the slack
        ``1 - ||x||_1 / radius`` evenly over all ``2·dim`` coordinates (every coordinate stays
        positive unless ``x`` is on the sphere)."""
        a = self.project(x) / self.radius
        slack = max(0.0, 1.0 - float(np.abs(a).sum())) / self.state_dim
        u = np.concatenate([np.maximum(a, 0.0), np.maximum(-a, 0.0)]) + slack
        return u / u.sum()

    def project(self, x: Any) -> np.ndarray:
        return project_l1_ball(_vector(x, self.dim, "x"), radius=self.radius)

    def diameter(self) -> float:
        return 2.0 * self.radius

    def linear_minimizer(self, grad: Any) -> np.ndarray:
        g = _vector(grad, self.dim, "grad")
        j = int(np.argmax(np.abs(g)))
        out = np.zeros(self.dim)
        out[j] = -self.radius * (1.0 if g[j] > 0 else -1.0)
        return out

    def __repr__(self) -> str:
        return f"EntropicL1Ball(dim={self.dim}, radius={self.radius:g})"


class EuclideanBall(MirrorGeometry):
    """ℓ2 ball ``{||x||_2 <= radius}`` with ``w(x) = ||x||^2 / 2``: ``D(u, v) = ||u - v||^2 / 2``
    and the proximal step is the projected gradient step ``project(x - step * g)``."""

    name = "l2-ball"

    def __init__(self, *, dim: int, radius: float = 1.0):
        super().__init__(dim=dim)
        self.radius = _radius(radius)

    def start(self) -> np.ndarray:
        return np.zeros(self.dim)

    def prox_step(self, state: Any, grad: Any, *, step: float) -> np.ndarray:
        x = _vector(state, self.dim, "state")
        return self.project(x - _step(step) * _vector(grad, self.dim, "grad"))

    def bregman(self, u: Any, v: Any) -> float:
        d = _vector(u, self.dim, "u") - _vector(v, self.dim, "v")
        return 0.5 * float(d @ d)

    def bregman_radius(self) -> float:
        return 0.5 * self.radius**2

    def dual_norm(self, grad: Any) -> float:
        return float(np.linalg.norm(_vector(grad, self.dim, "grad")))

    def dual_norm_factor(self) -> float:
        return 1.0

    def linear_minimizer(self, grad: Any) -> np.ndarray:
        g = _vector(grad, self.dim, "grad")
        norm = float(np.linalg.norm(g))
        return -self.radius * g / norm if norm > 0 else np.zeros(self.dim)

    def project(self, x: Any) -> np.ndarray:
        x = _vector(x, self.dim, "x")
        norm = float(np.linalg.norm(x))
        return x * (self.radius / norm) if norm > self.radius else x.copy()

    def diameter(self) -> float:
        return 2.0 * self.radius

    def __repr__(self) -> str:
        return f"EuclideanBall(dim={self.dim}, radius={self.radius:g})"


# ------------------------------------------------------------------------------------- helpers
def _radius(radius: float) -> float:
    if not (isinstance(radius, (int, float, np.floating, np.integer)) and math.isfinite(radius) and radius > 0):
        raise ConfigError(f"radius must be a finite number > 0, got {radius!r}")
    return float(radius)


def _simplex_state(u: Any, size: int) -> np.ndarray:
    u = _vector(u, size, "state")
    if u.min() < 0 or abs(u.sum() - 1.0) > 1e-6:
        raise ConfigError(f"a state must lie on the probability simplex (u >= 0, sum 1); got sum {u.sum():.6g}")
    return u


def _multiplicative_weights(u: np.ndarray, g: np.ndarray, step: float) -> np.ndarray:
    # In the log domain with the max subtracted, so large step * g neither overflows nor zeroes the sum.
    with np.errstate(divide="ignore"):
        logits = np.log(u) - step * g
    logits -= logits.max()
    w = np.exp(logits)
    return w / w.sum()


def _kl(u: np.ndarray, v: np.ndarray) -> float:
    support = u > 0
    if np.any(v[support] == 0):
        return math.inf
    return float(np.sum(u[support] * np.log(u[support] / v[support])))


# ------------------------------------------------------------------------------------ registry
_GEOMETRIES: Registry[type[MirrorGeometry]] = Registry("geometry")
register_geometry = _GEOMETRIES.register  # class decorator: available to get_geometry by ``cls.name``


for _cls in (EntropicSimplex, EntropicL1Ball, EuclideanBall):
    register_geometry(_cls)


def available_geometries() -> tuple[str, ...]:
    """Registered geometry names."""
    return _GEOMETRIES.names()


def get_geometry(name: str, *, dim: int, **params: Any) -> MirrorGeometry:
    """Build a registered geometry, e.g. ``get_geometry("l1-ball", dim=54, radius=10.0)``.

    Raises:
        ConfigError: unknown name or invalid parameters (``radius`` for the balls only).
    """
    cls = _GEOMETRIES.lookup(name)
    try:
        return cls(dim=dim, **params)
    except TypeError as exc:
        raise ConfigError(f"bad parameters for geometry {name!r}: {exc}") from None
