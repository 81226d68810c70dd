"""The ``privopt list`` command: the registered algorithms, datasets, models, engines and experiments,
those of ``--plugin`` modules too (marked with the plugin that registered them)."""

from __future__ import annotations

import json

from privopt.cliargs import add_plugin_option

__all__ = ["add_list_parser"]


def _sections() -> dict[str, dict[str, str]]:
    from privopt.algorithms import available_algorithms
    from privopt.data import available_datasets
    from privopt.experiments import available_experiments
    from privopt.grads import available_engines
    from privopt.models import available_models

    return {
        "algorithms": {
            k: (v.summary or "") + ("" if v.private else " [non-private]") for k, v in available_algorithms().items()
        },
        "datasets": dict.fromkeys(available_datasets(), ""),
        "models": dict.fromkeys(available_models(), ""),
        "engines": dict.fromkeys(available_engines(), ""),
        "experiments": available_experiments(),
    }


def _with_plugins(entries: list[str]) -> dict[str, dict[str, str]]:
    """The sections after importing ``entries`` in turn; what each registered says so."""
    from privopt.plugins import import_plugins

    sections = _sections()
    for entry in entries:
        import_plugins([entry])
        for title, items in _sections().items():
            for name, desc in items.items():
                if name not in sections[title]:
                    sections[title][name] = f"{desc} [plugin {entry}]".lstrip()
    return sections


def _cmd_list(args) -> int:
    sections = _with_plugins(args.plugin)
    if args.json:
        print(json.dumps({k: list(v) for k, v in sections.items()}))
        return 0
    for title, items in sections.items():
        print(f"{title}:")
        for name, desc in items.items():
            print(f"  {name:22s} {desc}".rstrip())
    return 0


def add_list_parser(sub) -> None:
    li = sub.add_parser("list", help="list algorithms, datasets, models, engines and experiments")
    li.add_argument("--json", action="store_true", help="print the lists as one JSON object")
    add_plugin_option(li, what="the lists show")
    li.set_defaults(func=_cmd_list)
