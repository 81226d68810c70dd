"""What a run publishes: public facts and released values only (attacks 1 and 3 of issue 8 re-run).

Threat model (docs/privacy.md): the attacker knows every training record but one and reads every
public file a run writes (record.json, metrics.csv, curves.png, model.pt). checkpoint.pt is
secret (0600) and diagnostics.NOT_PRIVATE.json is off by default.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from _run_helpers import cfg, read_record
from privopt.data import Dataset, load_dataset
from privopt.training import load_diagnostics, train

PUBLIC_FILES = ("record.json", "metrics.csv", "curves.png", "model.pt")


def test_record_has_everything(tmp_path):
    rec = train(cfg(), out_dir=tmp_path / "run", progress=False)
    run = tmp_path / "run"
    saved = read_record(run)
    assert saved == json.loads(json.dumps(rec))
    assert saved["status"] == "finished" and saved["reason"] is None
    p = saved["privacy"]
    assert 0 < p["epsilon_spent"] <= 2.0 and p["delta"] == 1e-5 and p["neighbouring"] == "add_remove"
    assert saved["calibration"]["noise_multipliers"]["grad"] > 0 and saved["privacy_inventory"]
    assert saved["randomness"]["noise_and_sampling"] == "secret" and saved["randomness"]["insecure_seed"] is None
    assert saved["hyperparameters"]["clip"] == 1.0 and saved["wall_time_s"] > 0
    data = load_dataset("digits", seed=0)
    assert saved["dataset"] == {
        "name": "digits",
        "n_train": int(data.x_train.shape[0]),
        "n_test": int(data.x_test.shape[0]),
        "num_classes": 10,
        "input_shape": [1, 8, 8],
        "source": "config",
        "class_names": [str(c) for c in range(10)],  # public names (a dataset with groups names them too)
    }
    assert 0 <= saved["metrics"]["test_accuracy"] <= 1
    assert (run / "metrics.csv").read_text().startswith("step,epsilon_spent,test_loss")
    assert (run / "curves.png").stat().st_size > 1000
    assert sorted(os.listdir(run)) == ["checkpoint.pt", *sorted(PUBLIC_FILES)]
    assert (run / "checkpoint.pt").stat().st_mode & 0o777 == 0o600  # secret: holds the generator keys
    assert all((run / f).stat().st_mode & 0o044 for f in PUBLIC_FILES)


def test_released_model_reproduces_the_recorded_test_metrics(tmp_path):
    from privopt.data import load_dataset
    from privopt.models import build_model
    from privopt.training import build_loss, evaluate

    rec = train(cfg(algorithm_params={"epochs": 1}), out_dir=tmp_path / "r", progress=False)
    data = load_dataset("digits", seed=0)
    model = build_model("logreg", input_shape=data.input_shape, num_classes=10)
    model.load_state_dict(torch.load(tmp_path / "r" / "model.pt"))
    again = evaluate(model, build_loss("cross_entropy"), data.x_test, data.y_test, num_classes=10, prefix="test")
    assert again == {k: v for k, v in rec["metrics"].items() if k.startswith("test_") and k != "test_records"}
    assert rec["metrics"]["test_records"] == len(data.y_test)  # the final row reads the whole split


def test_intermediate_evaluations_read_an_evenly_spaced_subsample(tmp_path):
    rec = train(
        cfg(algorithm_params={"epochs": 1}, eval_every=5, eval_subsample=50), out_dir=tmp_path / "r", progress=False
    )
    counts = [row["test_records"] for row in rec["history"]]
    assert counts[:-1] and set(counts[:-1]) == {50} and counts[-1] > 50

    from privopt.training.builder import Run

    class _Data:
        x_test = torch.arange(10.0).reshape(10, 1)
        y_test = torch.arange(10)

    run = Run.__new__(Run)
    run.cfg, run.data = cfg(eval_subsample=4), _Data()
    x, y = run.eval_split(subsample=True)
    assert y.tolist() == [0, 3, 6, 9] and torch.equal(x[:, 0].long(), y)  # both ends, evenly spaced
    assert len(run.eval_split()[1]) == 10


def test_dp_sgd_learns_digits(tmp_path):
    rec = train(cfg(algorithm_params={"epochs": 5}, privacy={"epsilon": 8.0}), out_dir=tmp_path / "r", progress=False)
    assert rec["metrics"]["test_accuracy"] > 0.6  # 10 classes: chance is 0.1


def test_diagnostics_hold_the_non_private_values(tmp_path):
    rec = train(
        cfg(algorithm_params={"epochs": 1}, non_private_diagnostics=True), out_dir=tmp_path / "r", progress=False
    )
    diag = load_diagnostics(tmp_path / "r")
    assert diag["NOT_PRIVATE"].startswith("NOT PRIVATE") and diag["status"] == "finished"
    assert {"train_loss", "train_accuracy"} <= set(diag["final"])
    assert diag["dataset_meta"]["private"]["label_histogram"]["train"] and "splits" in diag["dataset_meta"]["private"]
    assert not any(k.startswith("train_") for k in rec["metrics"]) and "meta" not in rec["dataset"]
    assert rec["files"]["diagnostics"].startswith("diagnostics.NOT_PRIVATE.json")
    # exact training statistics: readable by the owner only, like the checkpoint
    assert (tmp_path / "r" / "diagnostics.NOT_PRIVATE.json").stat().st_mode & 0o777 == 0o600


# ---------------------------------------------------------------------------------- attack 1
def _numbers(obj, out):
    """Every number and every list of numbers anywhere in a JSON value."""
    if isinstance(obj, dict):
        for v in obj.values():
            _numbers(v, out)
    elif isinstance(obj, list):
        if obj and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj):
            out.append(np.asarray(obj, dtype=np.float64))
        for v in obj:
            _numbers(v, out)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and obj is not None:
        out.append(np.asarray([obj], dtype=np.float64))
    return out


def _published_numbers(run: Path, names) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for name in names:
        path = run / name
        if name.endswith(".json"):
            _numbers(json.loads(path.read_text()), out)
        elif name.endswith(".csv"):
            rows = [r.split(",") for r in path.read_text().splitlines()[1:]]
            out += [np.asarray([float(v)]) for r in rows for v in r if v]
    return out


def _attack_1(
    numbers, *, n, target_x, others_x, target_y, others_y, num_classes, target_loss, others_loss
) -> list[str]:
    """The differencing attack of issue 8: with the other n-1 records, any exact training statistic
    (feature mean, label histogram, mean loss) gives the missing record away. Returns what it recovered."""
    found = []
    others_counts = np.bincount(others_y, minlength=num_classes)
    for v in numbers:
        if v.shape == target_x.shape and np.allclose(n * v - others_x.sum(0), target_x, rtol=1e-5, atol=1e-4):
            found.append("features")
        if v.shape == (num_classes,) and np.array_equal(v - others_counts, np.eye(num_classes)[target_y]):
            found.append("label")
        if v.shape == (1,) and abs(n * v[0] - others_loss.sum() - target_loss) < 1e-3:
            found.append("loss")
    return found


def test_attack_1_recovers_nothing_from_the_published_files(tmp_path):
    """Re-run of attack 1 on breast-cancer (tabular; the default loading pipeline): the attacker
    knows the other n-1 training records and reads record.json, metrics.csv and model.pt. Control:
    the same attack on diagnostics.NOT_PRIVATE.json (training-set values) does succeed."""
    from privopt.data import load_dataset
    from privopt.models import build_model
    from privopt.training import build_loss

    c = cfg(dataset="breast-cancer", model="logreg", algorithm_params={"epochs": 2, "batch_size": 50})
    train(c, out_dir=tmp_path / "r", progress=False)
    c_diag = cfg(dataset="breast-cancer", model="logreg", algorithm_params={"epochs": 2, "batch_size": 50})
    c_diag.non_private_diagnostics = True
    train(c_diag, out_dir=tmp_path / "d", progress=False)

    scaled = load_dataset("breast-cancer", seed=0)
    raw = load_dataset("breast-cancer", seed=0, standardize=False)  # the records the attacker knows
    x, y = raw.x_train.numpy().astype(np.float64), raw.y_train.numpy()

    def attack(run: Path, names) -> list[str]:
        model = build_model("logreg", input_shape=(30,), num_classes=2)
        model.load_state_dict(torch.load(run / "model.pt"))  # the released model
        with torch.no_grad():
            losses = build_loss("cross_entropy")(model(scaled.x_train), scaled.y_train).double().numpy()
        return _attack_1(
            _published_numbers(run, names),
            n=len(y),
            target_x=x[0],
            others_x=x[1:],
            target_y=y[0],
            others_y=y[1:],
            num_classes=2,
            target_loss=losses[0],
            others_loss=losses[1:],
        )

    assert attack(tmp_path / "r", ["record.json", "metrics.csv"]) == []
    assert attack(tmp_path / "d", ["record.json", "metrics.csv"]) == []
    assert attack(tmp_path / "d", ["diagnostics.NOT_PRIVATE.json"])  # the attack is real: diagnostics leak


def _neighbouring_digits() -> tuple[Dataset, Dataset]:
    """Two datasets that differ in one training record (replace-one), each with the provenance a
    loading pipeline records (exact label histogram, feature means: what records used to copy)."""
    from sklearn.datasets import load_digits

    b = load_digits()
    x = torch.from_numpy(b.images.astype(np.float32) / 16.0)[:, None]
    y = torch.from_numpy(b.target.astype(np.int64))

    def world(replace: bool) -> Dataset:
        xt, yt = x[:1400].clone(), y[:1400].clone()
        if replace:
            xt[0], yt[0] = 1.0 - xt[0], (yt[0] + 3) % 10
        meta = {
            "label_histogram": {"train": torch.bincount(yt, minlength=10).tolist()},
            "standardization": {"mean": [float(xt.mean())]},
        }
        return Dataset(
            name="digits-neighbours",
            x_train=xt,
            y_train=yt,
            x_val=x[:0],
            y_val=y[:0],
            x_test=x[1400:],
            y_test=y[1400:],
            num_classes=10,
            input_shape=(1, 8, 8),
            meta=meta,
        )

    return world(False), world(True)


def _model() -> torch.nn.Module:
    """A linear model with PyTorch's random initialisation (weights ~0.1, none near zero)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def _run_pair(tmp_path: Path, tag: str, **over):
    a, b = _neighbouring_digits()
    c = cfg(**{"algorithm_params": {"epochs": 1}, "insecure_seed": 3, **over})
    for name, data in (("a", a), ("b", b)):
        train(c, out_dir=tmp_path / f"{tag}-{name}", progress=False, dataset=data, model=_model())
    return tmp_path / f"{tag}-a", tmp_path / f"{tag}-b"


