"""Build everything a run needs from its config, before any output is written.

:func:`build_run` loads (or checks) the data and the model, the loss, the algorithm, calibrates
the noise for the target (ε, δ), opens the privacy ledger and creates the randomness. Every user
error (unknown names, a tuple instead of a ``Dataset``, a model that does not fit the inputs,
δ ≥ 1/n, a metric that would read private data without diagnostics enabled) fails here, with a
clear message, before a run directory exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from privopt.algorithms.base import Algorithm, RunContext, get_algorithm
from privopt.config import RunConfig, file_folders
from privopt.errors import ConfigError, DataError, ModelError
from privopt.grads import get_engine, validate_model
from privopt.grads.ahead import run_noise_source
from privopt.plugins import load_plugins
from privopt.privacy import PrivacyLedger, calibrate, check_delta_for_size, ledger_from_dict, make_ledger
from privopt.rng import RandomSource, make_sources
from privopt.training.metrics import RunMetric, build_loss, get_run_metrics
from privopt.training.model_checks import check_engine_fits, check_model_fits, probe_rows
from privopt.training.pretraining import PreTraining, apply_pretraining, plan_pretraining, with_pretraining

__all__ = [
    "CUSTOM_LOSS",
    "Run",
    "build_run",
    "check_engine_fits",
    "check_model_fits",
    "randomness_section",
    "run_sources",
    "stated_config",
]

# ``RunConfig.loss`` of a run whose loss function was passed through the Python API.
CUSTOM_LOSS = "custom"


@dataclass
class Run:
    """A run ready to step: its parts, and where they came from (``"config"`` or ``"api"``)."""

    cfg: RunConfig
    data: Any
    model: nn.Module
    loss_fn: Any
    algo: Algorithm
    ctx: RunContext
    sources: dict[str, RandomSource]
    ledger: PrivacyLedger | None
    inventory: Any
    calibration: Any
    metrics: list[RunMetric]
    total: int
    provenance: dict[str, str] = field(default_factory=dict)
    released: dict[str, Any] = field(default_factory=dict)  # released statistics (e.g. the feature mean)
    logit_offsets: torch.Tensor | None = None  # the logit adjustment's τ·log π (privopt.data.class_prior)
    data_files: dict[str, str] = field(default_factory=dict)  # absolute paths read (checkpoint only: machine paths)
    plugins: list[str] = field(default_factory=list)  # the plugins imported (likewise: absolute file paths)

    @property
    def predictor(self) -> nn.Module:
        """The released predictor: the model, with the logit adjustment's offsets subtracted if any."""
        if self.logit_offsets is None:
            return self.model
        from privopt.data.class_prior import AdjustedLogits

        return AdjustedLogits(self.model, self.logit_offsets)

    @property
    def n(self) -> int:
        return int(self.data.y_train.shape[0])

    @property
    def eval_every(self) -> int:
        return _interval(self.cfg.eval_every, self.total, 20)

    @property
    def checkpoint_every(self) -> int:
        if self.cfg.checkpoint_every > 0:
            return self.cfg.checkpoint_every
        # A multiple of the evaluation interval, so checkpoints fall on evaluation steps. The
        # checkpoint's record computes the exact ε (evaluation rows use a cheaper bound).
        every = self.eval_every
        return every * max(1, round(_interval(0, self.total, 10) / every))

    def eval_split(self, *, subsample: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The evaluation records; with ``subsample``, ``cfg.eval_subsample`` of them, evenly spaced.

        Even spacing (a public rule) keeps every part of a split ordered by class in the subsample.
        """
        x, y = (
            (self.data.x_val, self.data.y_val) if self.cfg.eval_split == "val" else (self.data.x_test, self.data.y_test)
        )
        idx = self.eval_index(subsample=subsample)
        return (x, y) if idx is None else (x[idx], y[idx])

    def eval_index(self, *, subsample: bool = False) -> torch.Tensor | None:
        """The positions in the evaluation split that :meth:`eval_split` returns (None: all of them)."""
        n = len(self.data.y_val if self.cfg.eval_split == "val" else self.data.y_test)
        k = self.cfg.eval_subsample
        return torch.linspace(0, n - 1, k).round().long() if subsample and 0 < k < n else None


def _interval(value: int, total: int, default_count: int) -> int:
    return value if value > 0 else max(1, -(-total // default_count))


def randomness_section(*, insecure_seed: int | None, public_seed: int | None = None) -> dict[str, Any]:
    """How a run's privacy noise and batch sampling were drawn, for its record.

    Example:
        >>> randomness_section(insecure_seed=None)["noise_and_sampling"]
        'secret'
        >>> randomness_section(insecure_seed=3)["insecure_seed"]
        3
    """
    out: dict[str, Any]
    if insecure_seed is None:
        out = {
            "noise_and_sampling": "secret",
            "generator": "AES-256-CTR keyed from OS entropy (privopt.rng.SecureSource); keys saved only in checkpoints",
            "insecure_seed": None,
        }
    else:
        out = {
            "noise_and_sampling": "seeded (INSECURE: anyone who knows insecure_seed can replay the noise; not private)",
            "generator": "torch generators seeded from insecure_seed (privopt.rng.TorchSource)",
            "insecure_seed": insecure_seed,
        }
    if public_seed is not None:
        out["public_seed"] = public_seed  # model initialisation and data splits: public choices
    return out


def run_sources(insecure_seed: int | None, *, client: int = 0) -> dict[str, RandomSource]:
    """The noise and sampler sources of a run: secret unless ``insecure_seed`` is given. Under torchrun,
    process ``client`` draws its own (:func:`privopt.distributed.client_sources`). The noise source draws
    each step's noise ahead, except in workers without a spare core (:func:`privopt.grads.ahead.run_noise_source`)."""
    if client:
        from privopt.distributed import client_sources

        sources = client_sources(insecure_seed, client)
    else:
        sources = make_sources(insecure_seed=insecure_seed)
    # The next step's noise is drawn in a background thread (same values and order: docs/engines.md).
    return {**sources, "noise": run_noise_source(sources["noise"])}


def _dataset(cfg: RunConfig, dataset: Any, files: dict[str, str]) -> Any:
    """The run's data; ``files`` (in: a resumed run's recorded paths) gets the absolute paths read."""
    from privopt.data.user import ensure_dataset
    from privopt.training.data_files import load_config_dataset

    if dataset is None:
        data, read = load_config_dataset(cfg, files)
        files.clear()
        files.update(read)
    else:
        data = ensure_dataset(dataset)
        _check_dataset_params(cfg, data)
    if not cfg.features:
        return data
    from privopt.data.features import apply_features

    params = {k: v for k, v in cfg.features.items() if k != "name"}
    return apply_features(data, cfg.features["name"], **params)


def _check_dataset_params(cfg: RunConfig, data: Any) -> None:
    """A dataset passed in was loaded already: ``cfg.dataset_params`` can only describe how (the
    record states them), so they must be the ones :func:`privopt.data.load_dataset` loaded it with."""
    from privopt.data.registry import explicit_load_params

    stated = explicit_load_params(dict(cfg.dataset_params))
    loaded = (getattr(data, "meta", None) or {}).get("public", {}).get("loaded_with")
    if stated and stated != loaded:
        keys = sorted(k for k in stated if (loaded or {}).get(k, object()) != stated[k])
        raise ConfigError(
            f"dataset_params {keys} would be ignored: a dataset was passed in, and dataset_params apply only "
            "when the run loads cfg.dataset itself; load the dataset with them "
            "(privopt.data.load_dataset(name, **dataset_params)) or remove them from the config"
        )


def _model(cfg: RunConfig, data: Any, model: Any) -> nn.Module:
    from privopt.models import build_model

    if model is None:
        return build_model(cfg.model, input_shape=data.input_shape, num_classes=data.num_classes, **cfg.model_params)
    if not isinstance(model, nn.Module):
        raise ModelError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if cfg.model_params:  # they configure cfg.model, which is not built
        raise ConfigError(
            f"model_params {sorted(cfg.model_params)} would be ignored: a model was passed in, and model_params "
            "apply only when the run builds cfg.model; configure your module directly or remove them from the config"
        )
    return model


def _place(cfg: RunConfig, data: Any, net: nn.Module) -> tuple[Any, nn.Module]:
    """Model and data on ``cfg.device`` (a no-op on the CPU); fails early when CUDA is missing."""
    import dataclasses

    from privopt.config import resolve_device

    device = resolve_device(cfg.device)
    if device.type == "cpu":
        return data, net
    moved = {
        f.name: getattr(data, f.name).to(device)
        for f in dataclasses.fields(data)
        if isinstance(getattr(data, f.name), torch.Tensor)
    }
    return dataclasses.replace(data, **moved), net.to(device)


def _check_metrics(cfg: RunConfig) -> list[RunMetric]:
    metrics = get_run_metrics(cfg.metrics)
    if not cfg.non_private_diagnostics:
        reading = [m.name for m in metrics if m.reads_private_data]
        if reading:
            raise ConfigError(
                f"run metric(s) {reading} read the private training data (their values are not private); "
                "set non_private_diagnostics: true to write them to diagnostics.NOT_PRIVATE.json"
            )
        if cfg.eval_split == "val":
            raise ConfigError(
                "eval_split 'val' evaluates on records carved from the private training split (not private); "
                "set non_private_diagnostics: true to write those metrics to diagnostics.NOT_PRIVATE.json"
            )
    return metrics


def _privacy(cfg: RunConfig, algo: Algorithm, n: int, ledger_state, plan: PreTraining) -> tuple[Any, Any, Any]:
    inventory = with_pretraining(algo.inventory(n=n) if algo.private else None, plan, algo.name)
    if inventory is None:
        return None, None, None
    p = cfg.privacy
    # delta >= 1/n allows mechanisms that publish a random record in full: refused unless allowed.
    check_delta_for_size(
        p.delta,
        dataset_size=n,
        allow_large=p.allow_large_delta,
        name="privacy.delta",
        override="set privacy.allow_large_delta: true",
    )
    # An adaptive schedule is certified by an RDP filter: its nominal plan must fit under RDP.
    accountant = "rdp" if inventory.composition == "filter" else p.accountant
    calibration = calibrate(
        inventory, epsilon=p.epsilon, delta=p.delta, neighbouring=p.neighbouring, accountant=accountant
    )
    if ledger_state is not None:  # a resumed run: the ledger as it was checkpointed
        return inventory, calibration, ledger_from_dict(ledger_state)
    ledger = make_ledger(
        inventory,
        calibration.noise,
        delta=p.delta,
        neighbouring=p.neighbouring,
        accountant=p.accountant,
        target_epsilon=p.epsilon,
    )
    return inventory, calibration, ledger


def _extra(cfg: RunConfig, data: Any, comm: Any) -> dict[str, Any]:
    """What federated algorithms read from the context: the public seed of the client split, the
    split itself (the data layer's), the communicator and how to seed the clients' randomness."""
    from privopt.data.splits import client_shards

    extra = {"dataset": data, "seed": cfg.seed, "insecure_seed": cfg.insecure_seed, "client_split": client_shards}
    if comm is not None:
        extra["comm"] = comm
    return extra


def stated_config(cfg: Any, *, loss: Any = None, dataset: Any = None) -> RunConfig:
    """The run's config as its record states it: a dataset or loss passed in is named there."""
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"expected a privopt.config.RunConfig, got {type(cfg).__name__}")
    cfg.validate()
    if dataset is not None:  # else the record would name the config's (default) dataset
        cfg = replace(cfg, dataset=str(getattr(dataset, "name", None) or "custom"))
    if loss is None:
        return cfg
    if not callable(loss):
        raise ConfigError(f"loss must be a callable (outputs, targets) -> per-example losses, got {loss!r}")
    stated = replace(cfg, loss=CUSTOM_LOSS)
    stated._file_folders = file_folders(cfg)  # not a field: replace() drops it
    return stated


