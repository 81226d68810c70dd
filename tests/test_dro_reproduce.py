"""Paper A reproduction harness (dro-table3 / dro-mia): outputs, tuning report, metrics, MIA cap."""

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from privopt.cli import main as cli_main
from privopt.errors import ConfigError
from privopt.eval.dro_metrics import class_matched_indices
from privopt.experiments.dro import (
    BUDGETS,
    PAPER_TABLE3,
    Budget,
    format_table,
    method_params,
    run_dro_table3,
)
from privopt.experiments.privacy_notes import TRAINING_MEASUREMENTS, TUNED_ON_TRAINING

TINY = Budget(
    **{
        **BUDGETS["quick"].__dict__,
        "epochs": 1,
        "tune_epochs": 0.5,
        "eval_points": 2,
        "lrs": (0.1, 0.3),
        "clips": (1.0,),
        "refresh": 256,
        "q": 4,
        "tune_at": 2.0,
    }
)
FIELDS = {
    "dataset",
    "method",
    "epsilon",
    "delta",
    "epsilon_spent",
    "seed",
    "test_accuracy",
    "test_auc",
    "test_f1",
    "grad_norm",
    "mia_auc",
    "mia_bound",
    "wall_s",
}


@pytest.fixture(scope="module")
def table3(tmp_path_factory):
    out = tmp_path_factory.mktemp("t3") / "out"
    res = run_dro_table3(
        dataset="digits-st",
        epsilons=[2.0],
        seeds=1,
        budget=TINY,
        methods=["dp-sgd", "dp-sgda", "dp-recursive-spider"],
        out_dir=out,
        log=lambda s: None,
    )
    return out, res


def test_outputs_written(table3):
    out, _ = table3
    lines = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    # 3 private methods x 1 epsilon x 1 seed + the non-private reference
    assert len(lines) == 4
    assert {r["method"] for r in lines} == {"dp-sgd", "dp-sgda", "dp-recursive-spider", "scdro"}
    for r in lines:
        assert set(r) >= FIELDS
        assert 0.0 <= r["test_accuracy"] <= 1.0 and r["grad_norm"] > 0
        if r["private"]:
            n = r["n_train"]
            assert r["delta"] == pytest.approx(n**-1.1)
            assert 0 < r["epsilon_spent"] <= r["epsilon"] * (1 + 1e-6)
    md = (out / "table3.md").read_text()
    assert "| ε = 2 |" in md and "DP Recursive-SPIDER" in md and "non-private" in md
    assert (
        "DRO weight cap A (a record's weighted term is at most A·clip): 1.25 at ε ≤ 1; above, tuned from "
        "{1.25, 2} with the lr (2 for runs with given settings)." in md
    )
    # the hyper-parameters of every final run are in the report, the tuned cap of each DRO method with them
    for r in lines:
        cap = f", A {r['weight_cap']:g}" if r["private"] and r.get("weight_cap") is not None else ""
        assert f"lr {r['lr']:g}, clip {r['clip']:g}{cap}" in md
    # the SPIDER method against DP-SGD, one seed each: a difference, no interval
    rs, sgd = ({r["method"]: r for r in lines}[m] for m in ("dp-recursive-spider", "dp-sgd"))
    diff = 100 * (rs["test_balanced_accuracy"] - sgd["test_balanced_accuracy"])
    assert "## Against DP-SGD" in md and f"| 2 | balanced | DP Recursive-SPIDER | {diff:+.2f} | – | 1 / 1 |" in md
    compared = json.loads((out / "summary.json").read_text())["baseline_comparison"]
    assert [(c["epsilon"], c["metric"], c["method"]) for c in compared] == [
        (2.0, "balanced", "dp-recursive-spider"),
        (2.0, "worst class", "dp-recursive-spider"),
    ]
    for fig in ("fig1_gradnorm_eps2.png", "fig2_auc_eps2.png", "fig3_f1_eps2.png"):
        assert (out / fig).stat().st_size > 1000


