"""Seeded fuzzing of malformed configs, data files and API inputs.

Every case is invalid by construction. Each must be refused with a privopt error
(:class:`privopt.errors.PrivoptError`: ConfigError, DataError, ModelError, ...) whose message is one
line, or an argparse usage error (exit 2): never a raw traceback (any other exception) and never
silent acceptance (no exception). The cases are generated from a fixed seed, so a failure always
reproduces; ``FUZZ_SEED`` picks another sample locally.
"""

from __future__ import annotations

import gzip
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from privopt.errors import PrivoptError

SEED = int(os.environ.get("FUZZ_SEED", "20240"))
ADULT_BASE = CIFAR_BASE = None  # the unmutated Adult / CIFAR loaders (set by table_cases)
NAN, INF = math.nan, math.inf


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Path], object]
    mentions: tuple[str, ...] = ()  # the message names one of these (the bad key or value)


def expect_refused(case: Case, tmp_path: Path, capsys) -> None:
    try:
        result = case.run(tmp_path)
    except PrivoptError as e:
        message = str(e)
        assert message.strip() and "\n" not in message.strip(), f"unclear message: {message!r}"
    except SystemExit as e:  # argparse usage error
        assert e.code == 2
        return
    else:
        if not isinstance(result, int):
            pytest.fail(f"silently accepted: {case.name} -> {type(result).__name__}")
        _, message = capsys.readouterr()  # privopt.cli.main's exit code and stderr
        assert result == 2 and "Traceback" not in message and len(message.strip().splitlines()) == 1, message
    if case.mentions:
        assert any(m.lower() in message.lower() for m in case.mentions), (case.mentions, message)


# ================================================================================= configs
def yaml_text(v) -> str:
    if isinstance(v, float) and math.isnan(v):
        return ".nan"
    if isinstance(v, float) and math.isinf(v):
        return ".inf" if v > 0 else "-.inf"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return str(v).replace("'", "")
    return str(v)


# Invalid values per config key (each is outside the key's domain for the base run below:
# dp-sgd, logreg, digits with n = 1437 training records).
INVALID = {
    "algorithm": ["nope", 3, None, "", []],
    "algorithm_params.lr": [NAN, INF, -1, 0, "fast", None, [1], True],
    "algorithm_params.batch_size": [-5, 0, 2.5, "64x", NAN, 10**6, True, None],
    "algorithm_params.epochs": [0, -1, NAN, INF, "ten", True],
    "algorithm_params.clip": [0, -1, NAN, INF, "one", None],
    "algorithm_params.momentum": [-0.1, 1.5, NAN],
    "algorithm_params.weight_decay": [-1, NAN, INF],
    "algorithm_params.learning_rate": [0.1],
    "privacy.epsilon": [0, -1, NAN, INF, "one", [1], True],
    "privacy.delta": [0, 1, 1.5, -1e-5, NAN, "1e-5x", 0.5, True],
    "privacy.neighbouring": ["both", 1, None],
    "privacy.accountant": ["exact", None, 3],
    "privacy.allow_large_delta": ["sure", 1, None, "yes", "off"],  # read as YAML 1.2: yes/no/on/off are strings
    "privacy.eps": [1.0],
    "dataset": ["nope", 5, None],
    "dataset_params.val_fraction": [-0.1, 1.0, 1.5, NAN, "x"],
    "dataset_params.test_fraction": [-0.5, 1.0, NAN, "x"],
    "dataset_params.scaling": ["zscore", 1, None],
    "dataset_params.max_train": [0, -1, 2.5, "x", True],
    "dataset_params.train_fraction": [0, 1.5, NAN, -1],
    "dataset_params.bogus": [1],
    "model": ["nope", 1, None],
    "model_params.bias": ["maybe", 2, "no"],
    "model_params.bogus": [1],
    "engine": ["turbo", 1, None],
    "loss": ["mse", 1, None],
    "seed": [-1, 2.5, "x", True, None],
    "insecure_seed": [-1, 2.5, "x", True],
    "eval_split": ["train", 1, None],
    "metrics": ["mia", ["nope"], 3],
    "eval_every": [-1, 2.5, "x", True],
    "checkpoint_every": [-1, NAN, None],
    "non_private_diagnostics": ["sure", 1, None],
    "plots": ["never", 0, None],
    "data_dir": [3, [1], True],
    "bogus_key": [1],
    "privacy": ["strict", 3, [1]],
    "algorithm_params": ["lr=1", 3, [1]],
    "dataset_params": ["x", 2],
}
BASE = ["model=logreg", "algorithm_params.epochs=1", "algorithm_params.batch_size=100"]