def _test_hint(data: Any) -> str:
    """What to do about an empty test split: a carved one is empty when the data has few distinct records."""
    if str(data.public_meta.get("test_split", "")).startswith("carved"):
        return (
            "it is carved per record by a keyed hash of each record's content, so identical records share a "
            "split; give a test file (dataset_params.test_path for a csv dataset), another seed or test_fraction"
        )
    return "pass x_test=/y_test= to Dataset.from_tensors (the test split is public: its records are not protected)"


def _data_and_model(
    cfg: RunConfig, dataset: Any, model: Any, loss: Any, engine: Any, files: dict[str, str]
) -> tuple[Any, nn.Module, Any]:
    """The validated data, model (initialised with the public seed) and per-example loss, placed on the
    device; with an ``engine`` (private runs), checked to give per-example gradients. ``files``: as
    :func:`_dataset`."""
    torch.manual_seed(cfg.seed)  # public randomness: model initialisation
    data = _dataset(cfg, dataset, files)
    data.validate()  # user datasets especially: NaN/inf, shapes and labels fail here, before any output
    if cfg.feature_centering and not data.x_train.is_floating_point():  # a mean of ids is no feature
        raise ConfigError(f"feature_centering needs floating features; dataset {data.name!r} holds integer ids")
    if cfg.eval_split == "val" and data.y_val.shape[0] == 0:
        raise ConfigError("eval_split 'val' needs a validation split: set dataset_params.val_fraction > 0")
    if cfg.eval_split == "test" and data.y_test.shape[0] == 0:
        raise DataError(
            f"dataset {data.name!r} has no test split to evaluate the released model on: {_test_hint(data)}"
        )
    net = _model(cfg, data, model)
    validate_model(net)
    data, net = _place(cfg, data, net)
    loss_fn = build_loss(cfg.loss) if loss is None else loss
    what, classes = f"dataset {data.name!r}'s inputs", data.num_classes
    x, y = data.x_train[(rows := probe_rows(data.x_train))], data.y_train[rows]
    check_model_fits(net, loss_fn, x, y, what=what, num_classes=classes, engine=engine)
    return data, net, loss_fn


