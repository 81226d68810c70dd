"""Every ``privopt ...`` command README.md and docs/**/*.md show is a command of the current CLI.

Collected: each line of a shell block (```bash, ```sh, ```shell, ```console and untagged blocks,
``\\`` continuations joined, ``$ `` prompts and ``# comments`` dropped) and each inline `code` span
that is a command: ``privopt ...``, ``python -m privopt ...``, ``torchrun ... -m privopt ...``, also
behind ``nice -n 5``, ``/usr/bin/time -v`` or ``VAR=value``. Each is parsed by the CLI's own
``privopt.cli.build_parser()`` (nothing runs), with abbreviated options refused (the docs spell options
in full). Then every ``--set KEY=VALUE`` must name a ``RunConfig`` key, ``--config`` a file that loads
(with those overrides), and a ``privopt train`` line must say where it writes (``--out`` or ``--resume``).

Placeholders: ``...`` / ``…`` end a command (the rest is elided); an upper-case word (``DIR``, ``N``),
``<...>`` or ``…`` in the place of an option's value is replaced by a valid value of that option; in
the place of a subcommand it ends the command; ``a|b|c`` and ``{a,b,c}`` are checked one by one. An
inline span, or a command cut short by a placeholder, is a mention: it may leave out required options.
Lines that name privopt but are not a command of it are listed in ``NOT_COMMANDS`` with the reason.
"""

import contextlib
import io
import itertools
import re
import shlex
import sys
from typing import NamedTuple

import pytest

from privopt.plugins import FILE_MODULE_PREFIX
from test_readme import FENCE, REPO, doc_pages

SHELL_TAGS = {"bash", "sh", "shell", "console", ""}  # untagged blocks hold commands and outputs
NAMES_PRIVOPT = re.compile(r"(?:^|[\s/])privopt(?=\s|$)|-m\s+privopt(?=\s|$)")
LAUNCHERS = {"nice", "time", "torchrun", "python", "python3"}  # may come before the privopt program
ELISIONS = {"...", "…"}
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|.*(?:<[^>]*>|…).*")
# Config files the docs name that are the reader's own (not in the repository): only their --set keys are checked.
READERS_CONFIGS = {"my_run.yaml": "the reader's own config, written in docs/data.md, docs/audit.md and docs/api.md"}
# (page, text) of spans and lines that name privopt and are no command of it, and why.
NOT_COMMANDS = {
    ("docs/algorithms/dro.md", "~/.cache/privopt"): "a folder (the feature cache), not the program",
}
# Subcommands a sibling branch adds: skipped while this CLI lacks them (they parse once it has them).
# What a `--plugin` shown with a placeholder value imports (privopt reproduce imports it while it parses).
EXAMPLE_PLUGIN = "examples/my_experiment.py"
PENDING_SUBCOMMANDS = {"predict": "`privopt predict` is added on another branch (src/privopt/cli_predict.py)"}


class Shown(NamedTuple):
    where: str  # page:line
    page: str
    text: str  # as shown, continuations joined
    complete: bool  # a block line (a whole command), not an inline mention


def _joined_lines(code: str, first_line: int):
    """(line number, text) of each logical line: ``\\`` continuations joined, ``$ `` prompts dropped."""
    pending, start = [], first_line
    for n, line in enumerate(code.splitlines(), first_line):
        if not pending:
            start = n
        stripped = line.strip()
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        text = " ".join([*pending, stripped])
        pending = []
        yield start, text[2:] if text.startswith("$ ") else text


def shown_commands(page: str) -> list[Shown]:
    """Every block line and inline span of ``page`` that names privopt as a program."""
    text = (REPO / page).read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        if m.group(2).lower() in SHELL_TAGS:
            first = text.count("\n", 0, m.start(3)) + 1
            for n, line in _joined_lines(m.group(3), first):
                if NAMES_PRIVOPT.search(line.split(" #", 1)[0]) and not line.startswith("#"):
                    out.append(Shown(f"{page}:{n}", page, line, True))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # same line numbers, no blocks
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
        span = " ".join(m.group(1).split())
        if "\n\n" not in m.group(1) and NAMES_PRIVOPT.search(span):
            line = prose.count("\n", 0, m.start()) + 1
            out.append(Shown(f"{page}:{line}", page, span, False))
    return out


