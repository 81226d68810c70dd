"""A second new-user trial: what broke or confused a practitioner on the documented journeys (a CSV
file of their own from the command line, planning a budget with ``privopt account``, auditing a run,
``PrivacyEngine.make_private`` in their own loop), each pinned here."""

from __future__ import annotations

import json

import pytest

from privopt.data import load_dataset
from privopt.errors import DEBUG_ENV, ConfigError, DataError

LABEL = {"column": "y", "classes": ["no", "yes"]}
REGION = {"region": {"categories": ["nörth", "süd"], "unknown": "other"}}


def _csv(tmp_path, body: bytes, name: str = "train.csv"):
    path = tmp_path / name
    path.write_bytes(body)
    return path


def _load(path, **params):
    params = {"label": LABEL, "features": REGION, "test_path": str(path), **params}
    return load_dataset("csv", path=str(path), **params)


# --------------------------------------------------------------------------- csv: encoding

UTF8 = "note,region,y\nx,nörth,yes\nx,süd,no\nx,nörth,no\n".encode()


def test_one_record_not_in_utf8_does_not_change_how_the_other_records_read(tmp_path, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    ds = _load(_csv(tmp_path, UTF8))
    assert ds.x_train.tolist() == [[1, 0, 0], [0, 1, 0], [1, 0, 0]]
    # a neighbouring file: one more record with a Latin-1 byte in a column that is not even read.
    # A whole-file fallback to Latin-1 used to turn every other record's 'nörth' into '<other>'.
    neighbour = _csv(tmp_path, UTF8 + b"\xe9,s\xfcd,no\n", "neighbour.csv")
    with pytest.raises(DataError) as err:
        _load(neighbour)
    said = str(err.value)
    assert said == (
        f"{neighbour}: some line is not utf-8 text; dataset_params.encoding names the file's encoding "
        "(e.g. latin-1 or cp1252 for a file saved by older Excel)"
    )
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(DataError, match=r"neighbour\.csv: line 5 is not utf-8 text"):
        _load(neighbour)


def test_a_declared_encoding_reads_a_latin1_file_and_a_bad_one_is_refused_before_reading(tmp_path):
    path = _csv(tmp_path, "region,y\nnörth,yes\nsüd,no\n".encode("latin-1"))
    assert _load(path, encoding="latin-1").x_train.tolist() == [[1, 0, 0], [0, 1, 0]]
    for bad in ("rot13", "no-such-codec", 5):
        with pytest.raises(ConfigError, match=r"dataset_params.encoding must name a text encoding"):
            _load(tmp_path / "never-read.csv", encoding=bad)


def test_a_bom_crlf_and_blank_lines_read_like_the_plain_file(tmp_path):
    plain = _load(_csv(tmp_path, UTF8)).x_train.tolist()
    excel = b"\xef\xbb\xbf" + UTF8.replace(b"\n", b"\r\n") + b"\r\n\r\n"
    assert _load(_csv(tmp_path, excel, "excel.csv")).x_train.tolist() == plain


# --------------------------------------------------------------------------- csv: messages that say what to do


def test_numeric_classes_that_do_not_match_say_names_are_compared_as_text(tmp_path, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    path = _csv(tmp_path, b"x,y\n1,0.0\n2,1.0\n")
    features = {"x": {"range": [0, 3]}}
    with pytest.raises(DataError) as err:
        _load(path, label={"column": "y", "classes": [0, 1]}, features=features)
    assert str(err.value).endswith(
        "not one of the declared names; names are compared as text, so a declared 0 does not match a cell "
        'written otherwise (declare them as the file writes them, e.g. ["0.0", "1.0"])'
    )
    assert _load(path, label={"column": "y", "classes": ["0.0", "1.0"]}, features=features).y_train.tolist() == [0, 1]
    path = _csv(tmp_path, b"x,y\n1,0\n2,1\n", "ints.csv")  # and the other way round
    with pytest.raises(DataError, match=r'e\.g\. \["0", "1"\]'):
        _load(path, label={"column": "y", "classes": ["0.0", "1.0"]}, features=features)
    with pytest.raises(DataError) as err:  # names that are not numbers get no such hint
        _load(path, features=features)
    assert str(err.value).endswith("is not one of the declared names")


def test_a_file_with_another_delimiter_or_decimal_commas_says_which_option_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    path = _csv(tmp_path, b"x;y\n1,5;yes\n2,5;no\n")
    features = {"x": {"range": [0, 3]}}
    with pytest.raises(DataError) as err:
        _load(path, features=features)
    said = str(err.value)
    assert "separated by ',' (dataset_params.delimiter)" in said and "x;y" not in said
    with pytest.raises(DataError) as err:
        _load(path, features=features, delimiter=";")
    assert str(err.value).endswith("is not a number (written like -1234.5: a decimal point, no thousands separator)")
    assert "1,5" not in str(err.value)


# --------------------------------------------------------------------------- privopt account --epochs


def _account(capsys, *argv):
    from privopt.cli import main

    code = main(["account", "--dataset-size", "5000", "--batch-size", "96", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_account_plans_in_epochs_the_steps_privopt_train_runs(capsys):
    from privopt.algorithms import get_algorithm

    args = ("--epsilon", "1", "--delta", "1e-5", "--accountant", "rdp", "--quiet")
    code, out, err = _account(capsys, "--epochs", "2.5", *args, "--json")
    res = json.loads(out)
    dpsgd = get_algorithm("dp-sgd", epochs=2.5, batch_size=96, lr=0.5, clip=1.0)
    assert code == 0 and err == "" and res["steps"] == dpsgd.steps_for(n=5000) == 131 and res["epochs"] == 2.5
    _, by_steps, _ = _account(capsys, "--steps", "131", *args, "--json")
    assert json.loads(by_steps)["noise_multiplier"] == res["noise_multiplier"]
    code, out, _ = _account(capsys, "--epochs", "2.5", *args)
    assert code == 0 and "131 steps = 2.5 epochs" in out


@pytest.mark.parametrize(
    "argv, problem",
    [
        (("--epochs", "2", "--steps", "10"), "argument --steps: not allowed with argument --epochs"),
        ((), "one of the arguments --steps --epochs is required"),
        (("--epochs", "0"), "--epochs: '0' is not > 0"),
    ],
)
def test_account_needs_exactly_one_of_steps_and_epochs(capsys, argv, problem):
    try:  # argparse exits; a value it parsed but the command refuses returns the code
        code, _, err = _account(capsys, *argv, "--epsilon", "1", "--delta", "1e-5")
    except SystemExit as exit_:
        code, err = exit_.code, capsys.readouterr().err
    assert code == 2 and problem in err


# --------------------------------------------------------------------------- make_private: a frozen layer


def test_a_layer_frozen_before_make_private_may_be_in_the_optimizer_and_is_not_updated():
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import privopt
    from privopt.errors import ConfigError

    x = torch.rand(400, 5, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0.5).long()
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].requires_grad_(False)  # a "pretrained" first layer, frozen the usual way
    frozen, head = model[0].weight.detach().clone(), model[2].weight.detach().clone()
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=0)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.1, momentum=0.9),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=40), epochs=1, epsilon=2.0, delta=1e-4,
        max_grad_norm=1.0, batch_size=40,
    )  # fmt: skip
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    assert engine.steps_taken == 10 and torch.equal(model[0].weight, frozen)
    assert not torch.equal(model[2].weight, head)
    with pytest.raises(ConfigError, match="not a parameter of the module"):  # another module's: still refused
        privopt.PrivacyEngine().make_private(
            module=nn.Linear(5, 2), optimizer=torch.optim.SGD(nn.Linear(5, 2).parameters(), lr=0.1),
            dataset=(x, y), batch_size=40, epochs=1, epsilon=1.0, delta=1e-5, max_grad_norm=1.0,
        )  # fmt: skip


