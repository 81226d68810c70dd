"""The ``privopt audit`` command: its options and what it runs (privopt.audit)."""

from __future__ import annotations

import json
import sys

from privopt.cliargs import add_plugin_option

__all__ = ["AUDIT_FAILED", "add_audit_parser"]

AUDIT_FAILED = 5  # an empirical lower bound exceeds the accounted epsilon


def _cmd_audit(args) -> int:
    from privopt.audit import format_report, run_audit, write_report
    from privopt.audit.report import check_report_dir
    from privopt.config import load_config

    overrides = list(args.set)
    if args.algorithm is not None:
        overrides.append(f"algorithm={args.algorithm}")
    if args.epsilon is not None:
        overrides.append(f"privacy.epsilon={args.epsilon}")
    cfg = load_config(args.config, overrides, plugins=args.plugin)
    if args.out is not None:  # before minutes of training, not when the report is written
        check_report_dir(args.out)
    say = None if (args.quiet or args.json) else (lambda line: print(line, file=sys.stderr, flush=True))
    report = run_audit(
        cfg,
        mode=args.mode,
        method=args.method,
        canaries=args.canaries,
        runs=args.runs,
        confidence=args.confidence,
        progress=say,
    )
    written = write_report(report, args.out) if args.out is not None else []
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    elif not args.quiet:
        print(format_report(report))
        for path in written:
            print(f"wrote {path}")
    return 0 if report.passed else AUDIT_FAILED


def add_audit_parser(sub) -> None:
    a = sub.add_parser(
        "audit",
        help="empirical privacy audit: a lower bound on epsilon from canaries (docs/audit.md)",
        description="Insert canaries (each with probability 1/2, secretly), train with the real pipeline, score "
        "every canary from what the run releases (white-box: the noisy gradients; black-box: the released model) "
        "and report a lower bound on epsilon, with confidence, beside the epsilon the run accounted. "
        "See docs/audit.md.",
        epilog="exit codes: 0 every lower bound is at most the accounted epsilon; 5 a lower bound exceeds it (the "
        "privacy claim is refuted); 2 a user error.",
    )
    a.add_argument("--config", help="YAML config of the run to audit (privopt train's; defaults for missing keys)")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    add_plugin_option(a)
    a.add_argument("--algorithm", help="shorthand for --set algorithm=NAME")
    a.add_argument("--epsilon", type=float, help="shorthand for --set privacy.epsilon=EPSILON (the claim audited)")
    a.add_argument(
        "--mode", choices=["white-box", "black-box", "both"], default="both", help="which scores (default both)"
    )
    a.add_argument(
        "--method",
        choices=["one-run", "many-run"],
        default="one-run",
        help="one-run: many canaries in one training run (Steinke et al. 2023; default); many-run: one canary "
        "per run, --runs runs (Clopper-Pearson)",
    )
    a.add_argument("--canaries", type=int, default=1000, help="canaries of a one-run audit (default 1000)")
    a.add_argument("--runs", type=int, default=100, help="training runs of a many-run audit (default 100)")
    a.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bound (default 0.95)")
    a.add_argument(
        "--out",
        help="directory for audit.json and audit.png (score distributions and the bound); "
        "one that holds an earlier audit is refused",
    )
    a.add_argument("--quiet", action="store_true", help="no progress and no summary")
    a.add_argument("--json", action="store_true", help="print the report as one JSON object")
    a.set_defaults(func=_cmd_audit)