def cli_train(overrides: list[str]) -> Callable[[Path], int]:
    def run(tmp: Path) -> int:
        from privopt.cli import main

        sets = [x for kv in [*BASE, *overrides] for x in ("--set", kv)]
        return main(["train", *sets, "--out", str(tmp / "run"), "--quiet"])

    return run


def config_cases(rng: random.Random) -> list[Case]:
    singles = [(k, v) for k, values in INVALID.items() for v in values]
    cases = [
        Case(f"config {k}={yaml_text(v)}", cli_train([f"{k}={yaml_text(v)}"]), mentions=(k.split(".")[-1].rstrip("s"),))
        for k, v in singles
    ]
    for _ in range(25):  # two bad values at once
        (k1, v1), (k2, v2) = rng.sample(singles, 2)
        if k1.split(".")[0] == k2.split(".")[0] and "." not in k1 + k2:
            continue
        sets = [f"{k1}={yaml_text(v1)}", f"{k2}={yaml_text(v2)}"]
        cases.append(Case(f"config {' '.join(sets)}", cli_train(sets)))
    return cases


VALID_YAML = """\
algorithm: dp-sgd
algorithm_params: {epochs: 1, batch_size: 100, lr: 0.5, clip: 1.0}
dataset: digits
model: logreg
privacy: {epsilon: 1.0, delta: 1.0e-5}
seed: 0
"""


def yaml_file_cases(rng: random.Random) -> list[Case]:
    """Corrupted YAML files: the value-level check is `config_cases`; here the file is broken."""
    broken = [
        VALID_YAML.replace("{epochs", "[epochs"),
        VALID_YAML.replace("algorithm: dp-sgd", "algorithm dp-sgd"),
        VALID_YAML + "privacy: {epsilon: 2.0",
        VALID_YAML.replace("privacy: {epsilon: 1.0, delta: 1.0e-5}", "privacy:\n\tepsilon: 1.0"),
        "- " + VALID_YAML.replace("\n", "\n- "),
        "just a string",
        "42",
        VALID_YAML.replace("epsilon: 1.0", "epsilon: &a 1.0\n  - *a"),
        VALID_YAML.replace("dp-sgd", '"dp-sgd'),
        VALID_YAML + "algorithm: sgd\n",  # duplicate key: ambiguous, refused
    ]
    for _ in range(8):  # random byte damage that leaves no valid YAML mapping
        b = bytearray(VALID_YAML.encode())
        cut = rng.randrange(1, len(b) - 1)
        junk = bytes(rng.choice(b"\x00\xff\xfe{[:\"'") for _ in range(3))
        broken.append(bytes(b[:cut]) + junk + bytes(b[cut:]))

    def case(content) -> Callable[[Path], object]:
        def run(tmp: Path):
            from privopt.config import load_config
            from privopt.training import build_run

            p = tmp / "cfg.yaml"
            p.write_bytes(content if isinstance(content, bytes) else content.encode())
            return build_run(load_config(p))

        return run

    return [Case(f"yaml file {i}", case(c)) for i, c in enumerate(broken)]


# ================================================================================= data files
def idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def write_mnist(root: Path, rng: np.random.Generator, *, gz: bool) -> dict[str, Path]:
    d = root / "mnist"
    d.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n in (("train", 30), ("t10k", 10)):
        for kind, arr in (
            ("images-idx3", rng.integers(0, 256, (n, 28, 28))),
            ("labels-idx1", np.arange(n) % 10),
        ):
            p = d / f"{split}-{kind}-ubyte{'.gz' if gz else ''}"
            raw = idx_bytes(arr)
            p.write_bytes(gzip.compress(raw) if gz else raw)
            files[f"{split}-{kind}"] = p
    return files


