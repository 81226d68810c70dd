"""Integer features (token ids) stay integer in a ``Dataset`` and reach an ``nn.Embedding`` model
through ``privopt.fit`` as they are (no ``x.long()`` in ``forward``); their checks quote no value."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import privopt
from privopt.data import Dataset
from privopt.errors import DataError, ModelError


class BagOfEmbeddings(nn.Module):
    """Mean of token embeddings: no ``x.long()`` workaround in ``forward``."""

    def __init__(self, vocab=30, dim=6):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, 2)
        self.seen: set[torch.dtype] = set()

    def forward(self, x):
        self.seen.add(x.dtype)
        return self.head(self.embed(x).mean(dim=1))


def _tokens(n=300, length=8, vocab=30, dtype=torch.int64):
    g = torch.Generator().manual_seed(1)
    t = torch.randint(0, vocab, (n, length), generator=g).to(dtype)
    y = ((t < vocab // 2).sum(1) > length // 2).long()
    return Dataset.from_tensors(t[:250], y[:250], x_test=t[250:], y_test=y[250:], num_classes=2)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_features_stay_integer(dtype):
    data = _tokens(dtype=dtype)
    assert data.x_train.dtype == data.x_test.dtype == torch.int64
    assert f"{dtype} features kept as int64" in data.public_meta["preprocessing"][0]


@pytest.mark.parametrize("algorithm, params", [("dp-sgd", {"batch_size": 50, "lr": 0.5})])
def test_fit_trains_an_embedding_model_on_token_ids(algorithm, params):
    model = BagOfEmbeddings()
    record = privopt.fit(
        model=model, dataset=_tokens(), algorithm=algorithm, epsilon=2.0, delta=1e-4, epochs=1, insecure_seed=0,
        **params,
    )  # fmt: skip
    assert record["status"] == "finished" and record["privacy"]["epsilon_spent"] <= 2.0
    assert model.seen == {torch.int64}  # training, the checks and evaluation all passed ids as integers
    assert torch.isfinite(model.embed.weight).all()


def test_negative_ids_are_refused_without_quoting_them():
    t = torch.zeros(20, 4, dtype=torch.int64)
    t[7, 2] = -12345
    with pytest.raises(DataError, match="train split has a negative integer feature.*x.float()") as err:
        Dataset.from_tensors(t, torch.zeros(20, dtype=torch.long), num_classes=2)
    assert "12345" not in str(err.value) and "7" not in str(err.value)


def test_an_id_beyond_the_embedding_table_fails_before_training_without_its_value():
    data = _tokens(vocab=30)
    data.x_train[123, 5] = 4321  # one record holds an id the model's table (30 rows) does not have
    with pytest.raises(ModelError, match="token ids beyond an embedding's table") as err:
        privopt.fit(model=BagOfEmbeddings(vocab=30), dataset=data, epsilon=2.0, delta=1e-4, epochs=1, batch_size=50)
    assert "4321" not in str(err.value) and "123" not in str(err.value)


def test_a_float_model_given_integer_features_gets_a_hint():
    data = _tokens()
    with pytest.raises(ModelError, match=r"torch.int64.*convert numeric ones with x.float\(\)"):
        privopt.fit(model=nn.Linear(8, 2), dataset=data, epsilon=2.0, delta=1e-4, epochs=1, batch_size=50)


def test_float_and_bool_features_still_become_float32():
    y = torch.zeros(10, dtype=torch.long)
    for x in (torch.rand(10, 3, dtype=torch.float64), torch.rand(10, 3) > 0.5, torch.rand(10, 3).half()):
        assert Dataset.from_tensors(x, y, num_classes=2).x_train.dtype == torch.float32
    bad = torch.rand(10, 3)
    bad[4, 1] = float("nan")
    with pytest.raises(DataError, match="NaN or infinite"):
        Dataset.from_tensors(bad, y, num_classes=2)


def test_feature_centering_of_token_ids_is_refused_before_any_output(tmp_path):
    from privopt.config import RunConfig
    from privopt.errors import ConfigError
    from privopt.training import train

    cfg = RunConfig.from_dict(
        {
            "algorithm": "dp-sgd",
            "algorithm_params": {"epochs": 1, "batch_size": 50, "lr": 0.5},
            "privacy": {"epsilon": 2.0, "delta": 1e-4},
            "feature_centering": {"norm_bound": 1.0, "noise_ratio": 3.0},
        }
    )
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="feature_centering needs floating features"):
        train(cfg, out_dir=out, progress=False, dataset=_tokens(), model=BagOfEmbeddings())
    assert not out.exists()
