"""What a run writes, and in which order.

Public outputs carry only public facts (n, hyper-parameters, architecture, the calibration, the
ledger) and released values (ε spent, metrics of the released model on the public test split):

* ``record.json``: the run record; ``metrics.csv`` and ``curves.png``: its evaluation history;
* ``model.pt``: the released model's ``state_dict`` (finished runs).

Not public:

* ``checkpoint.pt`` (mode 0600): SECRET, holds the generator keys; it is the commit point of the
  run and embeds the record, which every resume writes out again (:func:`write_outputs`);
* ``diagnostics.NOT_PRIVATE.json`` (only with ``non_private_diagnostics: true``): training-set
  metrics, exact split counts and histograms, run metrics that read the training data.

A commit writes the checkpoint first, then the record, then the files derived from it, so no
public file is ever newer than the record beside it; see ``docs/privacy.md``.
"""

from __future__ import annotations

import csv
import io
import json
import platform
from pathlib import Path
from typing import Any

import torch

import privopt
from privopt.checkpoint import (
    CHECKPOINT_NAME,
    SECRET_MODE,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    torch_bytes,
)
from privopt.errors import DataError
from privopt.privacy import PrivacyLedger
from privopt.training.builder import Run, randomness_section
from privopt.training.rundir import RECORD_NAME

__all__ = [
    "CURVES_NAME",
    "DIAGNOSTICS_NAME",
    "METRICS_NAME",
    "MODEL_NAME",
    "RECORD_NAME",
    "base_record",
    "diagnostics_header",
    "load_diagnostics",
    "privacy_section",
    "with_engine_fallback",
    "write_outputs",
]

METRICS_NAME = "metrics.csv"
CURVES_NAME = "curves.png"
MODEL_NAME = "model.pt"
DIAGNOSTICS_NAME = "diagnostics.NOT_PRIVATE.json"
NOT_PRIVATE_NOTE = (
    "NOT PRIVATE: computed from the private training data without noise and not charged to the privacy "
    "ledger. Never publish this file; see docs/privacy.md."
)


def preprocessing_note(data: Any) -> str | None:
    """What the dataset's preparation read from the private records without noise (``None``: nothing).

    ``scaling: data`` standardises with the training split's exact statistics, and a dataset built
    without ``num_classes`` takes the model's shape from the private labels: the released model and
    its test metrics then depend on those values, which the ledger does not cover. A count-based
    selection (``max_train``, cifar10-st's ``minority_count``) reads no statistic, but makes the
    guarantee one about the training split as selected, not about a record of the source data."""
    public = getattr(data, "public_meta", None) or {}
    notes = []
    if (public.get("scaling") or {}).get("private_preprocessing"):
        notes.append("features standardised with the exact mean/std of the training split (scaling: data)")
    if public.get("inferred_from_private_data"):
        notes.append(f"{' and '.join(public['inferred_from_private_data'])} inferred from the private labels/groups")
    counted = (public.get("selection") or {}).get("count_based")
    note = None
    if notes:
        note = "; ".join(notes) + ": read the private records without noise and NOT accounted in epsilon_spent"
    if counted:  # the split is as given; a record of the SOURCE can swap one training record for another
        swap = (
            f"count-based selection of the training split ({'; '.join(counted)}): one record of the source data "
            "can swap one training record for another, so for the source's records the guarantee is that of a "
            "replace-one neighbour (two add/remove steps), NOT epsilon_spent (docs/data.md, 'Selection and the "
            "protected unit')"
        )
        note = swap if note is None else f"{note}; {swap}"
    return note


def replace_one_selection_note(cfg: Any, data: Any) -> str | None:
    """Under ``replace_one``, what per-record selection of the training split voids (``None``: nothing).

    A step that keeps or drops each record on its own (a carved split, ``train_fraction``, a dataset's
    thinning, ``missing: drop``) protects one record of the source under add/remove: a record replaced
    by another may enter or leave the training split, so neighbouring sources give training splits of
    different sizes, which a replace-one guarantee says nothing about."""
    if getattr(getattr(cfg, "privacy", None), "neighbouring", None) != "replace_one":
        return None
    steps = ((getattr(data, "public_meta", None) or {}).get("selection") or {}).get("per_record")
    if not steps:
        return None
    return (
        f"per-record selection of the training split ({'; '.join(steps)}) under neighbouring replace_one: a "
        "record of the source data replaced by another may enter or leave the training split, changing n, which "
        "a replace-one guarantee does not cover, so epsilon_spent is about the training split as selected, NOT "
        "about a record of the source data (neighbouring: add_remove covers it; docs/data.md, 'Selection and the "
        "protected unit')"
    )


EX_POST_NOTE = (
    "the run stopped before the end of its plan (a stop rule read from its own releases, a time limit, a pause "
    "or an interruption): it is (epsilon_guarantee, delta)-DP, the plan's epsilon; epsilon_spent is the "
    "ex-post epsilon of the releases made, a DP guarantee only if the stop did not depend on the data or on "
    "what the run released (docs/accounting.md, 'Early stops')"
)