def _same_published_bytes(run_a: Path, run_b: Path) -> None:
    ra, rb = read_record(run_a), read_record(run_b)
    ra.pop("wall_time_s"), rb.pop("wall_time_s")
    assert ra == rb
    for name in ("metrics.csv", "curves.png", "model.pt"):
        assert (run_a / name).read_bytes() == (run_b / name).read_bytes(), name


def test_neighbouring_datasets_give_identical_published_files_when_the_model_is_identical(tmp_path):
    """The released model is the ONLY channel from the data to the public files. With clip 1e-30 the
    noisy updates (~1e-32) are far below float32 resolution of weights ~0.1, so both neighbouring
    worlds release the same model (checked); then every published byte must be the same: nothing
    else reads the data.
    Control: the non-private diagnostics of the same two worlds differ."""
    run_a, run_b = _run_pair(tmp_path, "default", algorithm_params={"epochs": 1, "clip": 1e-30})
    ma, mb = torch.load(run_a / "model.pt"), torch.load(run_b / "model.pt")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)  # the premise: one released model
    _same_published_bytes(run_a, run_b)
    assert sorted(os.listdir(run_a)) == ["checkpoint.pt", *sorted(PUBLIC_FILES)]

    diag_a, diag_b = _run_pair(
        tmp_path, "diag", algorithm_params={"epochs": 1, "clip": 1e-30}, non_private_diagnostics=True
    )
    _same_published_bytes(diag_a, diag_b)
    assert load_diagnostics(diag_a)["dataset_meta"] != load_diagnostics(diag_b)["dataset_meta"]
    assert load_diagnostics(diag_a)["final"]["train_loss"] != load_diagnostics(diag_b)["final"]["train_loss"]


