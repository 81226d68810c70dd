"""The ``privopt`` command line: train, predict, account, audit, list, runs, demo, bench, reproduce."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from privopt.cli_account import add_account_parser
from privopt.cli_audit import add_audit_parser
from privopt.cli_bench import add_bench_parser
from privopt.cli_list import add_list_parser
from privopt.cli_predict import add_predict_parser
from privopt.cli_reproduce import add_reproduce_parser
from privopt.cli_runs import add_runs_parser
from privopt.cliargs import (
    DEVICES,
    add_plugin_option,
    exact_options,
    negative_values,
    non_negative_int,
    parse_with_hints,
    positive_int,
)
from privopt.errors import PrivacyBudgetExceeded, PrivoptError, debug_enabled
from privopt.quiet import debug_mode, foreign_error_line, quiet_warnings

__all__ = ["main", "build_parser"]


def _resume_conflicts(args) -> list[str]:
    """Options a resume cannot honour (it continues with the config the run started with)."""
    out = [f"--set {item}" for item in args.set] + [f"--plugin {item}" for item in args.plugin]
    if args.config is not None:
        out.append(f"--config {args.config}")
    if args.out is not None:
        out.append(f"--out {args.out}")
    if args.insecure_seed is not None:
        out.append(f"--insecure-seed {args.insecure_seed}")
    if args.device is not None:
        out.append(f"--device {args.device}")
    return out


def _print_train_result(args, record: dict, out: str) -> None:
    if args.json:
        keys = ("algorithm", "status", "metrics", "privacy", "randomness")
        print(json.dumps({k: record.get(k) for k in keys}, default=str))
    elif not args.quiet:
        priv = record["privacy"]
        eps = (
            "non-private" if not priv["private"] else f"eps={priv['epsilon_guarantee']:.4g}, delta={priv['delta']:.3g}"
        )
        if priv.get("epsilon_spent_is_ex_post"):  # stopped early: the guarantee is the plan's
            eps += f"; ex-post eps of the releases made {priv['epsilon_spent']:.4g}"
        seed = (record.get("randomness") or {}).get("insecure_seed")
        if priv["private"] and seed is not None:  # the ε line alone would read as a private run
            eps += f"; NOT private: noise and sampling seeded by --insecure-seed {seed}"
        acc = record["metrics"].get("test_accuracy")
        acc_text = "n/a" if acc is None else f"{acc:.4f}"
        worst = record["metrics"].get("test_worst_group_accuracy")
        acc_text += "" if worst is None else f", worst-group {worst:.4f}"
        print(f"{record['algorithm']}: test accuracy {acc_text} ({eps}); outputs in {out}")


def _cmd_train(args) -> int:
    from privopt.config import load_config
    from privopt.training import train

    if args.resume:
        conflicts = _resume_conflicts(args)
        if conflicts:
            raise PrivoptError(
                f"--resume continues {args.resume} with the config it was started with; it cannot honour "
                f"{', '.join(conflicts)} (start a new run with --out to change settings)"
            )
        cfg, out = None, args.resume
    else:
        if args.out is None:
            raise PrivoptError("privopt train needs --out DIR (or --resume RUN_DIR)")
        if args.allow_version_change:
            raise PrivoptError("--allow-version-change applies only to --resume RUN_DIR")
        overrides = list(args.set)
        if args.device is not None:
            overrides.append(f"device={args.device}")
        if args.insecure_seed is not None:
            overrides.append(f"insecure_seed={args.insecure_seed}")
        cfg, out = load_config(args.config, overrides, plugins=args.plugin), args.out
        _refuse_ignored_privacy_target(cfg, args.config, overrides)
    allow = args.allow_version_change
    # A fresh run into a folder that holds a finished run is refused: that run's outputs are not this
    # one's (e.g. a torchrun rank stopped while rank 0 refused the folder).
    finished_before = not args.resume and _record_status(out) == "finished"
    try:
        record = train(cfg, out_dir=out, resume=bool(args.resume), progress=not args.quiet, allow_version_change=allow)
    except KeyboardInterrupt as e:  # a signal deferred while a finished run wrote its outputs comes back here
        if str(e) or finished_before or _record_status(out) != "finished":  # a RunInterrupted says how to resume
            raise
        raise KeyboardInterrupt(f"interrupted after the run finished: its outputs are complete in {out}") from None
    if record.get("role") == "client":  # a torchrun process other than rank 0: rank 0 reports
        return 0
    _print_train_result(args, record, out)
    return 0


def _refuse_ignored_privacy_target(cfg, path: str | None, overrides: list[str]) -> None:
    """A non-private algorithm with a privacy target *written* in the config file or a ``--set``:
    the user asked for a guarantee the run would not give (``privopt.fit`` refuses it too). The
    defaults' ε alone is not a request."""
    from privopt.algorithms import available_algorithms
    from privopt.config import apply_overrides, yaml_load

    algo = available_algorithms().get(cfg.algorithm) if isinstance(cfg.algorithm, str) else None  # else refused later
    if algo is None or algo.private or cfg.privacy.epsilon is None:
        return
    written = (yaml_load(Path(path).read_text(encoding="utf-8")) or {}) if path else {}  # load_config read it already
    target = apply_overrides(written, overrides).get("privacy")
    if isinstance(target, dict) and target.get("epsilon") is not None:
        raise PrivoptError(
            f"algorithm {cfg.algorithm!r} is not private, but the config sets privacy.epsilon={target['epsilon']}: "
            "nothing this run writes would be private. Add --set privacy.epsilon=null to train without "
            "privacy, or choose a private algorithm (privopt list)"
        )


