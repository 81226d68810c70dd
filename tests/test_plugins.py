"""Plugins (privopt.plugins): a config's ``plugins:`` and ``--plugin`` import the user's code before
any name is looked up, so ``privopt train``/``audit``/``list`` see what it registers."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from privopt import cli
from privopt.config import load_config
from privopt.errors import ConfigError
from privopt.experiments import Experiment
from privopt.plugins import FILE_MODULE_PREFIX
from privopt.registry import Registry
from privopt.training import train

REPO = Path(__file__).resolve().parents[1]


def _docs_algorithm(name: str) -> str:
    """The custom algorithm of docs/api.md ("Extending privopt"), registered as ``name``."""
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "normalized-dp-sgd-example" in b)
    return block.split("\n\nmine = ")[0].replace("normalized-dp-sgd-example", name) + "\n"


def _forget_plugins() -> None:
    """What a plugin file registered, and its module: as in a new process."""
    modules = [m for n, m in list(sys.modules.items()) if n.startswith("privopt") and m is not None]
    for reg in {id(v): v for m in modules for v in vars(m).values() if isinstance(v, Registry)}.values():
        for name, obj in list(reg._entries.items()):
            module = obj.module if isinstance(obj, Experiment) else getattr(obj, "__module__", "")
            if str(module).startswith((FILE_MODULE_PREFIX, "plugin_mod_")):
                del reg._entries[name]
    for name in [n for n in sys.modules if n.startswith((FILE_MODULE_PREFIX, "plugin_mod_"))]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def _fresh_registries():
    _forget_plugins()
    yield
    _forget_plugins()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """``conf/algo.py`` (the docs' algorithm, as ``algo-<test>``), ``conf/run.yaml`` naming it; cwd elsewhere."""
    name = "algo-" + re.sub(r"\W", "-", tmp_path.name.lower())
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "algo.py").write_text(_docs_algorithm(name))
    (tmp_path / "conf" / "run.yaml").write_text(
        f"plugins: [algo.py]\nalgorithm: {name}\nalgorithm_params: {{epochs: 1, batch_size: 256}}\n"
        "model: logreg\nplots: false\ncheckpoint_every: 1\n"
    )
    (tmp_path / "start").mkdir()
    monkeypatch.chdir(tmp_path / "start")
    return tmp_path, name


def _main(*argv) -> int:
    return cli.main([*argv])


def test_config_plugins_resolve_from_the_config_folder_and_the_record_states_them(project, capsys):
    root, name = project
    rc = _main("train", "--config", str(root / "conf" / "run.yaml"), "--out", "a", "--quiet")
    assert rc == 0, capsys.readouterr()
    text = (root / "start" / "a" / "record.json").read_text()
    record = json.loads(text)
    assert record["algorithm"] == name and record["config"]["plugins"] == ["algo.py"]
    assert record["status"] == "finished" and str(root) not in text  # no machine path in the record
    ckpt = torch.load(root / "start" / "a" / "checkpoint.pt", weights_only=False)
    assert ckpt["plugins"] == [str(root / "conf" / "algo.py")]  # the secret checkpoint keeps where it was


def test_cli_plugin_option_and_the_same_plugin_twice(project, capsys):
    _, name = project
    # From the current directory; with the config naming the same file, it is imported (and stated) once.
    argv = ["train", "--config", "../conf/run.yaml", "--plugin", "../conf/algo.py", "--quiet"]
    assert _main(*argv, "--out", "a") == 0, capsys.readouterr()
    assert json.loads(Path("a/record.json").read_text())["config"]["plugins"] == ["algo.py"]
    assert _main(*argv, "--out", "b") == 0, capsys.readouterr()  # a second run in this process: no "registered twice"
    # Only --plugin (no config file): stated as given, relative to the current directory.
    sets = [f"algorithm={name}", "model=logreg", "algorithm_params.epochs=1", "plots=false"]
    assert _main("train", "--plugin", "../conf/algo.py", *(f"--set={s}" for s in sets), "--out", "c", "--quiet") == 0
    assert json.loads(Path("c/record.json").read_text())["config"]["plugins"] == ["../conf/algo.py"]


def test_a_module_name_and_its_file_are_one_plugin(project, monkeypatch, capsys):
    root, name = project
    (root / "conf" / "plugin_mod_algo.py").write_text((root / "conf" / "algo.py").read_text())
    monkeypatch.syspath_prepend(str(root / "conf"))
    config = load_config(None, [f"algorithm={name}", "model=logreg", "plots=false"], plugins=["plugin_mod_algo"])
    assert config.plugins == ["plugin_mod_algo"]
    argv = ["train", "--plugin", "plugin_mod_algo", "--plugin", "../conf/plugin_mod_algo.py", "--out", "a"]
    rc = _main(*argv, "--set", f"algorithm={name}", "--set", "model=logreg", "--set", "plots=false", "--quiet")
    assert rc == 0, capsys.readouterr()