# --------------------------------------------------------------------------- --config given a run


def test_a_run_directory_or_record_given_as_config_says_what_it_is(tmp_path):
    from privopt.config import load_config

    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError, match=r"run is a directory; --config takes a YAML or JSON file$"):
        load_config(run)
    record = {"privopt_version": "x", "config": {"algorithm": "dp-sgd"}, "privacy": {}, "status": "finished"}
    (run / "record.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"a run's directory: its config is the \"config\" of its record\.json"):
        load_config(run)
    with pytest.raises(ConfigError, match=r"record\.json is a run's record; the config that run used is its"):
        load_config(run / "record.json")
    (run / "c.json").write_text(json.dumps(record["config"]))
    assert load_config(run / "c.json").algorithm == "dp-sgd"


# --------------------------------------------------------------------------- make_private: a forgotten step()


def test_a_whole_pass_without_step_warns_and_a_pass_with_steps_does_not():
    import warnings

    import torch
    from torch import nn

    import privopt
    from privopt.errors import PrivoptWarning

    x = torch.rand(400, 5, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0.5).long()
    model = nn.Linear(5, 2)
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=0)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), dataset=(x, y), batch_size=40,
        epochs=3, epsilon=2.0, delta=1e-4, max_grad_norm=1.0,
    )  # fmt: skip
    with pytest.warns(PrivoptWarning, match=r"a whole pass over the private loader \(10 batches\) had no optimizer"):
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()  # ... and no optimizer.step()
    assert engine.steps_taken == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, _ in enumerate(loader):  # stepping some batches (not by their content) is fine
            if i % 2 == 0:
                optimizer.step()
        for _ in loader:
            break  # a pass left early is not a whole pass
    assert engine.steps_taken == 5


