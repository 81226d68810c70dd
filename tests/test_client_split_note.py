"""A federated run's record says what its ε is about: a record of a client's shard with the
federation as given. The shards are cut from the whole training split (the label-sorted split
reads the labels), so adding or removing one record can move others between clients; the split
itself is not covered (docs/algorithms/sosp.md, "Distributed runs")."""

import pytest

from _run_helpers import read_record
from privopt.config import RunConfig
from privopt.training import train


def _run(tmp_path, clients: int, trust: str = "local") -> dict:
    params = {
        "clients": clients,
        "trust": trust,
        "epochs": 1,
        "b1": 64,
        "b2": 16,
        "lr": 0.2,
        "max_steps": 4,
        "kappa": 0.05,
    }
    cfg = {"algorithm": "gauss-psgd", "algorithm_params": params, "dataset": "digits", "model": "mlp",
           "model_params": {"hidden": 8}, "engine": "vmap", "privacy": {"epsilon": 2.0, "delta": 1e-5},
           "insecure_seed": 3, "plots": False}  # fmt: skip
    train(RunConfig.from_dict(cfg), out_dir=tmp_path / f"m{clients}{trust}", progress=False)
    return read_record(tmp_path / f"m{clients}{trust}")["privacy"].get("not_accounted", {})


@pytest.mark.parametrize("clients", [1, 2])
def test_the_record_of_a_federated_run_names_the_client_split(tmp_path, clients):
    not_accounted = _run(tmp_path, clients)
    if clients == 1:
        assert "client_split" not in not_accounted
    else:
        note = not_accounted["client_split"]
        assert "2 client shards" in note and "'label'" in note and "federation as given" in note


@pytest.mark.parametrize(("clients", "trust"), [(2, "central"), (2, "local"), (1, "central")])
def test_the_record_of_a_run_with_central_noise_says_whom_it_trusts(tmp_path, clients, trust):
    # the clients' clipped sums reach the aggregator without noise: its ε is not against the aggregator
    note = _run(tmp_path, clients, trust).get("trust")
    if (clients, trust) != (2, "central"):
        assert note is None
    else:
        assert "without noise" in note and "not against the aggregator" in note and "torchrun" in note