def test_tuning_same_grid_for_every_method(table3):
    out, _ = table3
    tuning = json.loads((out / "tuning.json").read_text())
    per_method = {}
    for t in tuning["trials"]:
        per_method.setdefault(t["method"], []).append((t["lr"], t["clip"], t.get("weight_cap")))
    # private DRO methods: the full lr x clip x weight-cap grid; non-private: the lr axis only (no clip, no cap)
    grid = [(lr, 1.0, a) for lr in (0.1, 0.3) for a in (1.25, 2.0)]
    assert per_method["dp-sgda"] == per_method["dp-recursive-spider"] == grid
    assert per_method["dp-sgd"] == [(lr, 1.0, None) for lr in (0.1, 0.3)]  # no weight cap to tune
    assert per_method["scdro"] == [(lr, 1.0, None) for lr in BUDGETS["quick"].lrs_for("scdro")]
    assert tuning["n_trials"] == sum(len(v) for v in per_method.values()) and tuning["wall_s"] > 0
    assert tuning["grid"] == {"lr": [0.1, 0.3], "clip": [1.0], "weight_cap": [1.25, 2.0]}
    # each final run uses the cap its method won at the tuned ε (tune_at = 2), and says so
    best = {b["method"]: b for b in tuning["best"]}
    rows = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    for r in rows:
        if r["private"]:
            won = best[r["method"]]
            assert (r["lr"], r.get("weight_cap")) == (won["lr"], won.get("weight_cap"))


def test_every_output_says_the_tuning_and_the_training_measurements_are_not_covered(table3):
    """The final runs' hyper-parameters were tuned on records of their training data and the tables
    carry unnoised training-set measurements: every output that depends on them says so."""
    out, _ = table3
    rows = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["hyperparameter_tuning"] == TUNED_ON_TRAINING for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hyperparameter_tuning"] == TUNED_ON_TRAINING and summary["not_private"] == TRAINING_MEASUREMENTS
    md = (out / "table3.md").read_text()
    assert f"**Not accounted:** hyper-parameters {TUNED_ON_TRAINING}." in md
    assert f"**Not private:** {TRAINING_MEASUREMENTS}." in md
    for r in rows:
        rec = json.loads((Path(r["run_dir"]) / "record.json").read_text())
        expected = {"hyperparameter_tuning": TUNED_ON_TRAINING} if r["private"] else None
        assert rec["privacy"].get("not_accounted") == expected


def test_cap_is_tuned_only_where_no_rule_fixes_it():
    from privopt.experiments.dro_runner import _tuning_plan

    budget = replace(TINY, tune_at="each")  # the quick budget's rule: A = 1.25 at ε ≤ 1
    plan = _tuning_plan(["dp-double-spider", "dp-sgd"], budget, [0.5, 1.0, 2.0])
    caps = {
        (m, e): sorted({hp.get("weight_cap") for _m, _e, _k, hp, _r in plan if (_m, _e) == (m, e)}, key=str)
        for m, e, *_ in plan
    }
    assert caps[("dp-double-spider", 0.5)] == caps[("dp-double-spider", 1.0)] == [None]  # the rule's cap
    assert caps[("dp-double-spider", 2.0)] == [1.25, 2.0]
    assert all(caps[("dp-sgd", e)] == [None] for e in (0.5, 1.0, 2.0))
    assert sum(1 for m, e, *_ in plan if (m, e) == ("dp-double-spider", 2.0)) == 4  # 2 lrs x 2 caps
    assert budget.at_epsilon(1.0).weight_cap == 1.25 and budget.at_epsilon(2.0).weight_cap == 2.0


def test_every_dp_run_within_mia_cap(table3):
    _, res = table3
    dp = [r for r in res["rows"] if r["private"]]
    assert dp and not res["mia_violations"]
    for r in dp:
        assert r["mia_bound"] == pytest.approx(1 / (1 + math.exp(-r["epsilon_spent"])) + r["delta"])
        assert r["mia_auc"] <= r["mia_bound"] + r["mia_slack"]


def test_class_matched_mia_sets_have_training_label_mix():
    ym = torch.tensor([0] * 900 + [1] * 100)
    yn = torch.tensor([0] * 300 + [1] * 300)
    a, b = class_matched_indices(ym, yn, num_classes=2, seed=3)
    assert len(a) == len(b) == 333  # limited by the 300 non-member negatives at a 0.9 share
    assert int((ym[a] == 1).sum()) == int((yn[b] == 1).sum()) == 33
    assert len(set(a.tolist())) == len(a) and len(set(b.tolist())) == len(b)


