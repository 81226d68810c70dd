"""The ``privopt reproduce`` command: one sub-command per registered experiment, those a ``--plugin``
registers too.

``privopt reproduce --plugin my_exp.py my-exp --out runs/x``: the plugins named before the experiment
are imported before its name is looked up, so an experiment a plugin registers
(:func:`privopt.experiments.register_experiment`) runs like a built-in one. The experiment's ``main``
gets them as ``args.plugin``, merged with its own ``--plugin`` option when it has one (``dro-table3``,
``dro-mia``): each plugin once, as first given, so the records state a plugin named either way.
"""

from __future__ import annotations

import argparse
import sys

from privopt.cliargs import add_plugin_option, exact_options, negative_values
from privopt.errors import ConfigError, close_name

__all__ = ["ExperimentParser", "add_reproduce_parser"]


class ExperimentParser(argparse.ArgumentParser):
    """The parser of one ``privopt reproduce NAME``: its options are added (and its module
    imported) only when that command is parsed or its help is shown, so building the CLI does
    not import every experiment."""

    def __init__(self, *args, experiment=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._experiment = experiment

    def _load(self) -> None:
        exp, self._experiment = self._experiment, None
        if exp is None:
            return
        module = exp.load()
        missing = [f"{f}()" for f in ("add_arguments", "main") if not callable(getattr(module, f, None))]
        if missing:  # a plugin's experiment: said before any work, not a traceback
            where = getattr(module, "__file__", None) or exp.module
            raise ConfigError(
                f"experiment {exp.name!r}: its module {where} has no {' and no '.join(missing)} "
                "(an experiment's module provides add_arguments(parser) and main(args))"
            )
        module.add_arguments(self)

        def run(args) -> int:
            from privopt.experiments.outdir import reproduction_output

            args.plugin = _merged(getattr(args, "reproduce_plugins", []), getattr(args, "plugin", None) or [])
            exp.check_requirements()  # before any work: e.g. Opacus for dpsgd-vs-opacus
            with reproduction_output(getattr(args, "out", None)):  # a user error leaves no empty --out behind
                return module.main(args)

        self.set_defaults(func=run)

    def parse_known_args(self, args=None, namespace=None):
        self._load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._load()
        return super().format_help()


def _merged(first: list[str], then: list[str]) -> list[str]:
    """``first`` and ``then`` in order, a plugin named twice (the same module or file) kept once."""
    from privopt.config import plugin_target

    out, seen = [], set()
    for entry in [*first, *then]:
        target = plugin_target(entry) if entry.strip() else entry
        if target not in seen:
            seen.add(target)
            out.append(entry)
    return out


def _leading(argv: list[str]) -> tuple[list[str], str | None]:
    """The ``--plugin`` values before the experiment's name, and the name (``None`` without one)."""
    plugins, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--plugin" and i + 1 < len(argv):
            plugins.append(argv[i + 1])
            i += 2
        elif token.startswith("--plugin="):
            plugins.append(token.split("=", 1)[1])
            i += 1
        elif token.startswith("-"):
            i += 1
        else:
            return plugins, token
    return plugins, None


class _ReproduceParser(argparse.ArgumentParser):
    """``privopt reproduce``: imports its ``--plugin`` entries, then adds a command for each experiment
    they registered, before the experiment's name is looked up."""

    experiments: argparse._SubParsersAction

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        plugins, name = _leading(argv)
        if plugins:
            self._add_plugin_experiments(plugins)
        choices = self.experiments.choices
        if name is not None and name not in choices:
            self.error(
                f"unknown experiment {name!r}{close_name(name, choices)}; available: {', '.join(choices)} (an "
                "experiment a plugin registers needs the plugin named before it: privopt reproduce --plugin "
                "MODULE_OR_FILE NAME ...)"
            )
        return super().parse_known_args(argv, namespace)

    def _add_plugin_experiments(self, plugins: list[str]) -> None:
        from privopt.experiments import experiment_entries
        from privopt.plugins import import_plugins

        for entry in plugins:  # one at a time: each new experiment's help names the plugin that registered it
            import_plugins([entry])
            for name, exp in experiment_entries().items():
                if name not in self.experiments.choices:
                    text = f"{exp.help_text} [plugin {entry}]"
                    sub = self.experiments.add_parser(name, help=text, description=exp.help_text, experiment=exp)
                    negative_values(exact_options(sub))


def add_reproduce_parser(sub) -> None:
    """Add ``privopt reproduce`` and a (lazily loaded) sub-command per registered experiment."""
    from privopt.experiments import experiment_entries

    kind, sub._parser_class = sub._parser_class, _ReproduceParser  # add_parser takes no parser class
    try:
        r = sub.add_parser(
            "reproduce",
            help="paper reproductions (and your own: --plugin)",
            description="Reproduce a paper's tables and figures, or run a reproduction a plugin registers "
            "(privopt reproduce --plugin my_exp.py my-exp --out DIR).",
        )
    finally:
        sub._parser_class = kind
    add_plugin_option(
        r, what="privopt reproduce NAME can run", kinds="an experiment: privopt.experiments.register_experiment",
        stated="give it before the experiment's name; the experiment gets it in args.plugin",
        dest="reproduce_plugins",  # an experiment's own --plugin (dro-table3's) fills `plugin`
    )  # fmt: skip
    rsub = r.add_subparsers(dest="experiment", required=True, parser_class=ExperimentParser, metavar="EXPERIMENT")
    r.experiments = rsub
    for name, exp in experiment_entries().items():
        rsub.add_parser(name, help=exp.help_text, description=exp.help_text, experiment=exp)
