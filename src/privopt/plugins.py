"""Plugins: your own Python code, imported before a run looks up any name, so that what it registers
(an algorithm, a model, a dataset, a loss, an engine, a run metric...) can be named in a config.

A config's ``plugins: [mypkg.ext, ext.py]`` and the command line's ``--plugin MODULE_OR_FILE``
(``privopt train``, ``audit``, ``list``, ``predict``, ``reproduce dro-table3``/``dro-mia``, and
``reproduce --plugin FILE NAME`` for an experiment a plugin registers) name them:
a module name is imported as Python imports it (an installed package or one on ``PYTHONPATH``); a
path ending in ``.py`` is run as a module of its own. A relative path read from a config file is
relative to that file's folder; one given with ``--plugin``, ``--set`` or the Python API, to the current
directory (:func:`privopt.config.file_folders`). A plugin is imported once per process, however often
it is named (a file is known by its absolute path), so naming it in the config and with ``--plugin``
registers nothing twice. The record states the entries as written; the SECRET checkpoint keeps the
absolute paths, so a resume imports the same files from any current directory.

A plugin is code that runs with your rights, and an algorithm it registers is only as private as
its declared release plan: the run still calibrates the noise from that plan and the ledger charges
every release made through it. Guide: ``docs/api.md``, "Extending privopt".
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from privopt.config import RunConfig, file_folders, is_plugin_file, plugin_target
from privopt.errors import ConfigError, PrivoptError, debug_enabled
from privopt.quiet import foreign_error_line

__all__ = ["load_plugins", "import_plugins", "plugin_targets"]

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# Modules made from plugin files are named with this prefix (and a hash of their path).
FILE_MODULE_PREFIX = "privopt_plugin_"


def plugin_targets(cfg: RunConfig, recorded: list[str] | None = None) -> list[tuple[str, str, str]]:
    """``(entry, target, where)`` of each of ``cfg.plugins``: the target is the module name or the file's
    absolute path; ``recorded`` (a checkpoint's targets, in order) are kept as they are."""
    folders, out = file_folders(cfg), []
    for i, entry in enumerate(cfg.plugins):
        if recorded and len(recorded) == len(cfg.plugins):
            out.append((entry, recorded[i], "where the run read it when it started: its checkpoint keeps that path"))
        elif f"plugins.{i}" in folders:
            folder, config_file = folders[f"plugins.{i}"]
            where = f"relative to the folder of the config file {config_file}"
            out.append((entry, plugin_target(entry, folder), where))
        else:
            absolute = Path(entry).expanduser().is_absolute()
            out.append((entry, plugin_target(entry), "absolute" if absolute else "from the current directory"))
    return out


def load_plugins(cfg: RunConfig, recorded: list[str] | None = None) -> list[str]:
    """Import ``cfg.plugins`` (each once per process) and return their targets (module names and
    absolute file paths: for the checkpoint only, never a record).

    Raises:
        ConfigError: naming the plugin, when it is not found or its import fails.
    """
    targets = plugin_targets(cfg.validate(), recorded)  # validate: a bad ``plugins`` value is named
    for entry, target, where in targets:
        _import(entry, target, where)
    return [target for _, target, _ in targets]


def import_plugins(entries: Sequence[str]) -> list[ModuleType]:
    """Import plugins named on the command line or given to a reproduction (files from the current
    directory); the modules.

    Raises:
        ConfigError: when ``entries`` is not a list of module names and file paths, or a plugin is not
            found or its import fails (naming it).
    """
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) and e.strip() for e in entries):
        raise ConfigError(f"plugins must be a list of module names or .py file paths, got {entries!r}")
    return [_import(e, plugin_target(e), "from the current directory") for e in entries]


def _import(entry: str, target: str, where: str) -> ModuleType:
    if is_plugin_file(entry):
        return _import_file(entry, target, where)
    if not _MODULE_NAME.fullmatch(target):
        raise ConfigError(
            f"plugin {entry!r} is neither a module name (mypkg.ext) nor a Python file (a path ending in .py)"
        )
    try:
        spec = sys.modules.get(target) or importlib.util.find_spec(target)  # imports its parent packages only
        same = _loaded(os.path.abspath(spec.origin)) if getattr(spec, "origin", None) else None
        if same is not None:  # the file was imported by its path already: once is enough
            return sys.modules.setdefault(target, same)
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name and (target == e.name or target.startswith(e.name + ".")):
            raise ConfigError(
                f"plugin {entry!r}: no module named {e.name!r} on the Python path (sys.path: installed packages, "
                "PYTHONPATH, and the current directory only under python -m); a plugin file is given as its path, "
                "ending in .py"
            ) from None
        raise _failed(entry, e) from e
    except PrivoptError as e:
        raise ConfigError(f"plugin {entry!r}: {e}") from e
    except Exception as e:  # the plugin's own code failed: its text may quote data, as any foreign error
        raise _failed(entry, e) from e


def _loaded(path: str) -> ModuleType | None:
    """The module already imported from the file ``path`` (as a plugin file or by its module name)."""
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.normpath(os.path.abspath(file)) == os.path.normpath(path):
            return module
    return None


def _import_file(entry: str, path: str, where: str) -> ModuleType:
    module = _loaded(path)
    if module is not None:
        return module
    if not Path(path).is_file():
        raise ConfigError(f"plugin {entry!r}: file {path} ({where}) does not exist (or is not a file)")
    stem = re.sub(r"\W", "_", Path(path).stem)
    name = f"{FILE_MODULE_PREFIX}{stem}_{hashlib.sha256(path.encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugin {entry!r}: {path} ({where}) cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look their module up there
    try:
        spec.loader.exec_module(module)
    except PrivoptError as e:
        del sys.modules[name]
        raise ConfigError(f"plugin {entry!r}: {e}") from e
    except Exception as e:
        del sys.modules[name]
        raise _failed(entry, e) from e
    return module


def _failed(entry: str, err: Exception) -> ConfigError:
    """A plugin's import raised: its type and where; its message only under ``--debug`` (it may quote data)."""
    if isinstance(err, SyntaxError):  # where in the plugin's code (no data in a syntax error)
        text = f"SyntaxError: {err.msg} ({err.filename}, line {err.lineno})"
    else:
        text = f"{type(err).__name__}: {err}" if debug_enabled() else foreign_error_line(err)
    return ConfigError(f"plugin {entry!r} failed while it was imported: {text}")
