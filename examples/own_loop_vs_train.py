"""Accuracy of DP-SGD in your own loop (privopt.PrivacyEngine) beside `privopt train`, same setting.

Run:  python examples/own_loop_vs_train.py [SEEDS >= 2]      (a few minutes on 2 CPU cores)

Two comparisons at epsilon = 1, delta = 1e-5, 10 epochs, expected batch 128, lr 1.0, clip 1.0,
each over SEEDS seeds (default 8), noise and batches from secret randomness (so the two differ by
their noise and batches only):

* "README": the README's own-loop example (scikit-learn digits as your tensors, pixels / 16, the
  first 1,400 images for training, your ``nn.Sequential``) against ``train()`` on the same tensors
  and the same module (same initialisation per seed);
* "config": ``configs/dpsgd_digits.yaml`` as ``privopt train`` runs it (privopt's ``digits`` split
  and ``mlp``) against the own loop on that split's tensors with the same model.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import privopt
from privopt.config import RunConfig
from privopt.data import Dataset, load_dataset
from privopt.models import build_model
from privopt.training import train

SETTING = {"epochs": 10, "batch_size": 128, "lr": 1.0, "clip": 1.0}
PRIVACY = {"epsilon": 1.0, "delta": 1e-5}


def own_loop(model: nn.Module, x, y, x_test, y_test) -> float:
    engine = privopt.PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=SETTING["lr"]),
        dataset=(x, y),
        batch_size=SETTING["batch_size"],
        epochs=SETTING["epochs"],
        max_grad_norm=SETTING["clip"],
        **PRIVACY,
    )
    for _ in range(SETTING["epochs"]):
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
    assert engine.get_epsilon() <= PRIVACY["epsilon"]
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


def with_train(cfg: RunConfig, **objects) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        record = train(cfg, out_dir=Path(tmp) / "run", progress=False, **objects)
    return record["metrics"]["test_accuracy"]


def readme_pair(seed: int) -> tuple[float, float]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = torch.tensor(digits.data / 16, dtype=torch.float32), torch.tensor(digits.target)
    data = Dataset.from_tensors(x[:1400], y[:1400], x_test=x[1400:], y_test=y[1400:], num_classes=10)

    def module() -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    cfg = RunConfig.from_dict({"algorithm": "dp-sgd", "algorithm_params": SETTING, "privacy": PRIVACY, "plots": False})
    mine = own_loop(module(), x[:1400], y[:1400], x[1400:], y[1400:])
    return mine, with_train(cfg, dataset=data, model=module())


def config_pair(seed: int) -> tuple[float, float]:
    cfg = RunConfig.from_dict(
        {"algorithm": "dp-sgd", "dataset": "digits", "model": "mlp", "seed": seed, "algorithm_params": SETTING,
         "privacy": PRIVACY, "plots": False}
    )  # fmt: skip
    data = load_dataset("digits", seed=seed)
    torch.manual_seed(seed)  # the model initialisation `train` uses for this seed
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    mine = own_loop(model, data.x_train, data.y_train, data.x_test, data.y_test)
    return mine, with_train(cfg)


def main(seeds: int) -> None:
    torch.set_num_threads(1)
    for name, pair in (("README", readme_pair), ("config", config_pair)):
        own, ref = zip(*(pair(s) for s in range(seeds)))
        diff = [a - b for a, b in zip(own, ref)]
        print(
            f"{name}: own loop {100 * statistics.mean(own):.2f} ± {100 * statistics.stdev(own):.2f} %, "
            f"privopt train {100 * statistics.mean(ref):.2f} ± {100 * statistics.stdev(ref):.2f} %, "
            f"difference {100 * statistics.mean(diff):+.2f} points (± {100 * statistics.stdev(diff) / seeds**0.5:.2f} "
            f"s.e., {seeds} seeds)"
        )


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "8"
    if not (arg.isdigit() and int(arg) >= 2):  # the spreads printed need two seeds
        sys.exit(f"usage: python examples/own_loop_vs_train.py [SEEDS], SEEDS an integer >= 2 (got {arg!r})")
    main(int(arg))