def program_args(text: str) -> list[str] | None:
    """The arguments after the privopt program, or None when ``text`` does not run privopt."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    for k, word in enumerate(words):
        if word == "-m" and words[k + 1 : k + 2] == ["privopt"]:
            prefix, args = words[:k], words[k + 2 :]
            break
        if word == "privopt" or word.endswith("/bin/privopt"):
            prefix, args = words[:k], words[k + 1 :]
            break
    else:
        return None
    launcher = [w for w in prefix if not re.fullmatch(r"[A-Za-z_]\w*=\S*", w)][:1]
    if launcher and launcher[0].rsplit("/", 1)[-1] not in LAUNCHERS:
        return None
    return args


def _expand(args: list[str]) -> list[list[str]]:
    """One argument list per alternative of ``a|b`` and ``{a,b}`` words; ``[--opt N]`` (a usage
    synopsis: optional) is checked as ``--opt N``."""
    options = []
    for word in _unbracketed(args):
        braces = re.fullmatch(r"\{([^{}]+,[^{}]+)\}", word)
        if braces:
            options.append(braces.group(1).split(","))
        elif re.fullmatch(r"[\w.-]+(\|[\w.-]+)+", word):
            options.append(word.split("|"))
        else:
            options.append([word])
    return [list(combo) for combo in itertools.product(*options)]


def _unbracketed(args: list[str]) -> list[str]:
    text = " ".join(args)
    if not re.search(r"\[-", text):
        return args
    assert text.count("[") == text.count("]"), f"unbalanced [...] in {text!r}"
    return [w.lstrip("[").rstrip("]") if w.startswith("[-") or w.endswith("]") else w for w in args]


def _is_placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.fullmatch(word))


def _subparser(parser, name: str):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction" and name in action.choices:
            sub = action.choices[name]
            sub.format_help()  # a reproduction's parser adds its options when first used
            sub.allow_abbrev = False
            return sub
    return None


def _takes_value(parser, option: str) -> bool:
    action = parser._option_string_actions.get(option)
    return action is not None and action.nargs is None


def _sample(action) -> str:
    """A valid value for an option shown with a placeholder value (a plugin: the docs' example one)."""
    if "--plugin" in action.option_strings:
        return EXAMPLE_PLUGIN
    return str(action.choices[0]) if action.choices else "1"


def resolve(args: list[str], *, mention: bool = False):
    """(parser, arguments with placeholder values replaced, whether the command was cut short).
    A mention may end with an option whose value it leaves out (`privopt train --resume`)."""
    from privopt.cli import build_parser

    parser = top = build_parser()
    top.allow_abbrev = False
    out, i = [], 0
    while i < len(args):
        word = args[i]
        if word in ELISIONS:
            return top, out, True
        if word.startswith("-") and i == len(args) - 1 and mention and _takes_value(parser, word):
            return top, [*out, word, _sample(parser._option_string_actions[word])], True
        if word.startswith("-"):
            action = parser._option_string_actions.get(word)
            out.append(word)
            i += 1
            if action is not None and action.nargs is None and i < len(args):  # the option's value
                out.append(_sample(action) if _is_placeholder(args[i]) else args[i])
                i += 1
            continue
        if _is_placeholder(word):
            return top, out, True
        parser = _subparser(parser, word) or parser
        out.append(word)
        i += 1
    return top, out, False


def parse(parser, args: list[str]):
    """(namespace or None, argparse's error line or None); ``--help`` parses to (None, None).
    From the repository's root (``privopt reproduce --plugin FILE`` imports the file while it parses);
    what a plugin registered is forgotten afterwards."""
    from privopt.errors import PrivoptError
    from privopt.experiments import _EXPERIMENTS

    err, experiments, modules = io.StringIO(), dict(_EXPERIMENTS._entries), set(sys.modules)
    try:
        with contextlib.chdir(REPO), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(args), None
    except PrivoptError as e:  # a plugin not found, or failing
        return None, str(e)
    except SystemExit as e:
        lines = err.getvalue().strip().splitlines()
        return None, None if e.code == 0 else (lines[-1] if lines else f"exit {e.code}")
    finally:
        _EXPERIMENTS._entries.clear()
        _EXPERIMENTS._entries.update(experiments)
        for name in set(sys.modules) - modules:
            if name.startswith(FILE_MODULE_PREFIX):
                del sys.modules[name]


def _config_problems(ns) -> list[str]:
    """--set keys that are no RunConfig key; a --config that is missing or does not load."""
    from privopt.config import RunConfig, load_config
    from privopt.errors import PrivoptError

    sets, config = getattr(ns, "set", None) or [], getattr(ns, "config", None)
    problems = [f"--set {s}: expected KEY=VALUE" for s in sets if "=" not in s]
    keys = {s.split("=", 1)[0].strip().split(".")[0] for s in sets}
    unknown = sorted(keys - set(RunConfig.__dataclass_fields__))
    problems += [f"--set {k}...: {k!r} is not a RunConfig key" for k in unknown]
    if problems or config in READERS_CONFIGS:
        return problems
    if config is not None and not (REPO / config).is_file():
        return [f"--config {config}: no such file in the repository"]
    try:
        load_config(None if config is None else REPO / config, [s for s in sets if not _has_placeholder(s)])
    except PrivoptError as e:
        return [f"--config {config} --set {sets}: {e}"]
    return []


def _has_placeholder(item: str) -> bool:
    return _is_placeholder(item.split("=", 1)[-1])


def _train_problems(ns) -> list[str]:
    from privopt.cli import _resume_conflicts

    if ns.resume:
        conflicts = _resume_conflicts(ns)
        return [f"--resume cannot take {', '.join(conflicts)}"] if conflicts else []
    return [] if ns.out else ["privopt train needs --out DIR (or --resume RUN_DIR)"]


def check(args: list[str], *, complete: bool) -> list[str]:
    """What is wrong with ``privopt ARGS`` for the current CLI ([] when nothing)."""
    problems = []
    for variant in _expand(args):
        parser, resolved, cut = resolve(variant, mention=not complete)
        ns, error = parse(parser, resolved)
        if error is not None:
            mention = cut or not complete
            if not (mention and "the following arguments are required" in error):
                problems.append(error)
            continue
        if ns is None:  # --help
            continue
        problems += _config_problems(ns)
        if ns.command == "train" and complete and not cut:
            problems += _train_problems(ns)
    return list(dict.fromkeys(problems))


def _pending(args: list[str]) -> str | None:
    from privopt.cli import build_parser

    words = [w for w in args if not w.startswith("-")][:1]
    if words and words[0] in PENDING_SUBCOMMANDS and _subparser(build_parser(), words[0]) is None:
        return PENDING_SUBCOMMANDS[words[0]]
    return None


def documented_commands() -> tuple[list[tuple[Shown, list[str]]], list[tuple[Shown, str]]]:
    """(commands with their arguments, skipped lines with the reason)."""
    commands, skipped = [], []
    for page in doc_pages():
        for shown in shown_commands(page):
            args = program_args(shown.text)
            reason = NOT_COMMANDS.get((page, shown.text)) or (None if args is None else _pending(args))
            if reason is not None:
                skipped.append((shown, reason))
            elif args is None:
                commands.append((shown, None))  # names privopt, runs something else: reported below
            else:
                commands.append((shown, args))
    return commands, skipped


COMMANDS, SKIPPED = documented_commands()


def test_the_docs_show_many_commands():
    pages = {shown.page for shown, _ in COMMANDS}
    assert len(COMMANDS) >= 150 and {"README.md", "docs/audit.md", "docs/data.md"} <= pages, len(COMMANDS)
    readme_block = [shown.text for shown, _ in COMMANDS if shown.page == "README.md" and shown.complete]
    assert any(t.startswith("torchrun ") for t in readme_block) and any("reproduce sosp" in t for t in readme_block)


def test_every_documented_command_parses():
    bad = []
    for shown, args in COMMANDS:
        problems = ["not a privopt command line"] if args is None else check(args, complete=shown.complete)
        bad += [f"{shown.where}: `{shown.text}` -> {p}" for p in problems]
    assert bad == [], f"{len(bad)} documented command(s) the current CLI refuses:\n" + "\n".join(bad)


def test_every_skip_is_listed_and_still_shown():
    """Skipped: only NOT_COMMANDS (an entry no page shows any more is stale) and pending subcommands."""
    skipped = {(shown.page, shown.text): reason for shown, reason in SKIPPED}
    assert set(NOT_COMMANDS) - set(skipped) == set(), "NOT_COMMANDS entries no page shows"
    others = {key: r for key, r in skipped.items() if key not in NOT_COMMANDS}
    assert set(others.values()) <= set(PENDING_SUBCOMMANDS.values()), others


def test_config_files_named_in_the_docs_exist_and_load():
    from privopt.config import load_config

    named = set()
    for page in doc_pages():
        named |= set(re.findall(r"\bconfigs/[\w.-]+\.ya?ml\b", (REPO / page).read_text(encoding="utf-8")))
    assert len(named) >= 4, named
    for name in sorted(named):
        assert (REPO / name).is_file(), f"the docs name {name}, which does not exist"
        load_config(REPO / name)


@pytest.mark.parametrize(
    "text,complete,error",
    [
        ("privopt trian --out x", True, "invalid choice: 'trian'"),
        ("privopt train --out x --outdir y", True, "unrecognized arguments: --outdir y"),
        ("privopt train --conf configs/dpsgd_digits.yaml --out x", True, "unrecognized arguments: --conf"),
        ("privopt reproduce sosp --budget fast --out x", True, "invalid choice: 'fast'"),
        ("privopt train --set privcy.epsilon=2 --out x", True, "'privcy' is not a RunConfig key"),
        ("privopt train --set privacy.epsilonn=2 --out x", True, "unknown privacy key"),
        ("privopt train --config configs/nope.yaml --out x", True, "no such file"),
        ("privopt train --config configs/dpsgd_digits.yaml", True, "needs --out"),
        ("privopt train --resume runs/r --out x", True, "--resume cannot take --out x"),
        ("privopt account --dataset-size 10", True, "the following arguments are required"),
        ("`privopt reproduce dro-table3 --budget quick`", False, None),
        ("privopt reproduce dro-table3 --dataset D --seeds N --out DIR", True, None),
        ("privopt bench --accounting-cache fresh|off|user", True, None),
        ("privopt bench --accounting-cache fresh|of", True, "invalid choice: 'of'"),
        ("privopt reproduce worst-group --dataset {adult,celeba,synthetic} --out …", True, None),
        ("privopt reproduce NAME", True, None),
        ("privopt --debug ...", True, None),
        ("`privopt train --resume`", False, None),
        ("privopt train --resume", True, "expected one argument"),
        ("privopt reproduce sosp --out DIR [--jobs N] [--json]", True, "unrecognized arguments: --jobs"),
        ("nice -n 5 /usr/bin/time -v .venv/bin/privopt list  # time it", True, None),
        ("PYTHONPATH=<src> python -m privopt --help", True, None),
        ("torchrun --standalone --nproc_per_node=4 -m privopt train --resume r", True, None),
    ],
)
def test_the_check_catches_stale_commands(text, complete, error):
    problems = check(program_args(text.strip("`")), complete=complete)
    if error is None:
        assert problems == []
    else:
        assert len(problems) == 1 and error in problems[0], problems


def test_what_is_no_privopt_command():
    assert program_args("make demo   # runs `privopt demo`") is None
    assert program_args("pip install privopt[bench]") is None and program_args("~/.cache/privopt") is None
    lines = list(_joined_lines("$ privopt bench --models mlp \\\n  --json\nprivopt list\n", 7))
    assert lines == [(7, "privopt bench --models mlp --json"), (9, "privopt list")]


def test_a_pending_subcommand_is_skipped_only_while_the_cli_lacks_it():
    from privopt.cli import build_parser

    has_it = _subparser(build_parser(), "predict") is not None
    assert _pending(["predict", "--out", "x"]) == (None if has_it else PENDING_SUBCOMMANDS["predict"])
    assert _pending(["--debug", "train"]) is None
