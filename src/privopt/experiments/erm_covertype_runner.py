"""How Paper B's Covertype comparison runs (:mod:`privopt.experiments.erm_covertype`): one private
run through the shared step loop, tuning a method's schedule on the held-out set, and the final
runs of the chosen schedule on the training set.

Every run uses noise calibrated exactly by the project accountant for its method's inventory and
target (epsilon, delta), add/remove-one neighbours, and the run randomness of
:mod:`privopt.training` (secret unless ``insecure_seed`` is given). The tuning set has the same
size as the training set, so a tuning run is the very run that would be made on the training set
(same noise, same number of passes), made on disjoint rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import Algorithm, RunContext
from privopt.algorithms.erm_common import single_thread_blas
from privopt.experiments.erm_covertype_protocol import MethodSpec, Setting
from privopt.experiments.privacy_notes import ERM_TUNING_ROWS
from privopt.objectives.erm import LogisticERM, logistic_loss
from privopt.training import Every, LoopState, run_loop, run_sources

__all__ = ["NEIGHBOURING", "Problem", "Runner", "Selection"]

NEIGHBOURING = "add_remove"


@dataclass
class Problem:
    """One dataset under one setting's objective, with its non-private optimum (evaluation only)."""

    x: torch.Tensor
    y: torch.Tensor
    erm: LogisticERM
    f_star: float
    certificate: float  # constrained: Frank-Wolfe gap (F(w*) - min F <= it); else ||grad F(w*)||
    solve_s: float

    @classmethod
    def build(cls, features: np.ndarray, labels: np.ndarray, setting: Setting) -> Problem:
        """Solve for ``F*``: L-BFGS, or over the ℓ1 ball FISTA to a certified gap of 1e-8."""
        erm = LogisticERM(features=features, labels=labels, l2=setting.l2)
        t0 = time.perf_counter()
        with single_thread_blas():
            geometry = setting.geometry(erm.dim)
            if geometry is None:
                w, f_star = erm.solve()
                certificate = float(np.linalg.norm(erm.gradient(w)))
            else:
                w, f_star = erm.solve(constraint=geometry, tol=1e-8)
                certificate = erm.frank_wolfe_gap(w, geometry)
        x, y = torch.from_numpy(features), torch.from_numpy(labels)
        return cls(x, y, erm, f_star, certificate, time.perf_counter() - t0)


@dataclass
class Selection:
    """The outcome of tuning one method at one epsilon on the held-out set.

    ``profile`` lists, per run length, ``(length, best mean tuning gap over step sizes, passes)``;
    ``interior`` is whether the chosen length is below the grid's largest (else a longer run might
    still help and the method may be iteration-limited); ``last_gain`` is the relative gap decrease
    from the second-largest length to the largest (small: the profile has flattened at the edge).
    """

    schedule: dict[str, Any]
    tuning_gap: float
    profile: list[tuple[Any, float, float]]
    interior: bool
    last_gain: float
    grid: list[dict[str, Any]] = field(default_factory=list)


def _next_length(lengths: list, cap) -> Any | None:
    """The run length after the grid's largest (same ratio as its last two, at most ``cap``), or None."""
    if cap is None or len(lengths) < 2 or lengths[-1] >= cap:
        return None
    ratio = lengths[-1] / lengths[-2]
    return min(cap, max(lengths[-1] + 1, round(lengths[-1] * ratio)))


def _last_gain(profile: list[tuple[Any, float, float]]) -> float:
    if len(profile) < 2 or profile[-2][1] <= 0:
        return 0.0
    return (profile[-2][1] - profile[-1][1]) / profile[-2][1]