# --------------------------------------------------------------------------- the record names the groups


def test_the_record_names_the_classes_and_groups_its_group_metrics_index(tmp_path, capsys):
    from privopt.cli import main

    rows = "".join(f"{20 + i % 50},{'AB'[i % 2]},{'yes' if i % 3 else 'no'}\n" for i in range(120))
    path = _csv(tmp_path, ("age,grp,y\n" + rows).encode())
    config = tmp_path / "run.yaml"
    config.write_text(f"""
algorithm: dp-sgd
algorithm_params: {{epochs: 1, batch_size: 40, lr: 0.5, clip: 1.0}}
model: logreg
privacy: {{epsilon: 1.0, delta: 1.0e-5}}
plots: false
dataset: csv
dataset_params:
  path: {path}
  test_path: {path}
  label: {{column: y, classes: ["no", "yes"]}}
  group: {{column: grp, groups: [B, A]}}
  features: {{age: {{range: [0, 100]}}}}
""")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0, capsys.readouterr()
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["dataset"]["group_names"] == ["B", "A"] and record["dataset"]["class_names"] == ["no", "yes"]
    assert {"test_group0_accuracy", "test_group1_accuracy"} <= set(record["metrics"])


def test_an_empty_carved_test_split_says_why_and_what_to_do(tmp_path, capsys):
    from privopt.cli import main

    path = _csv(tmp_path, b"x,y\n" + b"1,yes\n2,no\n" * 30)  # two distinct records: each split gets all or none
    params = {"label": LABEL, "features": {"x": {"range": [0, 3]}}}
    seed = next(s for s in range(50) if len(load_dataset("csv", path=str(path), seed=s, **params).y_test) == 0)
    config = tmp_path / "run.yaml"
    config.write_text(f"""
algorithm: dp-sgd
algorithm_params: {{epochs: 1, batch_size: 10, lr: 0.5, clip: 1.0}}
privacy: {{epsilon: 1.0, delta: 1.0e-5}}
model: logreg
seed: {seed}
dataset: csv
dataset_params: {{path: {path}, label: {{column: y, classes: ["no", "yes"]}}, features: {{x: {{range: [0, 3]}}}}}}
""")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "has no test split to evaluate the released model on: it is carved per record" in err
    assert "identical records share a split; give a test file (dataset_params.test_path" in err
    assert "Dataset.from_tensors" not in err and not (tmp_path / "run").exists()