def client_split_note(cfg: Any) -> str | None:
    """The scope of a federated run's ε (``None`` for one client): the shards are cut from the whole
    training split, so adding or removing one record can move others between clients."""
    clients = (getattr(cfg, "algorithm_params", None) or {}).get("clients", 1)
    if not isinstance(clients, int) or clients <= 1:
        return None
    return (
        f"the {clients} client shards are cut from the whole training split by the run's public seed "
        f"(split {cfg.algorithm_params.get('split', 'label')!r}; 'label' reads the labels): the guarantee is "
        "about a record of a client's shard with the federation as given (docs/algorithms/sosp.md, "
        "'Distributed runs'), not about the split itself"
    )


def trust_note(cfg: Any) -> str | None:
    """Whom a federated run with central noise trusts (``None`` otherwise): its ε is not against them."""
    params = getattr(cfg, "algorithm_params", None) or {}
    if (
        not isinstance(params.get("clients", 1), int)
        or params.get("clients", 1) <= 1
        or params.get("trust") != "central"
    ):
        return None
    return (
        "trust 'central': the aggregator (the server, with client 0) receives every client's clipped sum without "
        "noise and adds the noise once; the guarantee is against what it releases, not against the aggregator nor, "
        "under torchrun, any client's process (the all-reduce passes partial sums through them) "
        "(docs/algorithms/sosp.md, 'Distributed runs')"
    )


SPENT_BOUND_METHOD = (
    "upper bound: the smaller of the RDP epsilon of the steps executed so far and the exact epsilon of the "
    "whole plan (a checkpoint of a running run; the final record is exact; docs/accounting.md, 'Caching')"
)


def privacy_section(cfg: Any, ledger: PrivacyLedger | None, data: Any = None, *, spent=None) -> dict[str, Any]:
    """The record's privacy block: target, the ledger and the ε it gives (``null`` when non-private):
    ``epsilon_guarantee`` is the run's DP guarantee, the ε of its whole plan; ``epsilon_spent`` the ε of
    the releases made, which is smaller only when the run stopped early (then flagged as ex-post).
    ``not_accounted`` names what that ε does not cover: the hyper-parameters' choice, the data's
    preparation (``data``), a federated run's client split and, under ``replace_one``, per-record selection.

    ``spent`` (an :class:`~privopt.privacy.EpsilonResult` bounding ``ledger.spent()`` from above)
    replaces the exact ε of the releases: a running run's checkpoint reports it, at no PLD evaluation.
    ``epsilon_spent_method`` says which it is; ``pld_grid`` the PLD grid behind a PLD number."""
    if ledger is None:
        return {"private": False, "epsilon_spent": None, "delta": None}
    method = "exact" if spent is None else SPENT_BOUND_METHOD
    spent, guarantee = ledger.spent() if spent is None else spent, ledger.guarantee()
    out = {
        "private": True,
        "epsilon_target": cfg.privacy.epsilon,
        "epsilon_spent": spent.epsilon,
        "epsilon_guarantee": guarantee.epsilon,
        "delta": cfg.privacy.delta,
        "accountant": spent.accountant,
        "epsilon_spent_method": method,
        **({"pld_grid": spent.grid} if getattr(spent, "grid", None) is not None else {}),
        "neighbouring": cfg.privacy.neighbouring,
        "ledger": ledger.to_dict(),
    }
    if guarantee.epsilon > spent.epsilon and method == "exact":  # a running run has not stopped
        out["epsilon_spent_is_ex_post"] = EX_POST_NOTE
    notes = {
        "hyperparameter_tuning": getattr(cfg, "hyperparameter_tuning", None),  # this run, not how it was chosen
        "preprocessing": preprocessing_note(data),  # like an insecure seed: an opt-in that voids part of it
        "client_split": client_split_note(cfg),
        "trust": trust_note(cfg),
        "selection": replace_one_selection_note(cfg, data),
    }
    if any(notes.values()):
        out["not_accounted"] = {k: v for k, v in notes.items() if v}
    return out


def _files(cfg: Any, *, checkpoint: bool) -> dict[str, Any]:
    return {
        "record": RECORD_NAME,
        "metrics": METRICS_NAME,
        "curves": CURVES_NAME if cfg.plots else None,
        "model": f"{MODEL_NAME} (the released model, written when the run finishes)",
        "checkpoint": f"{CHECKPOINT_NAME} (SECRET, mode 0600: holds the noise/sampling generator keys)"
        if checkpoint
        else None,
        "diagnostics": f"{DIAGNOSTICS_NAME} (NOT PRIVATE)" if cfg.non_private_diagnostics else None,
    }