def test_method_params_treats_methods_alike():
    b = BUDGETS["quick"]
    ds = method_params("dp-double-spider", budget=b, lr=0.2, clip=0.5, epochs=3)
    rs = method_params("dp-recursive-spider", budget=b, lr=0.2, clip=0.5, epochs=3)
    assert ds["lr"] == rs["lr"] == 0.2 and ds["epochs"] == rs["epochs"] == 3
    assert ds["clip_x"] == rs["clip_v"] == 0.5  # the gradient clips; the scalar queries keep "auto"
    assert "clip_eta" not in ds and "clip_u" not in rs and "clip_s" not in rs
    assert ds["weight_cap"] == rs["weight_cap"] == b.weight_cap and ds["gamma_x"] == rs["gamma_v"] == b.gamma
    assert ds["N1"] == rs["b1"] == b.refresh and ds["N2"] == rs["b2"] == b.batch_size
    assert ds["output"] == rs["output"] == "last" and ds["lam"] == b.ds_lam
    assert rs["rho"] == 0.5 and rs["lam0"] == 1e-3
    with pytest.raises(ConfigError, match="no-such"):
        method_params("no-such", budget=b, lr=0.1, clip=1.0, epochs=1)


def test_format_table_mean_std_and_paper_numbers():
    rows = [{"method": "dp-sgda", "epsilon": 0.5, "private": True, "test_accuracy": a} for a in (0.80, 0.90)]
    rows.append({"method": "scdro", "epsilon": None, "private": False, "test_accuracy": 0.95})
    t = format_table(rows, methods=["dp-sgda"])
    # one run shows its value alone (no "± 0.00")
    assert "| ε = 0.5 | 85.00 ± 7.07 |" in t and "| non-private (SCDRO) | 95.00 |" in t
    assert PAPER_TABLE3["mnist-st"][0.5]["dp-recursive-spider"] == 99.66