class Runner:
    """Runs and records (one JSON row per run through ``write``).

    Args:
        delta, accountant: the privacy target's delta and the accountant for calibration.
        insecure_seed: seed the noise and sampling (each run its own offset); ``None`` = secret.
        curve_points: evaluation points per final-run curve.
        write, log: row sink and progress printer.
    """

    def __init__(self, *, delta: float, accountant: str, insecure_seed: int | None, curve_points: int, write, log):
        self.delta, self.accountant, self.insecure_seed = delta, accountant, insecure_seed
        self.curve_points, self.write, self.log = curve_points, write, log
        self._calibrations: dict[tuple, Any] = {}
        self._runs = 0

    # ------------------------------------------------------------------ one run
    def calibrate(self, algo: Algorithm, *, n: int, epsilon: float):
        """Exact noise for the algorithm's inventory (cached: tuning and final runs share it)."""
        from privopt.privacy import calibrate

        key = (algo.name, tuple(sorted(algo.hyperparameters().items())), n, epsilon)
        if key not in self._calibrations:
            self._calibrations[key] = calibrate(
                algo.inventory(n=n),
                epsilon=epsilon,
                delta=self.delta,
                neighbouring=NEIGHBOURING,
                accountant=self.accountant,
            )
        return self._calibrations[key]

    def _sources(self) -> dict:
        seed = None if self.insecure_seed is None else self.insecure_seed + self._runs
        self._runs += 1
        srcs = run_sources(seed)  # secret unless the experiment opted into seeded randomness
        return {"noise_rng": srcs["noise"], "sampler_rng": srcs["sampler"]}

    def run(self, algo: Algorithm, problem: Problem, *, epsilon: float, curve: bool) -> dict[str, Any]:
        """One private optimisation; returns its final gap, algorithm time, passes, ε spent (and curve)."""
        from privopt.privacy import PrivacyLedger

        cal = self.calibrate(algo, n=problem.erm.n, epsilon=epsilon)
        ledger = PrivacyLedger(delta=self.delta, neighbouring=NEIGHBOURING, accountant=cal.accountant)
        model = torch.nn.Linear(problem.erm.dim, 1, bias=False, dtype=torch.float64)
        torch.nn.init.zeros_(model.weight)
        ctx = RunContext(
            model=model,
            loss_fn=logistic_loss,
            x_train=problem.x,
            y_train=problem.y,
            engine=None,
            ledger=ledger,
            noise=dict(cal.noise),
            **self._sources(),
        )
        algo.setup(ctx)
        points = [{"wall_s": 0.0, "passes": 0.0, "gap": problem.erm.objective(algo.output()) - problem.f_star}]

        def point(state: LoopState, logs: dict) -> None:  # evaluation is not part of the algorithm's time
            points.append({"wall_s": state.algo_time_s, "passes": algo.passes, "gap": self._gap(algo, problem)})

        every = max(1, algo.num_steps() // self.curve_points) if curve else algo.num_steps()
        cpu0 = time.process_time()
        with single_thread_blas():
            state = run_loop(algo.step, LoopState(step=0, total=algo.num_steps()), [Every(every, point)])
        algo.finalize()
        out = {"gap": self._gap(algo, problem), "wall_s": state.algo_time_s, "cpu_s": time.process_time() - cpu0}
        out.update(passes=algo.passes, epsilon_spent=float(ledger.epsilon()), noise_multipliers=dict(cal.noise))
        out.update(accountant=cal.accountant, hyperparameters=algo.hyperparameters())
        if curve:
            out["curve"] = points
        return out

    @staticmethod
    def _gap(algo: Algorithm, problem: Problem) -> float:
        with single_thread_blas():
            return problem.erm.objective(algo.output()) - problem.f_star

    # ------------------------------------------------------------------ protocol steps
    def tune(self, setting: Setting, method: MethodSpec, problem: Problem, *, epsilon: float, runs: int) -> Selection:
        """Run every schedule of the grid ``runs`` times on the tuning set and keep the best mean gap.

        While the best run length is the largest tried (and below ``method.max_length``), the
        length axis is extended by the grid's last ratio, with the best step size and the smaller
        ones (longer runs want smaller steps), and the choice is made again.
        """
        grid = [self._grid_point(setting, method, problem, s, epsilon, runs) for s in method.schedules()]
        best = min(grid, key=lambda g: g["gap_mean"])
        while True:
            lengths = sorted({g["schedule"][method.length] for g in grid})
            longer = _next_length(lengths, method.max_length)
            if best["schedule"][method.length] < lengths[-1] or longer is None:
                break
            steps = sorted(
                {
                    g["schedule"]["step_size"]
                    for g in grid
                    if g["schedule"]["step_size"] <= best["schedule"]["step_size"]
                }
            )
            for step in steps:
                schedule = {**best["schedule"], method.length: longer, "step_size": step}
                grid.append(self._grid_point(setting, method, problem, schedule, epsilon, runs))
            best = min(grid, key=lambda g: g["gap_mean"])
        profile = []
        for length in sorted({g["schedule"][method.length] for g in grid}):
            at = min((g for g in grid if g["schedule"][method.length] == length), key=lambda g: g["gap_mean"])
            profile.append((length, at["gap_mean"], at["passes"]))
        self.log(
            f"[{setting.name}] {method.label:10s} eps={epsilon:g} tuned: {best['schedule']} "
            f"(tuning gap {best['gap_mean']:.4g}; best gap by {method.length}: "
            + ", ".join(f"{k}: {v:.3g}" for k, v, _ in profile)
            + ")"
        )
        interior = best["schedule"][method.length] < profile[-1][0]
        return Selection(best["schedule"], best["gap_mean"], profile, interior, _last_gain(profile), grid)

    def _grid_point(self, setting, method, problem, schedule, epsilon, runs) -> dict[str, Any]:
        res = [self._tuning_run(setting, method, problem, schedule, epsilon, r) for r in range(runs)]
        gaps = [x["gap"] for x in res]
        return {
            "schedule": schedule,
            "gap_mean": float(np.mean(gaps)),
            "gap_std": float(np.std(gaps)),
            "passes": res[0]["passes"],
        }

    def _tuning_run(self, setting, method, problem, schedule, epsilon, r) -> dict[str, Any]:
        res = self.run(method.build(schedule), problem, epsilon=epsilon, curve=False)
        res.pop("hyperparameters")
        row = {"phase": "tune", "setting": setting.name, "method": method.label, "epsilon": epsilon}
        self.write({**row, "schedule": schedule, "run": r, "n_tune": problem.erm.n, **res})
        return res

    def final(
        self,
        setting: Setting,
        method: MethodSpec,
        problem: Problem,
        *,
        epsilon: float,
        schedule: dict,
        runs: int,
        phase: str = "final",
    ) -> list[dict]:
        """``runs`` runs of one schedule on the training set, with gap curves."""
        rows = []
        for r in range(runs):
            res = self.run(method.build(schedule), problem, epsilon=epsilon, curve=True)
            row = {
                "phase": phase,
                "setting": setting.name,
                "method": method.label,
                "epsilon": epsilon,
                "schedule": schedule,
                "run": r,
                "f_star": problem.f_star,
                "n_train": problem.erm.n,
                **res,
                # how the schedule was chosen (not accounted); the paper's printed schedules were not
                "hyperparameter_tuning": ERM_TUNING_ROWS if phase == "final" else None,
            }
            self.write(row)
            rows.append(row)
        gaps = [r["gap"] for r in rows]
        spread = f"± {np.std(gaps, ddof=1):.2g}" if len(gaps) > 1 else "(1 run)"  # as summary.md gives it
        self.log(
            f"[{setting.name}] {method.label:10s} eps={epsilon:g} {phase} {schedule}: gap {np.mean(gaps):.4g} "
            f"{spread}, wall {np.mean([r['wall_s'] for r in rows]):.2f}s, "
            f"passes {rows[-1]['passes']:.1f}, eps spent {max(r['epsilon_spent'] for r in rows):.4f}"
        )
        return rows
