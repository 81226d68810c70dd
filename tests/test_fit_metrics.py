"""privopt.fit(metrics=, non_private_diagnostics=): run metrics as train's RunConfig takes them."""

import json

import pytest
import torch

import privopt
from privopt.data import Dataset
from privopt.errors import ConfigError
from privopt.training import available_run_metrics, load_diagnostics

FIT = dict(algorithm="dp-sgd", epsilon=1.0, delta=1e-4, accountant="rdp", epochs=1, batch_size=100)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(600, 4, generator=g)
    y = (x[:, 0] > 0.5).long()
    return Dataset.from_tensors(x[:500], y[:500], x_test=x[500:], y_test=y[500:], num_classes=2)


def test_fit_writes_the_mia_result_only_to_the_not_private_diagnostics(tmp_path):
    out = tmp_path / "run"
    rec = privopt.fit(
        model=torch.nn.Linear(4, 2), dataset=_data(), out_dir=out, metrics=["mia"], non_private_diagnostics=True, **FIT
    )
    final = load_diagnostics(out)["final"]
    assert 0.0 <= final["mia_auc"] <= 1.0 and final["mia_within_bound"] in (0.0, 1.0)
    assert rec["config"]["metrics"] == ["mia"] and rec["config"]["non_private_diagnostics"] is True
    for name in ("record.json", "metrics.csv"):  # the public files: no value of the attack
        assert "mia_" not in (out / name).read_text()
    assert not [k for k in rec["metrics"] if k.startswith("mia")]
    assert json.loads((out / "record.json").read_text())["files"]["diagnostics"].endswith("(NOT PRIVATE)")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"metrics": ["mia"]}, r"run metric\(s\) \['mia'\] read the private training data.*non_private_diagnostics"),
        ({"metrics": ["mai"], "non_private_diagnostics": True}, r"unknown run metric\(s\) \['mai'\]; available: "),
        ({"metrics": "mia", "non_private_diagnostics": True}, r"metrics must be a list of names"),
        ({"non_private_diagnostics": "yes"}, r"non_private_diagnostics must be true or false"),
    ],
)
def test_fit_refuses_bad_metrics_before_anything_is_written(tmp_path, kw, match):
    model = torch.nn.Linear(4, 2)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=match) as err:
        privopt.fit(model=model, dataset=_data(), out_dir=tmp_path / "run", **kw, **FIT)
    assert not (tmp_path / "run").exists() and list(tmp_path.iterdir()) == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # not trained, not claimed
    if "unknown" in match:
        assert all(name in str(err.value) for name in available_run_metrics())
    privopt.fit(model=model, dataset=_data(), **FIT)  # the module was not marked as trained privately


def test_fit_refuses_diagnostics_that_its_temporary_folder_would_delete():
    with pytest.raises(ConfigError, match=r"diagnostics.NOT_PRIVATE.json to out_dir: pass out_dir="):
        privopt.fit(model=torch.nn.Linear(4, 2), dataset=_data(), metrics=["mia"], non_private_diagnostics=True, **FIT)


def test_a_metric_of_the_public_test_split_needs_no_diagnostics(tmp_path):
    rec = privopt.fit(model=torch.nn.Linear(4, 2), dataset=_data(), metrics=["sosp"], out_dir=tmp_path / "r", **FIT)
    assert [k for k in rec["metrics"] if k.startswith("sosp")]  # released model, public split: in the record
    assert not (tmp_path / "r" / "diagnostics.NOT_PRIVATE.json").exists()
