"""Red-team of the DP ERM path (DP-SVRG, DP-SVRG++, DP-GD-ERM: full-batch snapshots and gradients,
one-record differences; DP-AMD shares DP-GD-ERM's full-batch release and was audited by hand): an
attacker who knows every record but one reads everything ``privopt train`` writes and prints
(docs/privacy.md).

Neighbouring CSV files (one record changed: an extreme value, a record of the tiny group, a flipped
label) with clip 1e-30: every release is noise at the clip's scale in both worlds, so the released
linear models are within 1e-28 of each other and predict alike; every other published byte and
printed character must then be the same (the records' full-batch sums reach nothing else).
"""

import pytest
import torch

from leak_helpers import CSV_DATASET_YAML, HEADER, published, train_world
from privopt.errors import DEBUG_ENV

YAML = (
    """\
algorithm: {algorithm}
algorithm_params: {params}
model: logreg
model_params: {{bias: false, single_logit: true}}
loss: logistic
privacy: {{epsilon: 1.0, delta: 1.0e-5}}
insecure_seed: 7
eval_every: 1
"""
    + CSV_DATASET_YAML
)
GROUP = ["C" if i % 30 == 0 else "AB"[i % 2] for i in range(90)]  # C: a tiny group of 3 records
ROWS = [
    f"{20 + i % 60},{('Priv', 'Gov', 'Self')[i % 3]},{GROUP[i]},{'>50K' if i % 3 else '<=50K'}\n" for i in range(90)
]
NEIGHBOURS = {
    "extreme": ROWS[:-1] + ["1e300,Gov,A,>50K\n"],
    "tiny_group": [r if j != 30 else "90,Gov,C,>50K\n" for j, r in enumerate(ROWS)],
    "label_flip": ROWS[:-1] + [ROWS[-1].replace(">50K", "<=50K")],
}
RUNS = {
    "dp-svrg": "{epochs: 2, inner: 20, step_size: 0.1, clip: 1.0e-30, l2: 0.01}",
    "dp-svrg-pp": "{epochs: 2, inner: 10, step_size: 0.1, clip: 1.0e-30}",
    "dp-gd-erm": "{iterations: 3, step_size: 0.1, clip: 1.0e-30}",
}


@pytest.mark.parametrize("algorithm", sorted(RUNS))
def test_neighbouring_erm_data_publish_the_same_bytes_when_the_released_models_agree(
    algorithm, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test.csv").write_text(HEADER + "".join(ROWS[:30]), encoding="utf-8")
    (tmp_path / "run.yaml").write_text(YAML.format(algorithm=algorithm, params=RUNS[algorithm]), encoding="utf-8")
    base_printed = train_world(capsys, ROWS, "base")
    base = published(tmp_path / "base")
    assert len(base["record"]["history"]) >= 2 and "test_group2_accuracy" in base["record"]["metrics"]
    for name, rows in NEIGHBOURS.items():
        assert train_world(capsys, rows, name) == base_printed, name  # stdout and stderr
        other = published(tmp_path / name)
        assert other["record"] == base["record"], name
        assert other == base, name  # metrics.csv and curves.png byte for byte
        ma, mb = (torch.load(tmp_path / d / "model.pt") for d in ("base", name))
        # the premise: both released models are noise at the clip's scale (the weight starts at 0)
        assert all(float(ma[k].abs().max()) < 1e-28 and float(mb[k].abs().max()) < 1e-28 for k in ma)