def test_neighbouring_datasets_differ_only_in_released_model_metrics(tmp_path):
    """Real training: the two worlds' records differ only in the metrics of the released model on
    the public test split (and wall time); metrics.csv holds only step, ε spent and test metrics."""
    run_a, run_b = _run_pair(tmp_path, "train")
    ra, rb = read_record(run_a), read_record(run_b)
    for r in (ra, rb):
        for key in ("metrics", "history", "wall_time_s"):
            r.pop(key)
    assert ra == rb
    ha, hb = read_record(run_a)["history"], read_record(run_b)["history"]
    assert [(h["step"], h["epsilon_spent"]) for h in ha] == [(h["step"], h["epsilon_spent"]) for h in hb]
    header = (run_a / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["step", "epsilon_spent"] and all(k.startswith("test_") for k in header[2:])
    assert ha != hb  # the models do differ: the comparison above is not vacuous


# ---------------------------------------------------------------------------------- attack 3
def _final_weights(run: Path) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in torch.load(run / "model.pt").values()])


def test_attack_3_replaying_the_published_seed_identifies_nothing(tmp_path):
    """Re-run of attack 3: the attacker replays training on both candidate datasets with every seed
    the record shows and compares with the released model. Secret randomness (the default): no
    replay matches. Control: a run that opted into insecure_seed says so in its record, and the
    replay then identifies the true dataset exactly."""
    a, b = _neighbouring_digits()
    c = cfg(algorithm_params={"epochs": 1})
    train(c, out_dir=tmp_path / "victim", progress=False, dataset=a)
    rec = read_record(tmp_path / "victim")
    assert rec["randomness"]["noise_and_sampling"] == "secret" and rec["randomness"]["insecure_seed"] is None
    victim = _final_weights(tmp_path / "victim")
    seeds = {rec["config"]["seed"], rec["randomness"]["public_seed"]}
    for seed in seeds:
        for name, data in (("a", a), ("b", b)):
            out = tmp_path / f"replay-{seed}-{name}"
            train(cfg(algorithm_params={"epochs": 1}, insecure_seed=seed), out_dir=out, progress=False, dataset=data)
            assert not torch.equal(_final_weights(out), victim)
    ckpt = torch.load(tmp_path / "victim" / "checkpoint.pt", weights_only=False)
    assert ckpt["rng"]["noise"]["kind"] == "secure-aes-ctr"  # the keys live only in the 0600 checkpoint
    assert (tmp_path / "victim" / "checkpoint.pt").stat().st_mode & 0o777 == 0o600

    seeded = cfg(algorithm_params={"epochs": 1}, insecure_seed=5)
    train(seeded, out_dir=tmp_path / "seeded", progress=False, dataset=a)
    rec = read_record(tmp_path / "seeded")
    assert rec["randomness"]["insecure_seed"] == 5 and "INSECURE" in rec["randomness"]["noise_and_sampling"]
    for name, data, same in (("a", a, True), ("b", b, False)):
        train(seeded, out_dir=tmp_path / f"seeded-replay-{name}", progress=False, dataset=data)
        got = _final_weights(tmp_path / f"seeded-replay-{name}")
        assert torch.equal(got, _final_weights(tmp_path / "seeded")) is same


