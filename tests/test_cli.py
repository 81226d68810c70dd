"""The command line: account reference values, list, train errors, demo smoke."""

import json

import pytest

from privopt.cli import main
from privopt.config import RunConfig, apply_overrides, load_config
from privopt.errors import ConfigError


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_account_reference_values(capsys):
    """Reference value (docs/privacy.md, accounting): q=0.1, 512 steps, delta=1e-6 at eps 1 needs z = 9.662 (PLD)."""
    code, out, _ = run(
        capsys,
        "account",
        "--dataset-size",
        "10000",
        "--batch-size",
        "1000",
        "--steps",
        "512",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--json",
    )
    assert code == 0
    res = json.loads(out)
    assert res["noise_multiplier"] == pytest.approx(9.662, abs=0.0015)
    assert res["epsilon"] <= 1.0 and res["accountant"] == "pld"
    assert {"noise_multiplier", "epsilon", "delta", "accountant"} <= set(res)


def test_account_text_and_rdp(capsys):
    code, out, _ = run(
        capsys,
        "account",
        "--dataset-size",
        "60000",
        "--batch-size",
        "256",
        "--steps",
        "1000",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--accountant",
        "rdp",
    )
    assert code == 0 and "noise multiplier" in out and "RDP" in out


@pytest.mark.parametrize(
    "eps, delta, msg", [("0", "1e-5", "epsilon"), ("-1", "1e-5", "epsilon"), ("1", "0", "delta"), ("1", "1.5", "delta")]
)
def test_account_bad_privacy_parameters(capsys, eps, delta, msg):
    code, _, err = run(
        capsys,
        "account",
        "--dataset-size",
        "100",
        "--batch-size",
        "10",
        "--steps",
        "10",
        "--epsilon",
        eps,
        "--delta",
        delta,
    )
    assert code == 2 and msg in err


def test_list(capsys):
    _code, out, _ = run(capsys, "list", "--json")
    listing = json.loads(out)
    assert {"sgd", "dp-sgd", "dp-gd"} <= set(listing["algorithms"])
    assert {"digits", "mnist"} <= set(listing["datasets"])
    assert {"mlp", "logreg", "cnn", "resnet20"} <= set(listing["models"])


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key.*learning_rate"):
        RunConfig.from_dict({"learning_rate": 0.1})
    with pytest.raises(ConfigError, match="privacy.delta"):
        RunConfig.from_dict({"privacy": {"delta": 2.0}})
    with pytest.raises(ConfigError, match="unknown privacy key"):
        RunConfig.from_dict({"privacy": {"eps": 1.0}})
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["nonsense"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_overrides_parse_values():
    d = apply_overrides({"privacy": {"epsilon": 1.0}}, ["privacy.epsilon=3", "algorithm_params.lr=0.5", "model=cnn"])
    assert d == {"privacy": {"epsilon": 3}, "algorithm_params": {"lr": 0.5}, "model": "cnn"}
    d = apply_overrides({}, ["privacy.delta=1e-5", "privacy.epsilon=2E0"])  # YAML 1.1 would give strings
    assert d["privacy"] == {"delta": 1e-5, "epsilon": 2.0}


def test_train_errors_are_clear(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--set", "algorithm=nope", "--out", str(tmp_path / "a"), "--quiet")
    assert code == 2 and "unknown algorithm 'nope'" in err
    code, _, err = run(capsys, "train", "--set", "algorithm_params.lrr=1", "--out", str(tmp_path / "b"), "--quiet")
    assert code == 2 and "lrr" in err
    code, _, err = run(capsys, "train", "--set", "dataset=nope", "--out", str(tmp_path / "c"), "--quiet")
    assert code == 2 and "nope" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_train_via_cli(capsys, tmp_path):
    code, out, _ = run(
        capsys,
        "train",
        "--set",
        "model=logreg",
        "--set",
        "algorithm_params.epochs=1",
        "--set",
        "privacy.epsilon=1",
        "--out",
        str(tmp_path / "r"),
        "--quiet",
        "--json",
    )
    assert code == 0
    res = json.loads(out)
    assert res["status"] == "finished" and res["privacy"]["epsilon_spent"] <= 1.0