def mnist_cases(rng: random.Random) -> list[Case]:
    def case(mutate, gz=False) -> Callable[[Path], object]:
        def run(tmp: Path):
            from privopt.data import load_dataset

            files = write_mnist(tmp, np.random.default_rng(0), gz=gz)
            mutate(files)
            return load_dataset("mnist", data_dir=tmp)

        return run

    def truncate(key, frac):
        def m(files):
            p = files[key]
            raw = p.read_bytes()
            p.write_bytes(raw[: max(1, int(len(raw) * frac))])

        return m

    def patch(key, offset, value):
        def m(files):
            p = files[key]
            raw = bytearray(p.read_bytes())
            raw[offset] = value
            p.write_bytes(bytes(raw))

        return m

    def relabel(value):
        def m(files):
            p = files["train-labels-idx1"]
            raw = bytearray(p.read_bytes())
            raw[-1] = value
            p.write_bytes(bytes(raw))

        return m

    cases = []
    keys = ["train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1"]
    for key in keys:
        for _ in range(2):
            frac = rng.uniform(0.01, 0.99)
            cases.append(Case(f"mnist {key} truncated to {frac:.2f}", case(truncate(key, frac))))
            cases.append(Case(f"mnist {key}.gz truncated to {frac:.2f}", case(truncate(key, frac), gz=True)))
    for key in keys:
        cases.append(Case(f"mnist {key} bad type byte", case(patch(key, 2, rng.choice([0x07, 0x0A, 0xFF])))))
        cases.append(Case(f"mnist {key} bad ndim", case(patch(key, 3, rng.choice([0, 2, 4])))))
        cases.append(Case(f"mnist {key} count+1", case(patch(key, 7, 31 if key.startswith("train") else 11))))
        cases.append(Case(f"mnist {key} empty", case(lambda f, k=key: f[k].write_bytes(b""))))
        cases.append(Case(f"mnist {key} missing", case(lambda f, k=key: f[k].unlink())))
    cases.append(Case("mnist label 10", case(relabel(10))))
    cases.append(Case("mnist label 255", case(relabel(255))))
    cases.append(
        Case(
            "mnist images/labels count mismatch",
            case(lambda f: f["train-labels-idx1"].write_bytes(idx_bytes(np.arange(29) % 10))),
        )
    )
    cases.append(
        Case(
            "mnist gzip garbage",
            case(lambda f: f["train-images-idx3"].write_bytes(b"\x1f\x8b" + os.urandom(200)), gz=True),
        )
    )
    return cases


def covtype_rows(n: int, rng: np.random.Generator) -> list[str]:
    rows = []
    for i in range(n):
        quant = [int(v) for v in rng.integers(0, 300, 10)]
        wild = [0] * 4
        wild[i % 4] = 1
        soil = [0] * 40
        soil[i % 40] = 1
        rows.append(",".join(map(str, [*quant, *wild, *soil, 1 + i % 7])))
    return rows


