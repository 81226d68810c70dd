"""Run configuration: a validated YAML/dict schema with ``key=value`` overrides.

Example config (``privopt train --config run.yaml --set algorithm_params.lr=0.5``)::

    algorithm: dp-sgd
    algorithm_params: {epochs: 5, batch_size: 64, lr: 0.5, clip: 1.0}
    dataset: digits
    model: mlp
    privacy: {epsilon: 1.0, delta: 1.0e-5}      # delta >= 1/n needs privacy.allow_large_delta: true
    seed: 0                                    # public: model initialisation and data splits
    insecure_seed: null                        # N: seeded noise and sampling, reproducible but NOT private
    non_private_diagnostics: false             # true: diagnostics.NOT_PRIVATE.json (training-set values)

What a run publishes and why: ``docs/privacy.md``.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from privopt.errors import ConfigError, close_name

__all__ = [
    "RunConfig",
    "PrivacyConfig",
    "load_config",
    "apply_overrides",
    "resolve_device",
    "yaml_load",
    "FILE_OPTIONS",
    "file_folders",
    "is_plugin_file",
    "plugin_target",
]

# The dataset_params that name a file (dataset: csv). Read from a config file, a relative one is
# relative to the file's folder; given with --set or through the Python API, to the current directory.
FILE_OPTIONS = ("path", "test_path")


def resolve_device(name: Any) -> Any:
    """A ``torch.device`` for ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; a clear error when the name is
    unknown or CUDA is not available on this machine.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch

    if not isinstance(name, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} requested but CUDA is not available on this machine (use 'cpu')")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) available")
    return torch.device(name)


