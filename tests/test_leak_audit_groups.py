"""Red-team of the worst-group algorithms and of federated (multi-client) runs: an attacker who knows
every record but one reads everything ``privopt train`` writes and prints (docs/privacy.md).

Neighbouring CSV files with groups keep n and every group's size (so the secret sampler draws the
same number of values in both worlds): an extreme record, the only record of its class in the tiny
group, a flipped label. Every release is made data-independent in floating point (clip 1e-30 on an
MLP whose weights are ~0.1, Laplace scales of 1e30 on group counts and losses), so the released
values are the same in both worlds; then every other published byte (group names and counts,
per-group metrics, the λ weights and group choices of the history, metrics.csv, curves.png, the
printed lines) must be the same too: the releases are the only channel from the data. (The
released models differ by at most 1e-28: noise at the clip's scale on the MLP's zero-initialised
biases, which changes no prediction.)

Audited by hand and not pinned here: a record that moves to another group changes how many uniforms
the secret sampler draws for a Poisson batch, so with an insecure seed the later draws differ (with
secret randomness every draw is uniform whatever came before: no leak); add/remove neighbours
change n, which is public.
"""

import os
import re
from pathlib import Path

import pytest
import torch

from leak_helpers import CSV_DATASET_YAML, HEADER, published, train_world
from privopt.errors import DEBUG_ENV

YAML = (
    """\
algorithm: {algorithm}
algorithm_params: {params}
model: mlp
model_params: {{hidden: 8}}
privacy: {{epsilon: 1.0, delta: 1.0e-5}}
insecure_seed: 7
eval_every: 2
"""
    + CSV_DATASET_YAML
)


def _row(i: int) -> str:
    group = "C" if i % 30 == 0 else ("A" if i % 2 else "B")  # C: 3 records, all <=50K
    label = ">50K" if i % 3 and group != "C" else "<=50K"
    return f"{20 + i % 60},{('Priv', 'Gov', 'Self')[i % 3]},{group},{label}\n"


ROWS = [_row(i) for i in range(90)]
NEIGHBOURS = {  # one record changed; n and every group's size stay the same
    "extreme": ROWS[:-1] + ["1e300,Gov,A,>50K\n"],
    "only_of_its_class_in_the_tiny_group": [r if j != 30 else "90,Gov,C,>50K\n" for j, r in enumerate(ROWS)],
    "label_flip": ROWS[:-1] + [ROWS[-1].replace(">50K", "<=50K")],
}
NOISY = "clip: 1.0e-30, count_noise: 1.0e30, loss_noise_ratio: 1.0e30"
RUNS = {
    "noisy-sgd-mgr": f"{{epochs: 1, batch_size: 20, lr: 0.5, {NOISY}}}",
    "noisy-sgd-ags": f"{{epochs: 1, batch_size: 20, lr: 0.5, choice: noisy-max, {NOISY}}}",
    "dp-oco-exp3": f"{{batch_size: 10, lr: 0.1, {NOISY}}}",
    "gauss-psgd": "{clients: 2, split: iid, epochs: 1, b1: 20, b2: 10, lr: 0.2, clip: 1.0e-30, max_steps: 6}",
    "dp-spider-sosp": "{clients: 2, split: iid, trust: central, epochs: 1, b1: 20, b2: 10, clip: 1.0e-30, "
    "max_steps: 6}",
}


def _same_model(a: Path, b: Path) -> bool:
    """Equal up to the released noise at the clip's scale (the MLP's biases start at 0)."""
    ma, mb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    return ma.keys() == mb.keys() and all(float((ma[k] - mb[k]).abs().max()) < 1e-28 for k in ma)


def _check_neighbours(algorithm: str, tmp_path: Path, capsys) -> dict:
    """Train ``algorithm`` on ROWS and on each neighbour; everything published and printed must agree."""
    os.chdir(tmp_path)
    (tmp_path / "test.csv").write_text(HEADER + "".join(ROWS[:30]), encoding="utf-8")
    (tmp_path / "run.yaml").write_text(YAML.format(algorithm=algorithm, params=RUNS[algorithm]), encoding="utf-8")
    base_printed = train_world(capsys, ROWS, "base")
    base = published(tmp_path / "base")
    for name, rows in NEIGHBOURS.items():
        assert train_world(capsys, rows, name) == base_printed, name  # stdout and stderr
        other = published(tmp_path / name)
        assert other["record"] == base["record"], name
        assert other == base, name  # metrics.csv and curves.png byte for byte
        assert _same_model(tmp_path / "base", tmp_path / name), name
    model = torch.load(tmp_path / "base" / "model.pt")
    assert any(float(v.abs().max()) > 1e-3 for v in model.values())  # the premise: the weights dwarf 1e-30
    return base["record"]