def table_cases(rng: random.Random) -> list[Case]:
    """Covertype and Adult text files: truncated mid-line, wrong field counts, bad tokens and labels."""

    def covtype(mutate, gz=False) -> Callable[[Path], object]:
        def run(tmp: Path):
            from privopt.data import load_dataset

            d = tmp / "covtype"
            d.mkdir(parents=True)
            rows = covtype_rows(60, np.random.default_rng(1))
            text = mutate(rows)
            (d / f"covtype.data{'.gz' if gz else ''}").write_bytes(
                gzip.compress(text.encode()) if gz else text.encode()
            )
            return load_dataset("covertype", data_dir=tmp)

        return run

    def cut_mid_line(rows):
        text = "\n".join(rows) + "\n"
        ends = {i for i, ch in enumerate(text) if ch == "\n"}
        cut = rng.choice([i for i in range(1, len(text)) if i not in ends and i + 1 not in ends and i - 1 not in ends])
        return text[:cut]

    def replace_field(row_i, field_i, token):
        def m(rows):
            fields = rows[row_i].split(",")
            fields[field_i] = token
            rows[row_i] = ",".join(fields)
            return "\n".join(rows) + "\n"

        return m

    cases = [Case(f"covtype truncated #{i}", covtype(cut_mid_line, gz=i % 2 == 1)) for i in range(6)]
    for token in ("abc", "nan", "inf", "", "1,2", "0x1f", "--3"):
        r, f = rng.randrange(60), rng.randrange(54)
        cases.append(Case(f"covtype token {token!r}", covtype(replace_field(r, f, token))))
    for label in ("0", "8", "2.5", "-1"):
        cases.append(Case(f"covtype label {label}", covtype(replace_field(rng.randrange(60), 54, label))))
    cases.append(Case("covtype empty", covtype(lambda rows: "")))
    cases.append(Case("covtype one short row", covtype(lambda rows: "\n".join([*rows, "1,2,3"]) + "\n")))

    def adult(mutate) -> Callable[[Path], object]:
        def run(tmp: Path):
            from privopt.data import load_dataset
            from privopt.data.public import ADULT_VOCABULARY

            g = np.random.default_rng(2)
            rows = []
            for i in range(40):
                pick = {k: v[int(g.integers(len(v)))] for k, v in ADULT_VOCABULARY.items()}
                pick.update(sex=("Female", "Male")[i % 2], race=("White", "Black", "Other")[i % 3])
                fields = [
                    str(int(g.integers(17, 90))), pick["workclass"], "100000", pick["education"], "9",
                    pick["marital-status"], pick["occupation"], pick["relationship"], pick["race"], pick["sex"],
                    "0", "0", "40", pick["native-country"], ("<=50K", ">50K")[i % 2],
                ]  # fmt: skip
                rows.append(fields)
            d = tmp / "adult"
            d.mkdir(parents=True)
            (d / "adult.data").write_text(mutate(rows))
            return load_dataset("adult", data_dir=tmp)

        return run

    def adult_field(i, token):
        def m(rows):
            rows[rng.randrange(len(rows))][i] = token
            return "\n".join(", ".join(r) for r in rows) + "\n"

        return m

    for i, token in ((0, "old"), (0, "nan"), (1, "Astronaut"), (9, "Unknown"), (8, "Martian"), (14, "maybe")):
        cases.append(Case(f"adult field {i}={token!r}", adult(adult_field(i, token))))
    cases.append(Case("adult short row", adult(lambda rows: "\n".join(", ".join(r[:-2]) for r in rows))))
    cases.append(
        Case("adult truncated", adult(lambda rows: ("\n".join(", ".join(r) for r in rows))[: -rng.randrange(5, 40)]))
    )

    def cifar(mutate) -> Callable[[Path], object]:
        def run(tmp: Path):
            from privopt.data import load_dataset

            d = tmp / "cifar10"
            d.mkdir(parents=True)
            g = np.random.default_rng(3)
            for name, n in (("data_batch_1.bin", 12), ("test_batch.bin", 5)):
                rec = g.integers(0, 256, (n, 3073)).astype(np.uint8)
                rec[:, 0] = np.arange(n) % 10
                (d / name).write_bytes(mutate(name, rec.tobytes()))
            return load_dataset("cifar10", data_dir=tmp)

        return run

    global ADULT_BASE, CIFAR_BASE
    ADULT_BASE = Case("adult base", adult(lambda rows: "\n".join(", ".join(r) for r in rows) + "\n"))
    CIFAR_BASE = Case("cifar base", cifar(lambda name, raw: raw))
    cases.append(Case("cifar truncated", cifar(lambda name, raw: raw[: -rng.randrange(1, 3000)])))
    cases.append(Case("cifar extra bytes", cifar(lambda name, raw: raw + b"\x00" * rng.randrange(1, 100))))
    cases.append(Case("cifar label 10", cifar(lambda name, raw: bytes([10]) + raw[1:])))
    cases.append(Case("cifar empty test", cifar(lambda name, raw: b"" if "test" in name else raw)))
    return cases