def _record_status(out: str) -> str | None:
    """The status in ``out``'s record.json (``None`` without a readable one)."""
    try:
        return json.loads((Path(out) / "record.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def _cmd_demo(args) -> int:
    from privopt.experiments.demo import run_demo

    run_demo(out_dir=args.out, progress=not args.quiet, quick=args.quick, runs=args.runs, jobs=args.jobs)
    return 0


def _add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="one training run from a YAML config")
    t.add_argument("--config", help="YAML config file (defaults are used for missing keys)")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set privacy.epsilon=2 --set algorithm_params.lr=0.5",
    )
    add_plugin_option(t)
    t.add_argument("--out", help="output directory (new or empty; locked while the run writes to it)")
    t.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its last checkpoint, with the config it was started with",
    )
    t.add_argument(
        "--insecure-seed",
        type=int,
        metavar="N",
        default=None,
        help="seed the privacy noise and batch sampling (reproducible, but anyone who reads the "
        "seed can replay the noise: NOT private; default: secret OS-entropy randomness)",
    )
    t.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="run on cpu or cuda (config key `device`; default: the config's)",
    )
    t.add_argument(
        "--allow-version-change",
        action="store_true",
        help="with --resume: continue a run checkpointed under another privopt, torch or Python version "
        "(refused by default: it may compute other sums or draw other noise; the record states the change)",
    )
    t.add_argument("--quiet", action="store_true", help="no progress output and no summary line")
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.set_defaults(func=_cmd_train)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="privopt", description=DESCRIPTION, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="print what privopt hides because it may quote PRIVATE DATA: the message and traceback of an "
        "unexpected error (from torch or your code), the text of other libraries' warnings, the line of a data "
        "file an error is about. Only on your own data; never publish that output. Same as PRIVOPT_DEBUG=1",
    )
    sub = p.add_subparsers(dest="command", required=True)

    _add_train_parser(sub)
    add_predict_parser(sub)

    add_account_parser(sub)

    add_audit_parser(sub)

    add_list_parser(sub)
    add_runs_parser(sub)

    d = sub.add_parser("demo", help="the main job on embedded data (no files needed)")
    d.add_argument(
        "--out",
        default="runs/demo",
        help="parent folder: each demo writes a new time-stamped folder in it (default runs/demo)",
    )
    d.add_argument("--quick", action="store_true", help="a much shorter schedule (smoke test)")
    d.add_argument("--quiet", action="store_true", help="no per-run progress output")
    d.add_argument(
        "--runs",
        type=positive_int,
        default=None,
        help="runs per method and ε, each on its own split; the tables show their mean ± std "
        "(default 5; 1 with --quick)",
    )
    d.add_argument(
        "--jobs",
        type=non_negative_int,
        default=2,
        help="runs at a time in worker processes (default 2; 1: in this process; 0: one per CPU core)",
    )
    d.set_defaults(func=_cmd_demo)

    add_bench_parser(sub)
    add_reproduce_parser(sub)
    return negative_values(exact_options(p))