def _provenance(**given: Any) -> dict[str, str]:
    """Where each part came from: ``"config"`` (built from the config) or ``"api"`` (passed in)."""
    return {k: "config" if v is None else "api" for k, v in given.items()}


def _check_launch(cfg: RunConfig, algo: Algorithm, comm: Any) -> None:
    """Several torchrun processes are one client each: an algorithm without clients is refused (every
    process would train the whole run alone, and only rank 0's outputs be kept)."""
    if comm is not None and comm.world_size > 1 and "clients" not in algo.hyperparameters():
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} has no clients: torchrun with {comm.world_size} processes would run it "
            "once per process; launch it without torchrun (one process)"
        )


def build_run(
    cfg: RunConfig,
    *,
    dataset: Any = None,
    model: Any = None,
    loss: Any = None,
    ledger_state: Any = None,
    comm: Any = None,
    released: Any = None,
    data_files: dict | None = None,
    plugins: list[str] | None = None,
) -> Run:
    """Everything a run needs, validated, from ``cfg`` (and your own ``dataset``/``model``/``loss``).

    ``loss`` is a per-sample loss ``(outputs, targets) -> [B]``; the run's config then says
    ``loss: custom``. ``ledger_state`` (a :meth:`PrivacyLedger.to_dict`) restores a checkpointed
    ledger instead of a new one (and ``released`` the statistics it released), so the algorithm is set up with
    the ledger it will record into. ``comm`` (a :class:`privopt.distributed.Communicator`, under torchrun) makes
    this process one client of a federated run (algorithms with ``clients``; docs/algorithms/sosp.md).
    ``data_files`` and ``plugins`` (a resumed run's checkpoint's): the files it read and the plugins it
    imported (first of all: they register the names the config looks up)."""
    imported = load_plugins(cfg, plugins) if isinstance(cfg, RunConfig) else []
    cfg = stated_config(cfg, loss=loss, dataset=dataset)
    algo = get_algorithm(cfg.algorithm, **cfg.algorithm_params)
    _check_launch(cfg, algo, comm)
    engine = get_engine(cfg.engine)  # a bad name fails before any data is loaded
    plan = plan_pretraining(cfg, comm)
    if algo.private and cfg.privacy.epsilon is None:
        raise ConfigError(f"algorithm {cfg.algorithm!r} is private: set privacy.epsilon")
    metrics = _check_metrics(cfg)
    files = dict(data_files or {})  # then the files read
    data, net, loss_fn = _data_and_model(cfg, dataset, model, loss, engine if algo.private else None, files)
    inventory, calibration, ledger = _privacy(cfg, algo, int(data.y_train.shape[0]), ledger_state, plan)
    sources = run_sources(cfg.insecure_seed, client=comm.rank if comm is not None else 0)
    data, offsets, now = apply_pretraining(
        cfg, data, plan, calibration, ledger, rng=sources["noise"], released=released
    )
    ctx = RunContext(
        model=net,
        loss_fn=loss_fn,
        x_train=data.x_train,
        y_train=data.y_train,
        engine=engine,
        ledger=ledger,
        noise=dict(calibration.noise) if calibration is not None else {},
        noise_rng=sources["noise"],
        sampler_rng=sources["sampler"],
        extra=_extra(cfg, data, comm),
    )
    algo.setup(ctx)
    return Run(
        cfg=cfg, data=data, model=net, loss_fn=loss_fn, algo=algo, ctx=ctx, sources=sources, ledger=ledger,
        inventory=inventory, calibration=calibration, metrics=metrics, total=int(algo.num_steps()),
        provenance=_provenance(dataset=dataset, model=model, loss=loss), released=now, logit_offsets=offsets,
        data_files=files, plugins=imported,
    )  # fmt: skip