# ================================================================================= API inputs
def api_cases(rng: random.Random) -> list[Case]:
    from privopt.data import Dataset

    gen = torch.Generator().manual_seed(SEED)
    x, y = torch.rand(50, 3, generator=gen), torch.randint(0, 2, (50,), generator=gen)
    cases: list[Case] = []

    def add(name, fn):
        cases.append(Case(name, lambda tmp, fn=fn: fn()))

    # Dataset.from_tensors / from_numpy
    ft = Dataset.from_tensors
    add("dataset lengths", lambda: ft(x, y[:49], num_classes=2))
    add("dataset float labels", lambda: ft(x, y.float(), num_classes=2))
    add("dataset nan", lambda: ft(torch.full((50, 3), NAN), y, num_classes=2))
    add("dataset inf", lambda: ft(x.index_fill(0, torch.tensor([7]), INF), y, num_classes=2))
    add("dataset huge", lambda: ft(x * 1e7, y, num_classes=2))
    add("dataset 1-d x", lambda: ft(x[:, 0], y, num_classes=2))
    add("dataset 2-d y", lambda: ft(x, y[:, None], num_classes=2))
    add("dataset negative label", lambda: ft(x, y - 1, num_classes=2))
    add("dataset label >= classes", lambda: ft(x, y + 1, num_classes=2))
    add("dataset empty", lambda: ft(x[:0], y[:0], num_classes=2))
    add("dataset complex", lambda: ft(x.to(torch.complex64), y, num_classes=2))
    add("dataset list x", lambda: ft(x.tolist(), y, num_classes=2))
    add("dataset numpy into from_tensors", lambda: ft(x.numpy(), y, num_classes=2))
    add("dataset test shape", lambda: ft(x, y, x_test=torch.rand(5, 4), y_test=y[:5], num_classes=2))
    add("dataset test lengths", lambda: ft(x, y, x_test=x[:5], y_test=y[:4], num_classes=2))
    add("dataset y_test alone", lambda: ft(x, y, y_test=y[:5], num_classes=2))
    add("dataset groups partial", lambda: ft(x, y, x_test=x[:5], y_test=y[:5], groups=y, num_classes=2))
    add("dataset float groups", lambda: ft(x, y, groups=y.float(), num_classes=2))
    add("dataset group names short", lambda: ft(x, y, groups=y, group_names=["a"], num_classes=2))
    add("dataset class names long", lambda: ft(x, y, class_names=["a", "b", "c"], num_classes=2))
    for k in (0, -1, 1, 2.5, "2", True, NAN, 1.0):
        add(f"dataset num_classes={k!r}", lambda k=k: ft(x, y, num_classes=k))
    add("dataset name", lambda: ft(x, y, num_classes=2, name=3))
    fn = Dataset.from_numpy
    add("numpy strings", lambda: fn(np.array([["a", "b"]] * 4), np.zeros(4, dtype=int), num_classes=2))
    add("numpy object", lambda: fn(np.array([[1, None]] * 4, dtype=object), np.zeros(4, dtype=int), num_classes=2))
    add("numpy ragged", lambda: fn([[1.0, 2.0], [3.0]], [0, 1], num_classes=2))
    add("numpy float labels", lambda: fn(np.zeros((4, 2)), np.array([0.0, 1.0, 0.5, 1.0]), num_classes=2))
    add("numpy nan", lambda: fn(np.full((4, 2), np.nan), np.zeros(4, dtype=int), num_classes=2))
    add("numpy 3 lengths", lambda: fn(np.zeros((4, 2)), np.zeros(3, dtype=int), num_classes=2))

    # load_dataset options
    from privopt.data import load_dataset

    for kw in (
        {"val_fraction": 2},
        {"val_fraction": NAN},
        {"seed": -1},
        {"seed": 1.5},
        {"scaling": "zscore"},
        {"max_train": 0},
        {"train_fraction": 0},
        {"bogus": 1},
        {"test_fraction": 1.0},
    ):
        add(f"load_dataset digits {kw}", lambda kw=kw: load_dataset("digits", **kw))
    add("load_dataset name", lambda: load_dataset(3))

    # privacy layer
    from privopt.privacy import Gaussian, Poisson, PrivacyLedger, Step, calibrate, dp_sgd_noise

    for bad in (NAN, -1, 0, 1.5, "0.1", True):
        add(f"Poisson rate={bad!r}", lambda b=bad: Poisson(b))
    for bad in (NAN, -1, "1", INF):
        add(f"Gaussian z={bad!r}", lambda b=bad: Gaussian(b))
    step = Step(Poisson(0.1), (Gaussian(1.0, name="g"),))
    for kw in ({"delta": 0}, {"delta": NAN}, {"delta": 1e-5, "target_epsilon": -1}, {"delta": 1e-5, "mode": "x"}):
        add(f"ledger {kw}", lambda kw=kw: PrivacyLedger(**kw))
    add("ledger record non-step", lambda: PrivacyLedger(delta=1e-5).record("step"))
    add("ledger planned over target", lambda: PrivacyLedger(delta=1e-5, target_epsilon=0.01, planned={step: 10**5}))
    for kw in (
        {"epsilon": NAN},
        {"epsilon": 0},
        {"delta": 2},
        {"steps": 0},
        {"steps": 2.5},
        {"batch_size": 0},
        {"batch_size": 10**6},
        {"dataset_size": -1},
        {"accountant": "exact"},
        {"sampling": "shuffle"},
    ):
        args = {"dataset_size": 1000, "batch_size": 10, "steps": 10, "epsilon": 1.0, "delta": 1e-5, **kw}
        add(f"dp_sgd_noise {kw}", lambda a=args: dp_sgd_noise(**a))
    add("calibrate non-inventory", lambda: calibrate({"g": 1}, epsilon=1.0, delta=1e-5))

    # samplers, engines, releases
    from privopt.grads import BoundedSum, PrivateBatch, get_engine
    from privopt.sampling import PoissonSampler, WithoutReplacementSampler

    g = torch.Generator().manual_seed(0)
    for kw in ({"n": 0, "rate": 0.1}, {"n": 10, "rate": NAN}, {"n": 10, "rate": -0.5}, {"n": 10, "rate": 2.0}):
        add(f"PoissonSampler {kw}", lambda kw=kw: PoissonSampler(rng=g, **kw))
    add("WOR batch > n", lambda: WithoutReplacementSampler(n=5, batch_size=6, rng=g))
    add("WOR batch 0", lambda: WithoutReplacementSampler(n=5, batch_size=0, rng=g))
    add("engine name", lambda: get_engine("turbo"))
    lin, ce = nn.Linear(3, 2), lambda o, t: nn.functional.cross_entropy(o, t, reduction="none")
    for clip in (NAN, 0, -1, "1", None):  # (inf: unclipped sums for non-private references)
        add(f"clipped_sum clip={clip!r}", lambda c=clip: get_engine("vmap").clipped_sum(lin, ce, x, y, clip=c))
    for bound in (NAN, -1, 0, "1"):
        add(f"BoundedSum bound={bound!r}", lambda b=bound: BoundedSum(torch.zeros(2), bound=b))
    for norm in (NAN, 0, -1, INF):

        def release(norm=norm):
            batch = PrivateBatch(PrivacyLedger(delta=1e-5), Poisson(0.1), {"g": 1.0}, rng=g)
            return batch.gaussian("g", BoundedSum(torch.zeros(2), bound=1.0), normalizer=norm)

        add(f"release normalizer={norm!r}", release)

    def unbounded_release():
        batch = PrivateBatch(PrivacyLedger(delta=1e-5), Poisson(0.1), {"g": 1.0}, rng=g)
        return batch.gaussian("g", BoundedSum(torch.zeros(2), bound=INF), normalizer=10)

    add("private release of an unclipped sum", unbounded_release)

    # algorithms and models
    from privopt.algorithms import get_algorithm
    from privopt.models import build_model

    for kw in ({"lr": NAN}, {"batch_size": -1}, {"epochs": INF}, {"clip": "1"}, {"bogus": 1}, {"momentum": 2}):
        add(f"get_algorithm dp-sgd {kw}", lambda kw=kw: get_algorithm("dp-sgd", **kw))
    add("get_algorithm name", lambda: get_algorithm("nope"))
    for kw in ({"num_classes": 0}, {"num_classes": 2.5}, {"input_shape": (0,)}, {"hidden": 0}, {"input_shape": "x"}):
        args = {"input_shape": (4,), "num_classes": 2, **kw}
        add(f"build_model mlp {kw}", lambda a=args: build_model("mlp", **a))

    # make_private / fit with random bad arguments
    import privopt

    bad_engine_args = {
        "epsilon": [NAN, -1, 0, INF, "1"],
        "delta": [0, 0.5, NAN, 1],
        "epochs": [0, NAN, -2, INF],
        "max_grad_norm": [0, -1, NAN, INF],
        "batch_size": [0, -3, 2.5, 51, "8"],
        "criterion": [3, "mse"],
        "dataset": [(x, y[:40]), (x, y, y), "data", None],
    }
    for _ in range(24):
        key = rng.choice(sorted(bad_engine_args))
        value = rng.choice(bad_engine_args[key])

        def make(key=key, value=value):
            model = nn.Linear(3, 2)
            kw = dict(
                module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=(x, y),
                batch_size=10, epochs=1, epsilon=1.0, delta=1e-3, max_grad_norm=1.0,
            )  # fmt: skip
            kw[key] = value
            return privopt.PrivacyEngine(accountant="rdp").make_private(**kw)

        shown = type(value).__name__ if isinstance(value, tuple) else repr(value)
        add(f"make_private {key}={shown}", make)
    data = Dataset.from_tensors(x[:40], y[:40], x_test=x[40:], y_test=y[40:], num_classes=2)
    for kw in ({"lr": NAN}, {"batch_size": 0}, {"epsilon": -1}, {"delta": 0.5}, {"algorithm": 3}, {"seed": -1}):
        args = {"model": nn.Linear(3, 2), "dataset": data, "epsilon": 1.0, "delta": 1e-3, **kw}
        add(f"fit {kw}", lambda a=args: privopt.fit(**a))
    return cases