@pytest.mark.parametrize("algorithm", ["noisy-sgd-mgr", "noisy-sgd-ags", "dp-oco-exp3"])
def test_neighbouring_group_data_publish_the_same_bytes_when_the_releases_are_the_same(
    algorithm, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    history = _check_neighbours(algorithm, tmp_path, capsys)["history"]
    # not vacuous: the history holds the per-group test metrics and the algorithm's own logs
    assert {"test_worst_group_accuracy", "test_group2_accuracy"} <= set(history[-1]) and "group" in history[0]
    if algorithm != "noisy-sgd-ags":
        assert "lambda_2" in history[0]


@pytest.mark.parametrize("algorithm", ["gauss-psgd", "dp-spider-sosp"])
def test_neighbouring_client_data_publish_the_same_bytes_when_the_releases_are_the_same(
    algorithm, tmp_path, monkeypatch, capsys
):
    """Two clients (local noise; central noise with the baseline), simulated in one process: under
    torchrun rank 0 writes the same files (tests/test_sosp_distributed.py) and the other ranks none."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record = _check_neighbours(algorithm, tmp_path, capsys)
    assert record["hyperparameters"]["clients"] == 2 and {"o1", "o2"} <= set(record["history"][-1])


def _masked(printed: tuple[str, str]) -> tuple[str, ...]:
    """What was printed with the released model's test metrics masked."""
    return tuple(re.sub(r"(test_acc=|test accuracy |worst-group )[0-9.]+", r"\1#", p) for p in printed)


def test_phased_erm_neighbours_differ_only_through_the_released_model(tmp_path, monkeypatch, capsys):
    """Minimax Phased ERM releases its saddle point with Gaussian noise (a data-dependent centre):
    neighbours may differ in the model and its test metrics, nothing else."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test.csv").write_text(HEADER + "".join(ROWS[:30]), encoding="utf-8")
    params = "{eta: 0.05, phases: 2, count_noise: 1.0e30}"
    text = YAML.format(algorithm="minimax-phased-erm", params=params)
    text = text.replace("model: mlp\nmodel_params: {hidden: 8}\n", "model: logreg\n")  # it needs a convex model
    (tmp_path / "run.yaml").write_text(text, encoding="utf-8")
    base_printed = _masked(train_world(capsys, ROWS, "base"))
    base = published(tmp_path / "base")
    for name, rows in NEIGHBOURS.items():
        assert _masked(train_world(capsys, rows, name)) == base_printed, name
        other = published(tmp_path / name)
        a, b = (dict(r["record"]) for r in (base, other))
        for r in (a, b):
            r["metrics"] = {k: v for k, v in r.pop("metrics").items() if not k.startswith("test_")}
            r["history"] = [{k: v for k, v in h.items() if not k.startswith("test_")} for h in r.pop("history")]
        assert a == b, name
        assert other["files"] == base["files"]


def _group_world(changed: bool):
    from privopt.data import Dataset

    g = torch.Generator().manual_seed(0)
    x, xt = torch.rand(90, 3, generator=g), torch.rand(30, 3, generator=g)
    y, yt = (x[:, 0] > 0.5).long(), (xt[:, 0] > 0.5).long()
    if changed:  # one extreme record with the other label (n and the group sizes stay)
        x[0], y[0] = torch.tensor([1e5, -1e5, 1e5]), 1 - y[0]
    groups, groups_test = torch.arange(90) % 3, torch.arange(30) % 3
    return Dataset.from_tensors(
        x, y, x_test=xt, y_test=yt, groups=groups, groups_test=groups_test, num_classes=2,
        group_names=["a", "b", "c"], name="neighbours",
    )  # fmt: skip


@pytest.mark.parametrize("method", ["noisy-sgd-mgr", "noisy-sgd-ags", "dp-oco-exp3", "dp-sgd"])
def test_worst_group_reproduction_rows_of_neighbours_agree_when_the_releases_do(method):
    """A final run of ``privopt reproduce worst-group`` (its result row: test metrics per group, ε
    spent, steps, the worst group's name) on neighbouring training sets: with every release
    data-independent in floating point (clip and lr 1e-30 leave the logistic model at 0), the rows
    differ only in timings."""
    from privopt.experiments.worst_group_runner import Spec, run_one

    point = {"clip": 1e-30, "lr": 1e-30, "batch_size": 10 if method == "dp-oco-exp3" else 20}
    if method != "dp-sgd":
        point.update(count_noise=1e30, loss_noise_ratio=1e30)
    spec = Spec("adult", insecure_seed=3)
    rows = [run_one(method, spec, data=_group_world(c), point=point, epsilon=1.0, seed=0) for c in (False, True)]
    for row in rows:
        assert "error" not in row and row["per_group"]["c"]["n"] == 10
        row.pop("wall_s"), row.pop("cpu_s")
    assert rows[0] == rows[1]