class _Loader(yaml.SafeLoader):
    """YAML 1.2 scalars: ``1e-5`` (no dot) is a number, and only ``true``/``false`` are booleans.

    PyYAML follows YAML 1.1, where ``yes``/``no``/``on``/``off``/``y``/``n`` are booleans too, so
    ``dataset: no`` or ``--set model_params.bias=yes`` would silently change type. They are plain
    strings here, and a key that needs a boolean refuses them with a clear error. A key given twice
    in one mapping is an error (YAML 1.2 requires unique keys; PyYAML keeps the last silently, so a
    second ``privacy:`` block would drop the first one's epsilon).
    """

    def construct_mapping(self, node, deep=False):
        first_line: dict = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges: their keys are overridden by design
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                continue  # unhashable keys get PyYAML's own error
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first_line[key]})", key_node.start_mark
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_BOOL = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.inf|\.nan)$""", re.X
    ),
    list("-+0123456789."),
)


def yaml_load(text: str):
    """Parse YAML with YAML 1.2 scalars (scientific-notation floats; only true/false are booleans).

    Example:
        >>> yaml_load("{a: 1e-5, b: yes, c: true}")
        {'a': 1e-05, 'b': 'yes', 'c': True}
    """
    return yaml.load(text, Loader=_Loader)


def _bool_hint(value: Any) -> str:
    """Why ``yes``/``no``/``on``/``off`` are not booleans here."""
    yaml11 = {"y", "yes", "n", "no", "on", "off"}
    if isinstance(value, str) and value.lower() in yaml11:
        return " (configs are read as YAML 1.2: write true or false; yes/no/on/off are strings)"
    return ""


@dataclass
class PrivacyConfig:
    """Target privacy of a run. ``epsilon=None`` only for non-private algorithms."""

    epsilon: float | None = 1.0
    delta: float = 1e-5
    neighbouring: str = "add_remove"
    accountant: str = "auto"
    # delta >= 1/n allows mechanisms that publish a random record in full: refused unless set.
    allow_large_delta: bool = False

    def validate(self) -> None:
        if self.epsilon is not None and not (
            isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0
        ):
            raise ConfigError(f"privacy.epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ConfigError(f"privacy.delta must be in (0, 1), got {self.delta!r}")
        if self.neighbouring not in ("add_remove", "replace_one"):
            raise ConfigError(f"privacy.neighbouring must be 'add_remove' or 'replace_one', got {self.neighbouring!r}")
        if self.accountant not in ("auto", "pld", "rdp"):
            raise ConfigError(f"privacy.accountant must be 'auto', 'pld' or 'rdp', got {self.accountant!r}")
        if not isinstance(self.allow_large_delta, bool):
            v = self.allow_large_delta
            raise ConfigError(f"privacy.allow_large_delta must be true or false, got {v!r}{_bool_hint(v)}")


@dataclass
class RunConfig:
    """Everything that defines one training run (written verbatim into ``record.json``)."""

    algorithm: str = "dp-sgd"
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    dataset: str = "digits"
    dataset_params: dict[str, Any] = field(default_factory=dict)
    data_dir: str | None = None
    model: str = "mlp"
    model_params: dict[str, Any] = field(default_factory=dict)
    loss: str = "cross_entropy"
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    engine: str = "auto"
    device: str = "cpu"  # "cuda" / "cuda:N": model, data and noise on a GPU (e.g. --budget paper)
    seed: int = 0  # public randomness: data splits, model initialisation
    insecure_seed: int | None = None  # opt-in: seed privacy noise and sampling (NOT private)
    eval_split: str = "test"  # "val" for hyper-parameter tuning (needs dataset_params.val_fraction)
    metrics: list[str] = field(default_factory=list)  # extra run metrics (privopt.training.register_run_metric)
    eval_every: int = 0  # 0: about 20 evaluations per run
    # Intermediate evaluations read this many records of the eval split, evenly spaced (0: all); the
    # final evaluation reads all. Evaluating a cnn on 10,000 test images 20 times took most of a run.
    eval_subsample: int = 2000
    checkpoint_every: int = 0  # 0: about 10 checkpoints per run
    # Write diagnostics.NOT_PRIVATE.json: training-set metrics, exact counts, run metrics that read the
    # training data. NOT private (no noise, not accounted); needed for eval_split "val" and such metrics.
    non_private_diagnostics: bool = False
    plots: bool = True  # write curves.png
    # DP feature centring (privopt.data.centering): {norm_bound: R, noise_ratio: r}; {} = off.
    feature_centering: dict[str, Any] = field(default_factory=dict)
    # Post-hoc logit adjustment (privopt.data.class_prior): predict with logits − τ·log π, π a public
    # prior {prior: [...]} or the training labels' histogram released with noise {noise_ratio: r}; {} = off.
    logit_adjustment: dict[str, Any] = field(default_factory=dict)
    # A fixed, public feature map applied to every split (privopt.data.features), e.g.
    # {name: scattering, scale: 64.0}; {} = the inputs as loaded.
    features: dict[str, Any] = field(default_factory=dict)
    # How the hyper-parameters were chosen when that read private data (e.g. a grid search on a
    # validation split of the training data): the record says this choice is not accounted.
    hyperparameter_tuning: str | None = None
    # User code imported before any name is looked up (privopt.plugins): module names (mypkg.ext) or
    # .py files (from a config file: relative to its folder). Its registrations can then be named.
    plugins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.privacy, dict):  # RunConfig(privacy={...}) reads like the YAML it mirrors
            _refuse_unknown("privacy", self.privacy, PrivacyConfig.__dataclass_fields__)
            self.privacy = PrivacyConfig(**self.privacy)

    def validate(self) -> RunConfig:
        if not isinstance(self.privacy, PrivacyConfig):
            raise ConfigError(f"privacy must be a mapping, got {self.privacy!r}")
        self.privacy.validate()
        for key in ("non_private_diagnostics", "plots"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(
                    f"{key} must be true or false, got {getattr(self, key)!r}{_bool_hint(getattr(self, key))}"
                )
        for key in ("eval_every", "eval_subsample", "checkpoint_every", "seed"):
            v = getattr(self, key)
            if isinstance(v, bool) or not (isinstance(v, int) and v >= 0):
                raise ConfigError(f"{key} must be an integer >= 0, got {v!r}")
        if self.hyperparameter_tuning is not None and not isinstance(self.hyperparameter_tuning, str):
            raise ConfigError(
                f"hyperparameter_tuning must be a note (a string) or null, got {self.hyperparameter_tuning!r}"
            )
        if isinstance(self.dataset, dict):  # the layout of other tools' configs: say where the options go
            raise ConfigError(
                "dataset must be a dataset name (e.g. dataset: csv), got a mapping; put its options under "
                "dataset_params (docs/data.md, 'Your own CSV file from the command line')"
            )
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            raise ConfigError(f"data_dir must be a folder path (a string) or null, got {self.data_dir!r}")
        v = self.insecure_seed
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError(f"insecure_seed must be null or an integer >= 0, got {v!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.eval_split not in ("test", "val"):
            raise ConfigError(f"eval_split must be 'test' or 'val', got {self.eval_split!r}")
        if not isinstance(self.plugins, list) or not all(isinstance(p, str) and p.strip() for p in self.plugins):
            raise ConfigError(
                f"plugins must be a list of module names or .py file paths ([mypkg.ext, ext.py]), got {self.plugins!r}"
            )
        if not isinstance(self.metrics, list):
            raise ConfigError(f"metrics must be a list of names, got {self.metrics!r}")
        for key in (
            "algorithm_params",
            "dataset_params",
            "model_params",
            "feature_centering",
            "features",
            "logit_adjustment",
        ):
            if not isinstance(getattr(self, key), dict):
                raise ConfigError(f"{key} must be a mapping, got {getattr(self, key)!r}")
        if self.features and not isinstance(self.features.get("name"), str):
            raise ConfigError(
                f"features needs the name of a feature map (e.g. {{name: scattering}}), got {self.features!r}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # never the config file's folder (file_folders): a record holds no machine path

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"a config must be a mapping, got {type(d).__name__}")
        d = copy.deepcopy(d)
        _refuse_unknown("config", d, cls.__dataclass_fields__)
        priv = d.pop("privacy", {}) or {}
        if not isinstance(priv, dict):
            raise ConfigError(f"privacy must be a mapping, got {priv!r}")
        _refuse_unknown("privacy", priv, PrivacyConfig.__dataclass_fields__)
        return cls(privacy=PrivacyConfig(**priv), **d).validate()


def _refuse_unknown(kind: str, given: dict[str, Any], known) -> None:
    unknown = sorted(set(given) - set(known), key=str)
    if unknown:
        hint = close_name(str(unknown[0]), known)
        raise ConfigError(f"unknown {kind} key(s) {unknown}{hint}; valid keys: {sorted(known)}")


def _parse_value(text: str) -> Any:
    try:
        return yaml_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (values parsed as YAML scalars) to a nested dict copy."""
    d = copy.deepcopy(d)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = d
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p!r} is not a mapping")
        node[parts[-1]] = _parse_value(value)
    return d