def all_cases() -> list[Case]:
    rng = random.Random(SEED)
    return config_cases(rng) + yaml_file_cases(rng) + mnist_cases(rng) + table_cases(rng) + api_cases(rng)


CASES = all_cases()


def test_enough_cases():
    assert len(CASES) >= 200


@pytest.mark.parametrize("case", CASES, ids=[f"{i:03d}-{c.name}"[:90] for i, c in enumerate(CASES)])
def test_refused_clearly(case, tmp_path, capsys):
    expect_refused(case, tmp_path, capsys)


def test_the_fuzzer_accepts_the_valid_inputs_it_mutates(tmp_path):
    """The mutations start from inputs that load: a refusal above is the mutation's doing."""
    from privopt.config import load_config
    from privopt.data import load_dataset
    from privopt.training import build_run

    write_mnist(tmp_path, np.random.default_rng(0), gz=False)
    assert load_dataset("mnist", data_dir=tmp_path).n_train == 30
    (tmp_path / "covtype").mkdir()
    (tmp_path / "covtype" / "covtype.data").write_text("\n".join(covtype_rows(60, np.random.default_rng(1))) + "\n")
    assert load_dataset("covertype", data_dir=tmp_path, test_fraction=0.5).n_train > 0
    (tmp_path / "cfg.yaml").write_text(VALID_YAML)
    assert load_config(tmp_path / "cfg.yaml").algorithm_params["batch_size"] == 100
    assert build_run(load_config(tmp_path / "cfg.yaml")).total > 0
    assert build_run(load_config(None, BASE)).total > 0  # the base of the --set cases
    for case in (ADULT_BASE, CIFAR_BASE):
        assert case.run(tmp_path / case.name.replace(" ", "-")).n_train > 0