@pytest.mark.parametrize("private", [True, False])
def test_history_rows_hold_only_public_keys(tmp_path, private):
    over = {} if private else {"algorithm": "sgd", "privacy": {"epsilon": None}}
    c = cfg(**over)
    if not private:
        c.algorithm_params = {"epochs": 1, "batch_size": 100, "lr": 0.5}
    rec = train(c, out_dir=tmp_path / "r", progress=False)
    keys = {k for h in rec["history"] for k in h} | set(rec["metrics"])
    assert keys and all(k in ("step", "epsilon_spent") or k.startswith("test_") for k in keys)


def test_no_public_file_holds_a_key_of_the_secret_generators(tmp_path):
    """docs/privacy.md, "Randomness": the record holds no seed or key; the AES keys of the noise and
    the sampling live only in the 0600 checkpoint (in no public file, in bytes, hex, base64 or ints)."""
    import base64

    train(cfg(algorithm_params={"epochs": 1}), out_dir=tmp_path / "run", progress=False)
    states = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["rng"]
    keys = [s["key"] for s in states.values() if isinstance(s, dict) and s.get("kind") == "secure-aes-ctr"]
    assert len(keys) >= 2 and all(isinstance(k, bytes) and len(k) == 32 for k in keys)  # noise and sampling
    for name in PUBLIC_FILES:
        raw = (tmp_path / "run" / name).read_bytes()
        text = "".join(raw.decode("latin-1").lower().split())  # no whitespace: any JSON layout
        for key in keys:
            assert key not in raw, name
            assert key.hex() not in text and base64.b64encode(key).decode().lower() not in text, name
            assert ",".join(map(str, key[:8])) not in text, name