@pytest.mark.parametrize(
    "plugin, said",
    [
        ("missing.py", "relative to the folder of the config file"),
        ("nopkg_xyz_36.ext", "no module named 'nopkg_xyz_36'"),
        ("bad.py", "ValueError in "),
    ],
)
def test_a_plugin_that_cannot_be_imported_is_named_and_nothing_is_written(project, capsys, plugin, said):
    root, _ = project
    (root / "conf" / "bad.py").write_text('raise ValueError("secret record 42")\n')
    cfg = root / "conf" / "run.yaml"
    cfg.write_text(cfg.read_text().replace("plugins: [algo.py]", f"plugins: [{plugin}]"))
    assert _main("train", "--config", str(cfg), "--out", "a") == 2
    err = capsys.readouterr().err
    assert f"plugin {plugin!r}" in err and said in err and "secret" not in err, err
    assert not Path("a").exists()


def test_bad_plugins_values_are_refused(project, capsys):
    assert _main("train", "--set", "plugins=algo.py", "--out", "a") == 2
    assert "plugins must be a list" in capsys.readouterr().err
    assert _main("train", "--plugin", "not a module", "--out", "a") == 2
    assert "neither a module name" in capsys.readouterr().err and not Path("a").exists()


def test_resume_imports_the_same_plugin_and_checks_its_code(project, monkeypatch, capsys):
    root, _ = project
    cfg = load_config(root / "conf" / "run.yaml")
    assert train(cfg, out_dir="a", max_steps=2, progress=False)["status"] == "paused"
    assert train(cfg, out_dir="b", max_steps=2, progress=False)["status"] == "paused"
    (root / "elsewhere").mkdir()
    monkeypatch.chdir(root / "elsewhere")  # the checkpoint's absolute path, from any directory
    _forget_plugins()  # a new process: nothing registered
    assert _main("train", "--resume", "../start/a", "--quiet") == 0, capsys.readouterr()
    record = json.loads((root / "start" / "a" / "record.json").read_text())
    assert record["status"] == "finished" and record["config"]["plugins"] == ["algo.py"]
    # The plugin's algorithm changed: the resume refuses (it would replay the noise on other sums).
    algo = root / "conf" / "algo.py"
    algo.write_text(algo.read_text().replace("self.config.lr * g", "2 * self.config.lr * g"))
    _forget_plugins()
    assert _main("train", "--resume", "../start/b") == 2
    assert "differs from the one this run was trained with" in capsys.readouterr().err


def test_list_shows_a_plugins_registrations(project, capsys):
    _, name = project
    assert _main("list", "--plugin", "../conf/algo.py") == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if name in line)
    assert line.endswith("[plugin ../conf/algo.py]")
    assert _main("list", "--plugin", "../conf/algo.py", "--json") == 0  # imported once: nothing registered twice
    assert name in json.loads(capsys.readouterr().out)["algorithms"]


def test_audit_imports_the_configs_plugins(project, capsys):
    root, name = project
    argv = ["audit", "--config", str(root / "conf" / "run.yaml"), "--mode", "white-box", "--canaries", "50"]
    assert _main(*argv, "--out", "aud", "--quiet") in (0, 5), capsys.readouterr()
    report = json.loads(Path("aud/audit.json").read_text())
    assert report["config"]["algorithm"] == name and report["config"]["plugins"] == ["algo.py"]


MODELS = """
from torch import nn

from privopt.models.registry import register_model


@register_model("{name}")
def tiny_mlp(*, input_shape, num_classes, hidden=8):
    d = 1
    for s in input_shape:
        d *= s
    return nn.Sequential(nn.Flatten(), nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
"""


def test_predict_rebuilds_a_plugins_model(project, capsys):
    import numpy as np

    from privopt.data import load_dataset

    root, _ = project
    Path("models.py").write_text(MODELS.format(name="net-" + root.name.lower()))
    sets = [f"model=net-{root.name.lower()}", "algorithm_params.epochs=1", "plots=false"]
    assert _main("train", "--plugin", "models.py", *(f"--set={s}" for s in sets), "--out", "a", "--quiet") == 0
    np.save("x.npy", load_dataset("digits", seed=0).x_test[:5].numpy())
    _forget_plugins()
    argv = ["predict", "--run", "a", "--input", "x.npy", "--quiet"]
    assert _main(*argv, "--out", "p.csv") == 2
    assert "unknown model" in (err := capsys.readouterr().err) and "plugins ['models.py']" in err, err
    assert _main(*argv, "--plugin", "models.py", "--out", "p.csv") == 0, capsys.readouterr()
    assert len(Path("p.csv").read_text().splitlines()) == 6  # a header and one row per record