def test_cli_dro_mia_and_errors(tmp_path, capsys):
    out = tmp_path / "mia"
    rc = cli_main(
        [
            "reproduce",
            "dro-mia",
            "--dataset",
            "digits-st",
            "--epsilons",
            "0.5",
            "--seeds",
            "1",
            "--methods",
            "dp-sgda",
            "--no-tune",
            "--insecure-seed",
            "5",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    (record,) = out.glob("runs/final/*/*/seed0/record.json")
    assert json.loads(record.read_text())["config"]["insecure_seed"] == 5  # recorded as such
    assert "INSECURE" in (out / "table2.md").read_text()
    rows = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["mia_auc"] is not None and rows[0]["mia_within_bound"] is True
    assert "DP cap" in (out / "table2.md").read_text()
    # a second run into the same folder is refused; dro-table3 needs --dataset
    assert cli_main(["reproduce", "dro-mia", "--dataset", "digits-st", "--out", str(out), "--quiet"]) == 2
    assert cli_main(["reproduce", "dro-table3", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "--dataset" in capsys.readouterr().err


def test_an_insecure_seed_makes_a_reproduction_repeatable_and_secret_is_the_default(tmp_path):
    tiny = Budget(**{**TINY.__dict__, "epochs": 0.5})
    hp = {"dp-sgd": {"lr": 0.5, "clip": 1.0}}
    kw = dict(dataset="digits-st", epsilons=[1.0], seeds=2, budget=tiny, methods=["dp-sgd"], nonprivate=False)
    kw.update(tune=False, hyperparameters=hp, log=lambda s: None)
    runs = [run_dro_table3(out_dir=tmp_path / f"r{i}", insecure_seed=7, **kw)["rows"] for i in range(2)]
    accs = [[r["test_accuracy"] for r in rows] for rows in runs]
    assert accs[0] == accs[1]
    secret = run_dro_table3(out_dir=tmp_path / "secret", **kw)
    assert secret["summary"]["insecure_seed"] is None and "secret" in secret["summary"]["randomness"]
    (record,) = (tmp_path / "secret").glob("runs/final/*/*/seed1/record.json")
    assert json.loads(record.read_text())["config"]["insecure_seed"] is None


def test_a_budget_with_features_trains_its_feature_model_on_them():
    from privopt.data import Dataset
    from privopt.data.features import apply_features
    from privopt.experiments.dro_runner import _model_for

    images = Dataset.from_tensors(torch.rand(6, 1, 8, 8), torch.tensor([0, 1] * 3), num_classes=2)
    feats = apply_features(images, "scattering", J=1, cache=False)
    quick = BUDGETS["quick"]
    assert quick.features == "scattering" and quick.feature_model == "logreg"
    assert _model_for(None, quick, feats) == ("logreg", None, {})
    assert _model_for(None, quick, images)[0] == quick.image_model  # raw images keep the image model
    assert _model_for("mlp", quick, feats)[0] == "mlp"  # an explicit --model wins


def test_budget_batches_fit_small_datasets():
    quick = BUDGETS["quick"]
    assert quick.fitted(10**6) == quick  # large data: the budget's own batches
    small = quick.fitted(807)  # cifar10-st: a batch of 1024 would exceed the data
    assert small.batch_size == small.refresh == 201 and small.epochs == quick.epochs


def test_tune_at_and_repeats_options_set_the_budgets_tuning(tmp_path, monkeypatch, capsys):
    import privopt.experiments.dro as dro_cli

    seen = []

    def fake_table3(**kwargs):
        seen.append(kwargs["budget"])
        return {"summary": {}, "markdown": "", "out_dir": str(tmp_path), "mia_violations": []}

    monkeypatch.setattr(dro_cli, "run_dro_table3", fake_table3)
    base = ["reproduce", "dro-table3", "--dataset", "digits-st", "--quiet"]
    assert cli_main([*base, "--out", str(tmp_path / "a"), "--tune-at", "each"]) == 0
    assert cli_main([*base, "--out", str(tmp_path / "b"), "--tune-at", "5"]) == 0
    assert cli_main([*base, "--out", str(tmp_path / "c")]) == 0
    each, five, default = seen
    assert (each.tune_at, five.tune_at, default) == ("each", 5.0, "quick")
    assert each.name == "quick, tuned at each" and five.name == "quick, tuned at ε = 5"
    assert each.lrs == BUDGETS["quick"].lrs and each.weight_caps == BUDGETS["quick"].weight_caps
    for bad in ("0", "-1", "nan", "sometimes"):
        with pytest.raises(SystemExit):
            cli_main([*base, "--out", str(tmp_path / "d"), "--tune-at", bad])
        assert "--tune-at" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything was written
    assert cli_main([*base, "--out", str(tmp_path / "e"), "--tune-repeats", "3", "--tune-at", "1"]) == 0
    assert (seen[-1].tune_repeats, seen[-1].tune_at) == (3, 1.0)
    assert seen[-1].name == "quick, tuned at ε = 1, 3 run(s) per grid point"
    for bad in ("0", "-2", "1.5", "many"):
        with pytest.raises(SystemExit):
            cli_main([*base, "--out", str(tmp_path / "f"), "--tune-repeats", bad])
        assert "--tune-repeats" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_tuning_scores_a_grid_point_by_the_mean_of_its_repeats(tmp_path):
    from dataclasses import replace

    from privopt.data import load_dataset
    from privopt.experiments.dro_runner import RunSpec, _best_point, tune

    hp = [{"lr": 1.0}, {"lr": 2.0}, {"lr": 3.0}]
    # point 0 has the best single run, point 1 the best mean; one diverged run sinks point 2
    assert _best_point({0: (hp[0], [0.9, 0.5]), 1: (hp[1], [0.7, 0.71]), 2: (hp[2], [0.99, -math.inf])}) == hp[1]
    assert _best_point({0: (hp[0], [0.6]), 1: (hp[1], [0.6])}) == hp[0]  # a tie: the earlier point

    budget = replace(TINY, tune_repeats=2, tune_at="each", weight_cap_grid=())
    data = load_dataset("digits-st", seed=0, val_fraction=0.2)
    best, report = tune(
        ["dp-sgd"], RunSpec("digits-st", budget, insecure_seed=0), data=data, epsilons=[2.0], out=tmp_path,
        log=lambda s: None,
    )  # fmt: skip
    trials = report["trials"]
    assert [(t["lr"], t["repeat"]) for t in trials] == [(0.1, 0), (0.1, 1), (0.3, 0), (0.3, 1)]
    assert report["tune_repeats"] == 2 and report["n_trials"] == 4
    mean = {lr: statistics.fmean(t["val_balanced_accuracy"] for t in trials if t["lr"] == lr) for lr in (0.1, 0.3)}
    assert best[("dp-sgd", 2.0)]["lr"] == max(mean, key=lambda lr: (mean[lr], -lr))
    assert (tmp_path / "runs/tune/dp-sgd/eps2.0/trial0-repeat1/record.json").exists()
    with pytest.raises(ConfigError, match="tune_repeats"):
        run_dro_table3(dataset="digits-st", epsilons=[1], budget=replace(TINY, tune_repeats=0), out_dir=tmp_path / "x")