DESCRIPTION = (
    "Differentially private optimisation (PyTorch): train, predict, account, audit, list, runs, demo, bench, reproduce."
)
EXIT_CODES = """exit codes: 0 done; 2 a user error (one-line message, nothing half-written); 3 privacy budget
exhausted; 4 the run failed (e.g. diverged, or an error raised by torch or your code: only its type and
where are printed, --debug prints its message and traceback; a run's record holds the epsilon spent);
130 interrupted (resumable); 141 the reader of the output closed it (e.g. `| head`)."""


def _inside_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _on_signal(signum, frame) -> None:
    """Ctrl-C or SIGTERM: KeyboardInterrupt, but never in the middle of an import. An interrupted
    import leaves a half-initialised module behind (numpy then fails with a RecursionError
    traceback) and some libraries swallow the exception on import; so the signal is sent again
    once the import is done. (A training run replaces this handler while it steps: it finishes
    the step, saves a checkpoint and raises RunInterrupted.)"""
    if _inside_import(frame):
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        return
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line on stderr and an exit code (see ``EXIT_CODES``)."""
    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _on_signal)
    except ValueError:  # not the main thread
        pass
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        with debug_mode(_debug_flag(argv)), quiet_warnings():
            return _run(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(argv: list[str] | None) -> int:
    command = None
    try:
        args = parse_with_hints(build_parser(), argv)
        command = args.command
        return int(args.func(args) or 0)
    except PrivacyBudgetExceeded as e:
        print(f"privopt: privacy budget exhausted: {e}", file=sys.stderr)
        return 3
    except PrivoptError as e:  # RunDiverged carries its own exit code
        code = int(getattr(e, "exit_code", 2))
        prefix = {4: "privopt: run failed: "}.get(code, "privopt: error: ")
        print(f"{prefix}{e}", file=sys.stderr)
        return code
    except BrokenPipeError:  # the reader of the output left (`privopt list | head`): not an error to report
        _silence_stdout()
        return 128 + signal.SIGPIPE  # what a shell tool killed by SIGPIPE exits with
    except OSError as e:  # disk full, permissions, a path that is a file: the user's to fix
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"privopt: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM; a training run's RunInterrupted says how to resume
        if command == "reproduce":  # one of its runs was checkpointed, but the reproduction itself restarts
            print("privopt: interrupted (run the same command again to restart the reproduction)", file=sys.stderr)
        else:
            print(f"privopt: {e}" if str(e) else "privopt: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # raised by torch, numpy, the user's code (or a privopt bug): its text may quote data
        if debug_enabled():
            traceback.print_exception(e, file=sys.stderr)
        else:
            print(f"privopt: failed: {foreign_error_line(e)}", file=sys.stderr)
        return 4


def _debug_flag(argv: list[str]) -> bool:
    """``--debug`` among the options before the command (where argparse takes it), known before
    parsing: an error while building or parsing is shown in full too."""
    for token in argv:
        if token == "--debug":
            return True
        if not token.startswith("-"):
            return False
    return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so Python's flush at exit does not fail on the closed pipe again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no real stdout (captured): nothing to flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