@pytest.mark.slow
def test_every_torchrun_process_imports_the_configs_plugins(tmp_path):
    import subprocess

    import yaml

    from _run_helpers import torchrun

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "models.py").write_text(MODELS.format(name="tiny-mlp-plugin"))
    params = {"clients": 2, "epochs": 1, "b1": 64, "b2": 16, "lr": 0.2, "max_steps": 4, "kappa": 0.05, "chi": "auto"}
    cfg = {"plugins": ["models.py"], "algorithm": "gauss-psgd", "algorithm_params": params, "model": "tiny-mlp-plugin",
           "engine": "vmap", "privacy": {"epsilon": 2.0, "delta": 1e-5}, "plots": False}  # fmt: skip
    (tmp_path / "conf" / "run.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [torchrun(), "--standalone", "--nproc_per_node=2", "-m", "privopt", "train",
           "--config", "conf/run.yaml", "--out", "out", "--quiet"]  # fmt: skip
    import os

    import privopt

    env = dict(os.environ, PYTHONPATH=str(Path(privopt.__file__).resolve().parents[1]))  # this privopt, from tmp_path
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "record.json").read_text())
    assert record["status"] == "finished" and record["config"]["plugins"] == ["models.py"]


def _tiny_dro_budget(monkeypatch) -> None:
    """The quick DRO budget cut to one grid point and half an epoch (the workers get it with each run)."""
    from privopt.experiments.dro_protocol import BUDGETS, Budget

    cut = {"epochs": 0.5, "tune_epochs": 0.25, "eval_points": 2, "lrs": (0.1,), "clips": (1.0,)}
    monkeypatch.setitem(BUDGETS, "quick", Budget(**{**BUDGETS["quick"].__dict__, **cut}))


def test_reproduce_imports_its_plugins_first_and_in_every_worker(project, monkeypatch, capsys):
    """`reproduce [--plugin] dro-mia --plugin`: --methods and --model name what the plugins register; the --jobs 2
    workers (which look the names up before a run trains) import them too; every run's record and the
    summary state them as given."""
    root, name = project
    _tiny_dro_budget(monkeypatch)
    model = "net-" + root.name.lower()
    Path("models.py").write_text(MODELS.format(name=model))
    argv = ["dro-mia", "--dataset", "digits-st", "--methods", f"{name},dp-sgd", "--model", model,
            "--epsilons", "1", "--seeds", "1", "--insecure-seed", "3", "--quiet"]  # fmt: skip
    assert _main("reproduce", *argv, "--out", "r") == 2 and "unknown model" in capsys.readouterr().err
    plugins = ["../conf/algo.py", "models.py"]
    # One given to `reproduce`, one to dro-mia, the first again (spelt otherwise): each imported and stated once.
    again = ["--plugin", "../start/../conf/algo.py", "--plugin", plugins[1]]
    rc = _main("reproduce", "--plugin", plugins[0], *argv, *again, "--jobs", "2", "--out", "r")
    assert rc == 0, capsys.readouterr()
    records = {
        str(p.parent.relative_to("r/runs")): json.loads(p.read_text()) for p in Path("r/runs").rglob("record.json")
    }
    assert {(where.split("/")[0], r["algorithm"]) for where, r in records.items()} == {
        (stage, m) for stage in ("tune", "final") for m in (name, "dp-sgd")
    }, sorted(records)
    assert all(r["status"] == "finished" and r["config"]["model"] == model for r in records.values())
    assert all(r["config"]["plugins"] == plugins for r in records.values())
    assert json.loads(Path("r/summary.json").read_text())["plugins"] == plugins
    assert "plugins `../conf/algo.py`, `models.py` were imported" in Path("r/table2.md").read_text()


@pytest.mark.parametrize("command", ["dro-table3", "dro-mia"])
@pytest.mark.parametrize("plugin, said", [("missing.py", "does not exist"), ("bad.py", "ValueError in ")])
def test_reproduce_with_a_plugin_that_cannot_be_imported_writes_nothing(project, capsys, command, plugin, said):
    Path("bad.py").write_text('raise ValueError("secret record 42")\n')
    assert _main("reproduce", command, "--dataset", "digits-st", "--plugin", plugin, "--out", "r") == 2
    err = capsys.readouterr().err
    assert f"plugin {plugin!r}" in err and said in err and "secret" not in err and len(err.splitlines()) == 1, err
    assert not Path("r").exists()