def _yaml_problem(e: yaml.YAMLError) -> str:
    """One line: what the parser found and where (its own message spans several lines)."""
    problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, *, plugins: list[str] | None = None
) -> RunConfig:
    """Read a YAML config (or start from defaults when ``path`` is None) and apply overrides; then
    add ``plugins`` (``--plugin``, from the current directory) that the config does not import already."""
    d: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            run = (
                ' (a run\'s directory: its config is the "config" of its record.json)'
                if (p / "record.json").is_file()
                else ""
            )
            raise ConfigError(f"config file {p} is a directory{run}; --config takes a YAML or JSON file")
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            d = yaml_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {_yaml_problem(e)}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {p} is not a text (UTF-8) YAML file") from None
        if not isinstance(d, dict):  # before --set, which would index into it
            raise ConfigError(f"config file {p} must hold a mapping of keys (key: value), got {type(d).__name__}")
        if {"config", "privopt_version", "privacy"} <= set(d):
            raise ConfigError(f'config file {p} is a run\'s record; the config that run used is its "config" key')
    cfg = RunConfig.from_dict(apply_overrides(d, overrides or []))
    if path is not None:
        cfg._file_folders = _file_folders(d, Path(path), overrides or [])
    _add_plugins(cfg, plugins or [])
    return cfg


def _relative(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and not Path(value).expanduser().is_absolute()


def _file_folders(d: dict[str, Any], path: Path, overrides: list[str]) -> dict[str, tuple[str, str]]:
    """``{option: (absolute folder of the config file, the file as given)}`` for the file options the
    config file gives as relative paths and ``--set`` does not replace: ``dataset_params``'
    :data:`FILE_OPTIONS` by name, ``plugins`` files as ``plugins.INDEX``."""
    replaced = {item.split("=", 1)[0].strip() for item in overrides}
    folder, out = str(path.parent.absolute()), {}
    params = d.get("dataset_params")
    for key in FILE_OPTIONS if isinstance(params, dict) else ():
        if _relative(params.get(key)) and not replaced & {"dataset_params", f"dataset_params.{key}"}:
            out[key] = (folder, str(path))
    plugins = d.get("plugins")
    for i, entry in enumerate(plugins if isinstance(plugins, list) and "plugins" not in replaced else ()):
        if _relative(entry) and is_plugin_file(entry):
            out[f"plugins.{i}"] = (folder, str(path))
    return out


def is_plugin_file(entry: str) -> bool:
    """Whether a ``plugins`` entry names a Python file (it ends in ``.py`` or holds a ``/``), not a module.

    Example:
        >>> is_plugin_file("ext/algos.py"), is_plugin_file("mypkg.algos")
        (True, False)
    """
    return entry.strip().endswith(".py") or "/" in entry or os.sep in entry


def plugin_target(entry: str, folder: str | Path | None = None) -> str:
    """What a ``plugins`` entry imports: a module name as given; a file's absolute path (a relative one
    from ``folder``, by default the current directory)."""
    if not is_plugin_file(entry):
        return entry.strip()
    return os.path.normpath(Path(folder or Path.cwd()).absolute() / Path(entry.strip()).expanduser())


def _add_plugins(cfg: RunConfig, extra: list[str]) -> None:
    """Append the ``--plugin`` entries (from the current directory) whose target the config lacks."""
    folders = file_folders(cfg)
    have = {plugin_target(p, folders.get(f"plugins.{i}", (None,))[0]) for i, p in enumerate(cfg.plugins)}
    for entry in extra:
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(f"--plugin takes a module name or a .py file path, got {entry!r}")
        if plugin_target(entry) not in have:
            have.add(plugin_target(entry))
            cfg.plugins.append(entry.strip())


def file_folders(cfg: RunConfig) -> dict[str, tuple[str, str]]:
    """``{option: (folder, config file)}``: the relative file options of ``cfg`` that :func:`load_config`
    read from a config file (``dataset_params``' by name, plugin files as ``plugins.INDEX``), and the
    folder they are relative to (the others: the current directory).
    Kept on the object only, never in :meth:`RunConfig.to_dict`, so never in a record."""
    return dict(getattr(cfg, "_file_folders", None) or {})
