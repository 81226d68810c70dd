"""``train()``: build a run, step it with callbacks, commit its outputs; and resume.

Commit protocol (crash consistency): ``checkpoint.pt`` is the commit point and embeds the record;
``record.json`` and the files derived from it are written right after it, and every resume first
writes them out again from the checkpoint. A fresh run commits once before its first step, so a
run killed at any point after that resumes; one killed inside that first commit leaves only a lock
file and hidden ``.tmp`` files, and the same directory can simply be used again.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from privopt.checkpoint import load_checkpoint, save_checkpoint
from privopt.config import RunConfig
from privopt.distributed import torchrun_comm
from privopt.errors import ConfigError, DataError, PrivacyBudgetExceeded, public_reason
from privopt.eval.metrics import model_logits
from privopt.privacy import EpsilonResult, PrivacyLedger, epsilon_of
from privopt.training.builder import Run, build_run, stated_config
from privopt.training.callbacks import AlgorithmDone, DivergenceGuard, ProgressCallback, RunDiverged, SignalGuard
from privopt.training.loop import Every, LoopState, StepLimit, run_loop
from privopt.training.metrics import compute_run_metrics, evaluate
from privopt.training.outputs import (
    base_record,
    diagnostics_header,
    privacy_section,
    with_engine_fallback,
    write_outputs,
)
from privopt.training.resume import (
    CHECKPOINT_FORMAT,
    check_versions,
    provenance,
    recorded_threads,
    require_objects,
    restore,
    resume_config,
    rng_state,
    verify,
    versions,
)
from privopt.training.rundir import RECORD_NAME, RunDirLock, check_new_run_dir, check_resume_dir

__all__ = ["RunInterrupted", "train"]


class RunInterrupted(KeyboardInterrupt):
    """Raised after a run was interrupted (Ctrl-C / SIGTERM) and its checkpoint saved.

    A ``KeyboardInterrupt`` (not an error): code that catches ``Exception`` or ``PrivoptError``
    around ``train()`` (a tuning loop that skips failed trials) must not swallow the user's request
    to stop. Its message says how to resume.
    """

    exit_code = 130  # the CLI's exit code (the shell's convention for SIGINT)


class _Session:
    """One call of :func:`train` on a built run: evaluation rows, commits, the loop."""

    def __init__(
        self,
        run: Run,
        out: Path,
        *,
        ckpt: dict[str, Any] | None = None,
        checkpoints: bool = True,
        version_changes: list[dict[str, Any]] | None = None,
    ):
        self.run, self.out = run, out
        # Under torchrun this process holds one client's secrets only: no resumable checkpoint.
        self.checkpoints = checkpoints
        self.state = LoopState(step=ckpt["step"] if ckpt else 0, total=run.total)
        self.history: list[dict[str, Any]] = list(ckpt["history"]) if ckpt else []
        self.diag_history: list[dict[str, Any]] = list(ckpt["diag_history"]) if ckpt else []
        self.elapsed_before = float(ckpt["elapsed_s"]) if ckpt else 0.0
        self._eps_exact = False  # whether the last evaluation's epsilon is the exact one (else a bound)
        self.t0 = time.perf_counter()
        self.base = base_record(run)
        if version_changes:  # a resume under other versions, allowed explicitly: the record says where
            self.base["version_changes"] = version_changes
        # A resume keeps the fingerprints it verified (taken before the state was restored), under this
        # process's versions.
        self.provenance = dict(ckpt["provenance"], versions=versions()) if ckpt else provenance(run)
        self.diag_header = diagnostics_header(run) if run.cfg.non_private_diagnostics else None
        self.earlier_fallback = ckpt["record"].get("engine_fallback") if ckpt else None  # kept by a resume

    # ------------------------------------------------------------------ measuring
    def _spent_bound(self) -> EpsilonResult | None:
        """An upper bound on the ε spent so far that costs no PLD evaluation (one per new step count
        costs up to seconds): the smaller of the RDP bound and the exact ε of the whole planned
        schedule (computed once); ``None`` when the exact ε is as cheap. docs/accounting.md, "Caching"."""
        ledger = self.run.ledger
        if not isinstance(ledger, PrivacyLedger) or ledger.mode != "plan" or ledger.accountant == "rdp":
            return None
        kw = dict(delta=ledger.delta, neighbouring=ledger.neighbouring)
        counts, planned = ledger.counts, ledger.planned or {}
        bound = epsilon_of(counts, accountant="rdp", **kw)
        if planned and all(c <= planned.get(s, 0) for s, c in counts.items()):  # epsilon grows with the counts
            bound = min(bound, epsilon_of(planned, accountant=ledger.accountant, **kw), key=lambda r: r.epsilon)
        return bound

    def _epsilon(self, *, final: bool) -> float | None:
        """Epsilon spent so far: exact at the end, :meth:`_spent_bound` during the run."""
        if self.run.ledger is None:
            return None
        bound = None if final else self._spent_bound()
        return (self.run.ledger.spent() if bound is None else bound).epsilon

    def _last_row(self) -> bool:
        return self.state.step >= self.run.total or self.state.stop == "done"

    def _record_view(self) -> Mapping[str, Any]:
        return _RecordView(self.base, lambda: privacy_section(self.run.cfg, self.run.ledger, self.run.data))

    def _measure(self, *, final: bool, logs: dict[str, float] | None = None) -> tuple[dict, dict]:
        """(public row, non-private row) of the model now; the second is filled only with diagnostics on."""
        run, cfg = self.run, self.run.cfg
        self._eps_exact = final or self._last_row()  # during the run: a bound (docs/accounting.md, "Caching")
        pub: dict[str, Any] = {"step": self.state.step, "epsilon_spent": self._epsilon(final=self._eps_exact)}
        diag: dict[str, Any] = {"step": self.state.step}
        # A private algorithm's logs are post-processed releases; a non-private one's read the data.
        (pub if run.algo.private else diag).update({k: float(v) for k, v in (logs or {}).items()})
        whole = final or self._last_row()
        x, y = run.eval_split(subsample=not whole)
        logits = model_logits(run.predictor, x)  # once: the split's metrics and its groups' read them
        split = evaluate(
            run.predictor, run.loss_fn, x, y, num_classes=run.data.num_classes, prefix=cfg.eval_split, logits=logits
        )
        if not math.isfinite(split[f"{cfg.eval_split}_loss"]):
            raise RunDiverged(
                f"diverged at step {self.state.step}: non-finite {cfg.eval_split} loss (try a smaller lr)"
            )
        (pub if cfg.eval_split == "test" else diag).update(split, **{f"{cfg.eval_split}_records": len(y)})
        index = None if whole else run.eval_index(subsample=True)
        (pub if cfg.eval_split == "test" else diag).update(_group_metrics(run, cfg.eval_split, logits, y, index))
        # The record view's privacy section holds the exact epsilon (an accountant call, up to seconds
        # per new step count): it is computed only if a metric reads it.
        kw = dict(model=run.model, loss_fn=run.loss_fn, record=self._record_view() if run.metrics else None)
        pub.update(compute_run_metrics(run.metrics, final=final, private=False, data=run.data, **kw))
        if cfg.non_private_diagnostics:
            diag.update(compute_run_metrics(run.metrics, final=final, private=True, data=run.data, **kw))
            if final:
                d = run.data
                diag.update(
                    evaluate(
                        run.predictor, run.loss_fn, d.x_train, d.y_train, num_classes=d.num_classes, prefix="train"
                    )
                )
        return pub, diag

    def _on_eval(self, state: LoopState, logs: dict[str, float]) -> None:
        pub, diag = self._measure(final=False, logs=logs)
        self.history.append(pub)
        if self.run.cfg.non_private_diagnostics:
            self.diag_history.append(diag)

    def _summary(self) -> dict[str, str]:
        last = self.history[-1] if self.history else {}
        out = {}
        if last.get("epsilon_spent") is not None:
            bound = "" if self._eps_exact else "≤"  # a bound is not yet what was spent
            out["eps"] = f"{bound}{last['epsilon_spent']:.3g}"
        if "test_accuracy" in last:
            out["test_acc"] = f"{last['test_accuracy']:.3f}"
        if out and last.get("step") != self.state.step:  # an earlier evaluation's: say which, ε has grown since
            out["at_step"] = str(last["step"])
        return out

    # ------------------------------------------------------------------ committing
    def _record(self, status: str, reason: str | None, final: dict | None) -> dict[str, Any]:
        # A running run's checkpoint reports the cheap bound on its ε (nothing reads it back: the budget
        # guard and a resume use the ledger's counts); every other record, the exact ε.
        spent = self._spent_bound() if status == "running" else None
        rec = with_engine_fallback(self.base, self.run.ctx.engine, self.earlier_fallback)
        rec.update(
            status=status,
            reason=reason,
            steps_done=self.state.step,
            wall_time_s=self.elapsed_before + time.perf_counter() - self.t0,
            privacy=privacy_section(self.run.cfg, self.run.ledger, self.run.data, spent=spent),
            metrics=final if final is not None else (self.history[-1] if self.history else {}),
            history=self.history,
        )
        return rec

    def _diagnostics(self, status: str, diag_final: dict | None) -> dict[str, Any] | None:
        if self.diag_header is None:
            return None
        last = self.diag_history[-1] if self.diag_history else {}
        return dict(
            self.diag_header,
            status=status,
            steps_done=self.state.step,
            final=diag_final if diag_final is not None else last,
            history=self.diag_history,
        )

    def _checkpoint(self, status: str, record: dict, diagnostics: dict | None) -> dict[str, Any]:
        run = self.run
        return {
            "format": CHECKPOINT_FORMAT,
            "status": status,
            "config": run.cfg.to_dict(),
            "step": self.state.step,
            "model": run.model.state_dict(),
            "algorithm": run.algo.state_dict(),
            # SECRET: the secure sources' keys (the checkpoint is as sensitive as the data).
            "rng": rng_state(run),
            "ledger": run.ledger.to_dict() if run.ledger is not None else None,
            "history": self.history,
            "diag_history": self.diag_history,
            "elapsed_s": record["wall_time_s"],
            "provenance": self.provenance,
            "data_files": run.data_files,  # absolute paths: a resume reads the same files from any directory
            "plugins": run.plugins,  # likewise: a resume imports the same plugin files
            "record": record,
            "diagnostics": diagnostics,
        }

    def commit(self, status: str, *, reason: str | None = None, final=None, diag_final=None, checkpoint=True) -> dict:
        """Checkpoint (the commit point), then the record, then the files derived from it."""
        record = self._record(status, reason, final)
        diagnostics = self._diagnostics(status, diag_final)
        if checkpoint and self.checkpoints:
            save_checkpoint(self.out, self._checkpoint(status, record, diagnostics))
        model_state = self.run.model.state_dict() if status == "finished" else None
        write_outputs(
            self.out, record=record, diagnostics=diagnostics, model_state=model_state, plots=self.run.cfg.plots
        )
        return record

    def _fail(self, err: BaseException) -> None:
        """Every exit after the first release leaves a record of what was spent (no checkpoint:
        the last good one stays, so a resume replays the same releases and spends nothing new)."""
        if isinstance(err, PrivacyBudgetExceeded):
            reason = f"privacy budget exhausted: {err}"
        else:  # "RunDiverged: ..." as in a reproduction's failed rows; a foreign error's text may quote data
            reason = public_reason(err)
        try:
            self.commit("failed", reason=reason, checkpoint=False)
        except Exception as write_error:  # the original error matters more; say why the record is missing
            why = str(write_error) if isinstance(write_error, OSError) else public_reason(write_error)  # a path
            print(f"privopt: could not write the failure record: {why}", file=sys.stderr)

    # ------------------------------------------------------------------ running
    def execute(self, *, fresh: bool, progress: bool | None, max_steps: int | None) -> dict[str, Any]:
        run = self.run
        with SignalGuard() as guard:
            try:
                if fresh:
                    self.commit("running")  # resumable from step 0 on
                callbacks = [
                    AlgorithmDone(run.algo),
                    DivergenceGuard(run.model),
                    Every(run.eval_every, self._on_eval),
                    ProgressCallback(desc=run.cfg.algorithm, summary=self._summary, enabled=progress),
                    Every(run.checkpoint_every, lambda st, logs: self.commit("running"), at_end=False),
                    StepLimit(max_steps),
                    guard,
                ]
                run_loop(run.algo.step, self.state, callbacks)
                if self.state.stop == "done":  # the algorithm returned early: its last logs close the curve
                    self._on_eval(self.state, self.state.logs)
                if self.state.stop == "interrupted":
                    self.commit("interrupted")
                    how = (
                        f"resume with: {_resume_hint(run, self.out, progress)}"
                        if self.checkpoints
                        else "a run launched by torchrun writes no checkpoint and cannot be resumed: start it again"
                    )
                    raise RunInterrupted(f"run interrupted at step {self.state.step}/{run.total}; {how}")
                if self.state.stop == "paused":
                    return self.commit("paused")
                run.algo.finalize()
                pub, diag = self._measure(final=True)
                return self.commit("finished", final=pub, diag_final=diag)
            except RunInterrupted:
                raise
            except Exception as e:
                self._fail(e)
                raise


def _group_metrics(run: Run, split: str, logits: Any, y: Any, index: Any = None) -> dict[str, float]:
    """Worst-group, mean-group and per-group accuracy from the released predictor's ``logits`` on
    the records ``y`` of ``split`` (all of them, or those at ``index``: an evaluation's subsample), for
    a dataset with groups (``{}`` without): ``<split>_group<i>_accuracy`` for group ``i`` of
    ``Dataset.group_names``, groups absent from the records left out. Each is a metric of the released
    predictor, like the split's accuracy."""
    groups = getattr(run.data, f"g_{split}", None)
    if groups is None or len(groups) == 0:
        return {}
    from privopt.eval.worst_group import worst_group_metrics

    k = max(run.data.num_groups, int(groups.max()) + 1)  # of the whole split: the same columns every row
    m = worst_group_metrics(logits, y, groups if index is None else groups[index], num_groups=k)
    out = {f"{split}_worst_group_accuracy": m["worst_group_accuracy"]}
    out[f"{split}_mean_group_accuracy"] = m["mean_group_accuracy"]
    for i, g in enumerate(m["per_group"].values()):
        if g["n"]:
            out[f"{split}_group{i}_accuracy"] = float(g["accuracy"])
    return out


def _resume_hint(run: Run, out: Path, progress: bool | None) -> str:
    """How to resume: the CLI rebuilds what the config names; objects passed through the Python API
    (a dataset, model or loss) cannot be rebuilt from it and must be passed again. The call keeps
    this one's ``progress`` when it is not train's default (``privopt.fit``'s auto: ``None``), so the
    resumed run prints what the interrupted one did."""
    own = [part for part in ("dataset", "model", "loss") if run.provenance.get(part) == "api"]
    if not own:
        return f"privopt train --resume {out}"
    args = [f"{part}=..." for part in own] + ([] if progress is True else [f"progress={progress!r}"])
    call = f"privopt.training.train(None, out_dir={str(out)!r}, resume=True, {', '.join(args)})"
    return f"{call} with the same {', '.join(own)}"


class _RecordView(Mapping):
    """The run's record as a metric sees it: ``base`` plus a ``privacy`` section computed on first read."""

    def __init__(self, base: dict[str, Any], privacy):
        self._base, self._privacy, self._section = base, privacy, None

    def __getitem__(self, key: str) -> Any:
        if key != "privacy":
            return self._base[key]
        if self._section is None:
            self._section = self._privacy()
        return self._section

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        if "privacy" not in self._base:
            yield "privacy"

    def __len__(self) -> int:
        return len(self._base) + ("privacy" not in self._base)


def train(
    cfg: RunConfig | None,
    *,
    out_dir: str | Path,
    resume: bool = False,
    progress: bool | None = True,
    max_steps: int | None = None,
    dataset: Any = None,
    model: Any = None,
    loss: Any = None,
    allow_version_change: bool = False,
) -> dict[str, Any]:
    """Run one configured training job and write its outputs to ``out_dir``.

    Outputs (what is public and what is not: ``docs/privacy.md``): ``record.json`` (config,
    hyper-parameters, privacy inventory, calibrated noise, ledger, ε spent, randomness kind,
    status, test metrics), ``metrics.csv``, ``curves.png``, ``model.pt`` (the released model),
    ``checkpoint.pt`` (SECRET, 0600) and, only with ``non_private_diagnostics: true``,
    ``diagnostics.NOT_PRIVATE.json``.

    Args:
        cfg: the run configuration; ``None`` with ``resume=True`` (the run's own is used; a
            different one is refused, naming the keys it cannot honour).
        out_dir: output directory; new, empty, or left by a run killed before its first
            checkpoint; locked while the run owns it.
        resume: continue from ``out_dir/checkpoint.pt`` (model, algorithm state, generator
            states and the ledger are restored, so no budget is re-spent or forgotten), on the
            torch CPU thread count the run recorded (the caller's is set back on return).
        progress: a progress bar on a terminal, periodic lines otherwise; False: nothing; None:
            a bar only on a terminal and only once the loop has run a few seconds, else nothing.
        max_steps: stop (checkpoint, status ``"paused"``) after this many steps in this call.
        dataset: your own :class:`privopt.data.Dataset` instead of loading ``cfg.dataset`` (pass it again on
            resume: its fingerprint is checked); ``cfg.dataset_params`` empty or those it was loaded with.
        model: your own ``nn.Module`` instead of building ``cfg.model`` (likewise on resume; no ``model_params``).
        loss: your own loss instead of ``cfg.loss``: a per-sample function ``(outputs, targets) -> [B]``
            or a torch loss module such as ``nn.CrossEntropyLoss()`` (used per example, as
            :func:`privopt.fit` uses it); the record then says ``loss: custom``; pass it again on resume.
        allow_version_change: resume a run checkpointed under another privopt, torch or Python version
            (refused otherwise); only from a paused or interrupted checkpoint; the record states it.

    Returns:
        The record (as written to ``record.json``).

    Raises:
        PrivacyBudgetExceeded: a query would have exceeded the target; RunDiverged: non-finite
            loss or parameters. Both (and any other error after the run started) first write
            a record with status ``"failed"``, the reason, the ledger and the ε spent so far.
        RunInterrupted: on SIGINT/SIGTERM, after saving a checkpoint and the record.
    """
    out = Path(out_dir)
    loss = _per_example(loss)
    comm = torchrun_comm(device=getattr(cfg, "device", None) or "cpu")  # a resume (cfg None) is refused below
    if resume:
        if comm is not None:
            raise ConfigError("runs launched by torchrun are not resumable (each process holds one client's secrets)")
        kw = dict(dataset=dataset, model=model, loss=loss, allow_version_change=allow_version_change)
        return _resume(cfg, out, progress=progress, max_steps=max_steps, **kw)
    if allow_version_change:
        raise ConfigError("allow_version_change applies only to a resume (resume=True)")
    return _fresh(cfg, out, comm, dataset=dataset, model=model, loss=loss, progress=progress, max_steps=max_steps)


def _per_example(loss: Any) -> Any:
    """A torch loss module used per example, as :func:`privopt.fit` takes it (so a run it started
    resumes with the same module); a function is returned as it is."""
    if loss is None:
        return None
    from privopt.objectives.losses import per_sample_loss

    return per_sample_loss(loss)


def _fresh(
    cfg, out: Path, comm, *, dataset, model, loss, progress: bool | None, max_steps: int | None
) -> dict[str, Any]:
    if cfg is None:
        raise ConfigError("train() needs a RunConfig (cfg=None is only for resume=True)")
    try:
        if comm is not None:  # before anything is written: a rank given another config is refused on every rank
            comm.check_same(json.dumps(cfg.to_dict(), sort_keys=True, default=str), what="config")
        if comm is not None and not comm.is_server:
            return _follow(cfg, comm, dataset=dataset, model=model, loss=loss)
        check_new_run_dir(out)  # before any work: a file, an unwritable folder or another run fail now
        run = build_run(cfg, dataset=dataset, model=model, loss=loss, comm=comm)
        with RunDirLock(out):
            check_new_run_dir(out)  # again under the lock: another run may have started meanwhile
            session = _Session(run, out, checkpoints=comm is None)
            return session.execute(fresh=True, progress=progress, max_steps=max_steps)
    except BaseException:
        if comm is not None:  # the other processes may wait for this one in a collective: do not wait for them
            comm.leave_at_once()
        raise


def _follow(cfg: RunConfig, comm, *, dataset, model, loss) -> dict[str, Any]:
    """A torchrun process other than rank 0: one client of the run. It steps in lockstep with the
    server and writes nothing (rank 0 evaluates and writes the run's outputs)."""
    run = build_run(cfg, dataset=dataset, model=model, loss=loss, comm=comm)
    run_loop(run.algo.step, LoopState(step=0, total=run.total), [AlgorithmDone(run.algo)])
    run.algo.finalize()
    return {"role": "client", "rank": comm.rank, "algorithm": cfg.algorithm, "status": "finished"}


def _published(out: Path) -> dict[str, Any] | None:
    """The record on disk (``None`` when missing or unreadable): newer than the checkpoint after a failure."""
    try:
        return json.loads((out / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None


def _resume(cfg, out: Path, *, dataset, model, loss, allow_version_change, progress, max_steps) -> dict[str, Any]:
    check_resume_dir(out)
    with RunDirLock(out):
        try:
            ckpt = load_checkpoint(out)
        except DataError as e:
            if "no checkpoint" not in str(e):
                raise
            raise DataError(
                f"{out} holds no checkpoint: the run stopped before its first checkpoint was complete and "
                f"nothing was published; start it again with the same output directory ({e})"
            ) from None
        # The given config as a fresh run would state it (a dataset or loss passed in named there).
        run_cfg = resume_config(ckpt, None if cfg is None else stated_config(cfg, loss=loss, dataset=dataset))
        if ckpt["status"] == "finished":  # e.g. killed while writing the outputs: write them again
            write_outputs(
                out,
                record=ckpt["record"],
                diagnostics=ckpt["diagnostics"],
                model_state=ckpt["model"],
                plots=run_cfg.plots,
            )
            return ckpt["record"]
        require_objects(ckpt, dataset=dataset, model=model, loss=loss)
        changes = check_versions(ckpt, published=_published(out), allow_change=allow_version_change)
        state = dict(ledger_state=ckpt["ledger"], released=ckpt["record"].get("released"))
        state["data_files"] = ckpt.get("data_files")  # a checkpoint of an earlier privopt: none (current directory)
        state["plugins"] = ckpt.get("plugins")
        with recorded_threads(ckpt):  # before the run is built: its noise thread takes the count too
            run = build_run(run_cfg, dataset=dataset, model=model, loss=loss, **state)
            verify(ckpt, run)
            restore(run, ckpt)
            write_outputs(
                out, record=ckpt["record"], diagnostics=ckpt["diagnostics"], model_state=None, plots=run_cfg.plots
            )
            session = _Session(run, out, ckpt=ckpt, version_changes=changes)
            return session.execute(fresh=False, progress=progress, max_steps=max_steps)
