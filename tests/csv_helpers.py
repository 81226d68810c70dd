"""A one-epoch DP-SGD logistic regression trained by ``privopt train`` on a CSV dataset (shared by the CSV tests)."""

import yaml

import privopt
from privopt.cli import main


def train_csv_logreg(tmp_path, params: dict):
    """Train through the CLI on ``dataset: csv`` with ``params`` into ``tmp_path/run``; the loaded run."""
    cfg = {"algorithm": "dp-sgd", "algorithm_params": {"epochs": 1, "batch_size": 50, "lr": 0.5, "clip": 1.0},
           "model": "logreg", "privacy": {"epsilon": 2.0, "delta": 1e-4}, "dataset": "csv",
           "dataset_params": params, "plots": False}  # fmt: skip
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    return privopt.load_run(tmp_path / "run")
