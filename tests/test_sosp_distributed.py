"""The same run on m = 2 clients gives the same model under torchrun (one process per client, gloo)
and in the single-process simulator, for the same (insecure) seed."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

import privopt
from _run_helpers import torchrun
from privopt.config import RunConfig
from privopt.errors import ConfigError
from privopt.training import train

CASES = {
    # local noise, Gauss-PSGD with its escape logic (chi 'auto' triggers attempts)
    "gauss-psgd-local": {"algorithm": "gauss-psgd", "algorithm_params": {"kappa": 0.05, "chi": "auto"}},
    # central noise; the baseline's extra perturbation is drawn by the server and broadcast
    "baseline-central": {"algorithm": "dp-spider-sosp", "algorithm_params": {"trust": "central", "chi": 1.0}},
}


def _config(case: str) -> dict:
    spec = CASES[case]
    params = {"clients": 2, "epochs": 1, "b1": 64, "b2": 16, "lr": 0.2, "max_steps": 8, **spec["algorithm_params"]}
    return {
        "algorithm": spec["algorithm"],
        "algorithm_params": params,
        "dataset": "digits",
        "model": "mlp",
        "model_params": {"hidden": 16},
        "engine": "vmap",
        "privacy": {"epsilon": 2.0, "delta": 1e-5},
        "insecure_seed": 3,
        "plots": False,
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_torchrun_and_the_simulator_give_the_same_model(case, tmp_path):
    cfg = _config(case)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [torchrun(), "--standalone", "--nproc_per_node=2", "-m", "privopt", "train",
           "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "torchrun"), "--quiet"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    simulated = train(RunConfig.from_dict(cfg), out_dir=tmp_path / "simulated", progress=False)
    a = torch.load(tmp_path / "torchrun" / "model.pt")
    b = torch.load(tmp_path / "simulated" / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    record = json.loads((tmp_path / "torchrun" / "record.json").read_text())
    assert record["privacy"]["epsilon_spent"] == simulated["privacy"]["epsilon_spent"] <= 2.0
    assert record["history"] == simulated["history"]  # every logged value, evaluation and ε alike
    assert not (tmp_path / "torchrun" / "checkpoint.pt").exists()  # one process's secrets only: none written
    # ...and the record does not claim one, says how it was launched, and a resume says why it cannot
    assert record["files"]["checkpoint"] is None and simulated["files"]["checkpoint"].startswith("checkpoint.pt")
    assert record["launch"] == {"launcher": "torchrun", "processes": 2, "resumable": False}
    assert "launch" not in simulated
    with pytest.raises(ConfigError, match="launched by torchrun .* cannot be resumed"):
        train(None, out_dir=tmp_path / "torchrun", resume=True)
    with pytest.raises(ConfigError, match=r"already holds a run \(record.json\); choose another output directory$"):
        train(RunConfig.from_dict(cfg), out_dir=tmp_path / "torchrun", progress=False)


def test_a_run_launched_with_the_wrong_number_of_processes_is_refused(monkeypatch, tmp_path):
    from privopt.distributed import LocalComm
    from privopt.training import build_run

    comm = LocalComm()
    comm.world_size = 3  # as if torchrun had started 3 processes for a 2-client run
    with pytest.raises(ConfigError, match="nproc_per_node=2"):
        build_run(RunConfig.from_dict(_config("gauss-psgd-local")), comm=comm)


def test_an_algorithm_without_clients_is_refused_under_torchrun(tmp_path):
    from privopt.distributed import LocalComm
    from privopt.training import build_run

    comm = LocalComm()
    comm.world_size = 2  # torchrun --nproc_per_node=2 on DP-SGD: two independent runs, rank 1's thrown away
    cfg = {"algorithm": "dp-sgd", "algorithm_params": {"epochs": 1}, "dataset": "digits", "model": "logreg",
           "privacy": {"epsilon": 1.0, "delta": 1e-5}}  # fmt: skip
    with pytest.raises(ConfigError, match="'dp-sgd' has no clients: torchrun with 2 processes"):
        build_run(RunConfig.from_dict(cfg), comm=comm)
    build_run(RunConfig.from_dict(cfg), comm=None)  # one process: fine


@pytest.mark.slow
def test_ranks_given_different_configs_are_refused_before_anything_is_written(tmp_path):
    # rank 1 is given another ε: it would noise its messages for ε = 8 under a record saying ε = 2
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(_config("gauss-psgd-local")))
    launcher = tmp_path / "launch.py"
    launcher.write_text(
        "import os, sys\nfrom privopt.cli import main\n"
        "extra = ['--set', 'privacy.epsilon=8'] if os.environ['RANK'] == '1' else []\n"
        "sys.exit(main(sys.argv[1:] + extra))\n"
    )
    cmd = [torchrun(), "--standalone", "--nproc_per_node=2", str(launcher), "train",
           "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run"), "--quiet"]  # fmt: skip
    src = str(Path(privopt.__file__).resolve().parents[1])  # this checkout's privopt in every rank
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("privopt: ")]
    assert lines and all("were given different configs: rank(s) 1 differ from rank 0" in ln for ln in lines), lines
    assert not (tmp_path / "run").exists()  # refused before rank 0 wrote a record


@pytest.mark.parametrize(("device", "backend"), [("cpu", "gloo"), ("cuda", "nccl")])
def test_the_backend_follows_the_run_s_device_not_the_machine(monkeypatch, device, backend):
    # a CPU run on a machine with a GPU: NCCL cannot sum the CPU tensors the clients send
    import torch.distributed as dist

    from privopt.distributed import torchrun_comm

    chosen = []

    def init(*, backend, timeout):
        chosen.append(backend)
        raise RuntimeError("stop here")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init)
    with pytest.raises(RuntimeError, match="stop here"):
        torchrun_comm(device=device)
    assert chosen == [backend]


def test_an_interrupted_torchrun_run_does_not_say_to_resume_it(tmp_path):
    # Ctrl-C on torchrun: rank 0 said "resume with: privopt train --resume OUT", which cannot work (no checkpoint)
    import os
    import signal
    import threading

    from privopt.training import build_run
    from privopt.training.run import RunInterrupted, _Session

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    cfg = dict(
        _config("gauss-psgd-local"), algorithm_params={**_config("gauss-psgd-local")["algorithm_params"], "clients": 1}
    )
    for checkpoints, expected in ((False, "launched by torchrun writes no checkpoint and cannot be resumed"),
                                  (True, "resume with: privopt train --resume")):  # fmt: skip
        run = build_run(RunConfig.from_dict(cfg))
        step = run.algo.step

        def interrupted(*a, step=step, **k):
            os.kill(os.getpid(), signal.SIGINT)  # as torchrun forwards a Ctrl-C
            return step(*a, **k)

        run.algo.step = interrupted
        session = _Session(run, tmp_path / str(checkpoints), checkpoints=checkpoints)
        with pytest.raises(RunInterrupted, match=expected):
            session.execute(fresh=True, progress=False, max_steps=None)