def base_record(run: Run) -> dict[str, Any]:
    """The parts of a record that do not change during a run: public facts only."""
    cfg, data = run.cfg, run.data
    comm = run.ctx.extra.get("comm")
    rec: dict[str, Any] = {
        "privopt_version": privopt.__version__,
        "config": cfg.to_dict(),
        "algorithm": cfg.algorithm,
        "hyperparameters": run.algo.hyperparameters(),
        # n is public (docs/privacy.md); exact split histograms and statistics are not.
        "dataset": {
            "name": data.name,
            "n_train": run.n,
            "n_test": int(data.y_test.shape[0]),
            "num_classes": int(data.num_classes),
            "input_shape": list(data.input_shape),
            "source": run.provenance.get("dataset"),
        },
        "model": {
            "name": cfg.model if run.provenance.get("model") == "config" else type(run.model).__name__,
            "source": run.provenance.get("model"),
            "parameters": sum(p.numel() for p in run.model.parameters()),
        },
        "randomness": randomness_section(insecure_seed=cfg.insecure_seed, public_seed=cfg.seed),
        "engine": type(run.ctx.engine).name,
        "total_steps": run.total,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "files": _files(cfg, checkpoint=comm is None),
    }
    if comm is not None:  # one process per client: none holds every client's secrets, so none checkpoints
        rec["launch"] = {"launcher": "torchrun", "processes": comm.world_size, "resumable": False}
    for key in ("class_names", "group_names"):  # public names: which group test_group<i>_accuracy is
        if data.public_meta.get(key) and (key == "class_names" or data.g_train is not None):
            rec["dataset"][key] = [str(v) for v in data.public_meta[key]]
    if run.released:  # released statistics (noised and charged to the ledger in a private run)
        rec["released"] = dict(run.released)
    if run.logit_offsets is not None:  # from a public prior or the released counts: post-processing
        rec["prediction"] = {"logit_offsets": run.logit_offsets.cpu().tolist(), "predict": "model(x) - logit_offsets"}
    if run.inventory is not None:
        rec["privacy_inventory"] = run.inventory.to_dict()
        rec["calibration"] = {
            "noise_multipliers": dict(run.calibration.noise),
            "epsilon_planned": run.calibration.epsilon,
            "accountant": run.calibration.accountant,
        }
    return rec


def with_engine_fallback(base: dict[str, Any], engine: Any, earlier: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of the record ``base`` with ``engine_fallback: {"to": ..., "reasons": [...]}`` after its
    ``engine`` when ``engine`` sent queries to another engine (e.g. ghost to vmap for tied weights) in
    this run, or before a resume (``earlier``: that record's field). Structural reasons only, no counts:
    how many queries fell back is a function of the secret batch sizes (``GradEngine.fallback``)."""
    now = engine.fallback()
    if not now and not earlier:
        return dict(base)
    reasons = set((now or {}).get("reasons", [])) | set((earlier or {}).get("reasons", []))
    field = {"to": (now or earlier)["to"], "reasons": sorted(reasons)}
    rec: dict[str, Any] = {}
    for key, value in base.items():
        rec[key] = value
        if key == "engine":
            rec["engine_fallback"] = field
    return rec


def diagnostics_header(run: Run) -> dict[str, Any]:
    """The static part of ``diagnostics.NOT_PRIVATE.json``: the dataset's exact provenance."""
    return {"NOT_PRIVATE": NOT_PRIVATE_NOTE, "dataset_meta": _jsonable_meta(run.data.meta)}


def _jsonable_meta(meta: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in (meta or {}).items():
        if isinstance(v, torch.Tensor):
            continue  # per-example arrays (group ids) stay out even here
        out[k] = v if isinstance(v, (int, float, str, bool, list, dict, type(None))) else str(v)
    return out


def _metrics_csv(history: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for row in history:
        keys += [k for k in row if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys or ["step"], lineterminator="\n")
    w.writeheader()
    for row in history:
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def write_outputs(
    out: Path, *, record: dict[str, Any], diagnostics: dict[str, Any] | None, model_state: Any, plots: bool
) -> None:
    """Write the public outputs of one commit (and the diagnostics, when enabled), record first."""
    out = Path(out)
    atomic_write_json(out / RECORD_NAME, record)
    if diagnostics is not None:  # exact training statistics: owner-only, like the checkpoint
        atomic_write_json(out / DIAGNOSTICS_NAME, diagnostics, mode=SECRET_MODE)
    atomic_write_text(out / METRICS_NAME, _metrics_csv(record["history"]))
    if plots and record["status"] != "running" and record["history"]:
        from privopt.plots import plot_training_curves

        plot_training_curves(
            out / CURVES_NAME, record["history"], title=f"{record['algorithm']} on {record['dataset']['name']}"
        )
    if record["status"] == "finished" and model_state is not None:
        atomic_write_bytes(out / MODEL_NAME, torch_bytes(model_state))


def load_diagnostics(out_dir: str | Path) -> dict[str, Any]:
    """Read a run's ``diagnostics.NOT_PRIVATE.json`` (``{"final": ..., "history": [...], ...}``).

    Raises:
        DataError: the run did not enable ``non_private_diagnostics``.
    """
    path = Path(out_dir) / DIAGNOSTICS_NAME
    if not path.is_file():
        raise DataError(f"{path} does not exist: the run was made without non_private_diagnostics: true")
    return json.loads(path.read_text())