def test_reproduce_api_plugins_are_a_list(project):
    from privopt.experiments.dro import run_dro_table3

    with pytest.raises(ConfigError, match="plugins must be a list"):
        run_dro_table3(dataset="digits-st", plugins="../conf/algo.py", out_dir="r")
    assert not Path("r").exists()


def test_a_worker_imports_the_plugins_before_its_first_call_and_names_one_it_cannot_import(project):
    from jobs_helpers import echo_or_fail
    from privopt.experiments.jobs import Call, run_ordered

    # Imported in this process (the test's), but not in a spawned worker: the call's error names it.
    Path("here.py").write_text(
        "import multiprocessing\n\nif multiprocessing.parent_process() is not None:\n"
        "    raise RuntimeError('secret record 7')\n"
    )
    calls = [Call(args=(1,)), Call(args=(2,))]
    assert list(run_ordered(echo_or_fail, calls, jobs=1, plugins=["here.py"])) == [1, 2]
    with pytest.raises(ConfigError, match=r"plugin '.*here\.py' failed while it was imported: RuntimeError") as e:
        list(run_ordered(echo_or_fail, calls, jobs=2, plugins=["here.py"]))
    assert "secret" not in str(e.value)


EXPERIMENT = """import json
from pathlib import Path

from privopt.experiments import register_experiment


def add_arguments(parser):
    parser.add_argument("--scale", type=float, default=1.0, help="a number (default 1)")
    parser.add_argument("--out", required=True, help="output directory (new)")


def main(args):
    Path(args.out).mkdir(parents=True)
    (Path(args.out) / "summary.json").write_text(json.dumps({{"scale": args.scale, "plugins": args.plugin}}))
    return 0


register_experiment({name!r}, __name__, "my own reproduction")
"""


def test_reproduce_runs_an_experiment_a_plugin_registers(project, capsys):
    """`privopt reproduce --plugin exp.py NAME`: the plugin is imported before the name is looked up; the
    experiment gets the plugins as args.plugin; `privopt list --plugin` shows it."""
    name = "exp-" + project[0].name.lower()
    Path("exp.py").write_text(EXPERIMENT.format(name=name))
    with pytest.raises(SystemExit) as e:  # the list of experiments in the help shows it
        _main("reproduce", "--plugin", "exp.py", "--help")
    shown = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and f"{name} my own reproduction [plugin exp.py]" in shown
    _forget_plugins()
    assert _main("list", "--plugin", "exp.py") == 0
    assert any(line.split() == [name, "my", "own", "reproduction", "[plugin", "exp.py]"]
               for line in capsys.readouterr().out.splitlines())  # fmt: skip
    _forget_plugins()
    assert _main("reproduce", "--plugin", "exp.py", "--plugin=./exp.py", name, "--scale", "2", "--out", "r") == 0
    assert json.loads(Path("r/summary.json").read_text()) == {"scale": 2.0, "plugins": ["exp.py"]}


@pytest.mark.parametrize("before", [[], ["--plugin=exp.py"]])
def test_an_unknown_experiment_names_the_available_ones_and_the_plugin_option(project, capsys, before):
    """Unknown without its plugin, or with the plugin after the name (there it is the experiment's option)."""
    name = "exp-" + project[0].name.lower()
    Path("exp.py").write_text(EXPERIMENT.format(name=name))
    with pytest.raises(SystemExit) as e:
        _main("reproduce", *before, name + "x", "--plugin", "exp.py", "--out", "r")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"unknown experiment '{name}x'" in err and "dro-table3, " in err
    assert "privopt reproduce --plugin MODULE_OR_FILE NAME" in err and not Path("r").exists()
    assert ("did you mean" in err) is bool(before)


@pytest.mark.parametrize(
    "plugin, said",
    [
        ("missing.py", "file .*missing.py \\(from the current directory\\) does not exist"),
        ("bad.py", "plugin 'bad.py' failed while it was imported: ValueError in "),
        ("nomain.py", "experiment 'broken': its module .*nomain.py has no main\\(\\)"),
        ("nomodule.py", "experiment 'broken': no module named 'plugin_mod_not_there'"),
    ],
)
def test_reproduce_with_a_broken_plugin_stops_with_one_line_and_writes_nothing(project, capsys, plugin, said):
    Path("bad.py").write_text('raise ValueError("secret record 42")\n')
    Path("nomain.py").write_text(EXPERIMENT.format(name="broken").replace("def main(", "def run("))
    # a plugin_mod_ module name: the registration is forgotten after the test
    Path("nomodule.py").write_text(EXPERIMENT.format(name="broken").replace("__name__", "'plugin_mod_not_there'"))
    assert _main("reproduce", "--plugin", plugin, "broken", "--out", "r") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and re.search(said, err) and "secret" not in err, err
    assert not Path("r").exists()
