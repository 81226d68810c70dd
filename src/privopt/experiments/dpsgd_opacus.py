"""``privopt reproduce dpsgd-vs-opacus``: privopt's DP-SGD beside Opacus on the same setting.

Setting (foundation issue): MLP-128 on 8,000 training / 2,000 test MNIST images, the same epochs,
batch size, learning rate and clipping for both, delta = 1e-5, several epsilons and seeds. Both
use Poisson sampling with add/remove-one neighbours; each library calibrates its own noise to the
same (epsilon, delta) with its own accountant (privopt: PLD, exact; Opacus: its default).
Opacus is an optional dependency (``pip install privopt[bench]``) and is never imported otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from privopt.checkpoint import atomic_write_json, atomic_write_text
from privopt.cliargs import add_run_outputs, float_list, positive_float, positive_int
from privopt.config import RunConfig
from privopt.errors import ConfigError

__all__ = ["run_comparison", "add_arguments", "main"]


def _mnist_subset(data_dir: str, n_train: int, n_test: int, seed: int):
    from privopt.data import load_dataset

    data = load_dataset("mnist", data_dir=data_dir, seed=seed, max_train=n_train)
    if data.x_train.shape[0] < n_train or data.x_test.shape[0] < n_test:
        raise ConfigError(
            f"MNIST in {data_dir} has only {data.x_train.shape[0]} train / {data.x_test.shape[0]} "
            f"test images; need {n_train} / {n_test}"
        )
    data.x_test, data.y_test = data.x_test[:n_test], data.y_test[:n_test]
    return data


def _run_privopt(
    data, *, epsilon, delta, epochs, batch_size, lr, clip, seed, out_dir: Path, insecure_seed: int | None
) -> dict[str, Any]:
    from privopt.training import train

    cfg = RunConfig.from_dict(
        {
            "algorithm": "dp-sgd",
            "model": "mlp",
            "seed": seed,
            "insecure_seed": insecure_seed,
            "dataset": "mnist",
            "algorithm_params": {"epochs": epochs, "batch_size": batch_size, "lr": lr, "clip": clip},
            "privacy": {"epsilon": epsilon, "delta": delta},
        }
    )
    t0 = time.perf_counter()
    rec = train(cfg, out_dir=out_dir, progress=False, dataset=data)
    return {
        "test_accuracy": rec["metrics"]["test_accuracy"],
        "epsilon_spent": rec["privacy"]["epsilon_spent"],
        "noise_multiplier": rec["calibration"]["noise_multipliers"]["grad"],
        "wall_s": time.perf_counter() - t0,
    }


def _run_opacus(data, *, epsilon, delta, epochs, batch_size, lr, clip, seed) -> dict[str, Any]:
    try:
        from opacus import PrivacyEngine
    except ImportError as e:  # optional dependency
        raise ConfigError("this comparison needs Opacus: pip install 'privopt[bench]'") from e
    from privopt.models import build_model

    torch.manual_seed(seed)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data.x_train, data.y_train), batch_size=batch_size, shuffle=True
    )
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=opt,
        data_loader=loader,
        target_epsilon=epsilon,
        target_delta=delta,
        epochs=epochs,
        max_grad_norm=clip,
    )
    t0 = time.perf_counter()
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for x, y in loader:
            if len(x) == 0:
                continue
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(data.x_test).argmax(1) == data.y_test).float().mean().item()
    return {
        "test_accuracy": acc,
        "epsilon_spent": engine.get_epsilon(delta),
        "noise_multiplier": opt.noise_multiplier,
        "wall_s": time.perf_counter() - t0,
    }


def _summary(rows: list[dict[str, Any]], epsilons) -> list[dict[str, Any]]:
    """Mean ± std accuracy, noise multiplier and wall time per (library, ε)."""
    out = []
    for eps in epsilons:
        for lib in ("privopt", "opacus"):
            rs = [r for r in rows if r["epsilon"] == eps and r["library"] == lib]
            accs = [r["test_accuracy"] for r in rs]
            out.append(
                {
                    "library": lib,
                    "epsilon": eps,
                    "mean_accuracy": statistics.mean(accs),
                    "std_accuracy": statistics.pstdev(accs),
                    "noise_multiplier": rs[0]["noise_multiplier"],
                    "mean_wall_s": statistics.mean(r["wall_s"] for r in rs),
                }
            )
    return out


def _table(summary: list[dict[str, Any]]) -> str:
    lines = ["| library | ε | test accuracy (mean ± std) | noise multiplier | wall s/run |", "|---|---|---|---|---|"]
    lines += [
        f"| {s['library']} | {s['epsilon']:g} | {s['mean_accuracy']:.4f} ± {s['std_accuracy']:.4f} | "
        f"{s['noise_multiplier']:.3f} | {s['mean_wall_s']:.1f} |"
        for s in summary
    ]
    return "\n".join(lines)


def _run_dir(out: Path, epsilon: float, seed: int) -> Path:
    return out / f"privopt-eps{epsilon:g}-seed{seed}"


def run_comparison(
    *,
    data_dir: str,
    out_dir: str | Path,
    epsilons=(1.0, 8.0),
    seeds=3,
    epochs=20,
    batch_size=256,
    lr=0.5,
    clip=1.0,
    delta=1e-5,
    n_train=8000,
    n_test=2000,
    progress=True,
    insecure_seed: int | None = None,
) -> list[dict[str, Any]]:
    """Run both libraries on every (ε, seed) and write ``results.jsonl``, ``summary.json`` and
    ``table.md``. privopt's noise is secret unless ``insecure_seed`` (run s: ``insecure_seed + s``)."""
    from tqdm.auto import tqdm

    if importlib.util.find_spec("opacus") is None:  # before minutes of privopt training
        raise ConfigError("this comparison needs Opacus: pip install 'privopt[bench]'")
    out, rows = Path(out_dir), []
    planned = [out / "results.jsonl", *(_run_dir(out, e, s) for e in epsilons for s in range(seeds))]
    earlier = [p.name for p in planned if p.exists()]
    if earlier:  # found before minutes of training, not at the first run that would collide
        shown = ", ".join(earlier[:3]) + (", ..." if len(earlier) > 3 else "")
        raise ConfigError(f"{out} already holds a comparison ({shown}); choose a new --out directory")
    jobs = [(eps, s, lib) for eps in epsilons for s in range(seeds) for lib in ("privopt", "opacus")]
    # disable=None: a bar on a terminal only, nothing in logs
    for eps, seed, lib in tqdm(jobs, disable=None if progress else True, desc="dpsgd-vs-opacus"):
        data = _mnist_subset(data_dir, n_train, n_test, seed)
        kw = dict(epsilon=eps, delta=delta, epochs=epochs, batch_size=batch_size, lr=lr, clip=clip, seed=seed)
        if lib == "privopt":
            noise_seed = None if insecure_seed is None else insecure_seed + seed
            res = _run_privopt(data, out_dir=_run_dir(out, eps, seed), insecure_seed=noise_seed, **kw)
        else:
            res = _run_opacus(data, **kw)
        rows.append({"library": lib, "epsilon": eps, "seed": seed, **res})
    summary = _summary(rows, epsilons)
    settings = dict(n_train=n_train, n_test=n_test, epochs=epochs, batch_size=batch_size, lr=lr, clip=clip)
    settings.update(delta=delta, seeds=seeds, model="mlp (784-128-10)", insecure_seed=insecure_seed)
    table = _table(summary)
    atomic_write_text(out / "results.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_json(out / "summary.json", {"settings": settings, "summary": summary})
    atomic_write_text(out / "table.md", table + "\n")
    print(table)
    return rows


def add_arguments(p) -> None:
    p.add_argument("--data-dir", required=True, help="folder holding mnist/ (IDX files)")
    p.add_argument("--epsilons", type=float_list, default=[1.0, 8.0], help="comma-separated target ε (default 1,8)")
    p.add_argument("--seeds", type=positive_int, default=3, help="runs per (library, ε) (default 3)")
    p.add_argument("--epochs", type=positive_int, default=20, help="passes over the data (default 20)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="expected Poisson batch size (default 256)")
    p.add_argument("--lr", type=positive_float, default=0.5, help="SGD learning rate (default 0.5)")
    p.add_argument("--clip", type=positive_float, default=1.0, help="per-example clipping threshold (default 1)")
    add_run_outputs(p, out_help="a new output folder (results.jsonl, summary.json, table.md)")


def main(args) -> int:
    rows = run_comparison(
        data_dir=args.data_dir,
        out_dir=args.out,
        epsilons=tuple(args.epsilons),
        seeds=args.seeds,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        clip=args.clip,
        progress=not (args.json or args.quiet),
        insecure_seed=args.insecure_seed,
    )
    if args.json:
        print(json.dumps(rows))
    return 0
