"""What each entry point imports: heavy libraries load only where they are used."""

import json
import subprocess
import sys

import pytest

import privopt
import privopt.api
import privopt.privacy

HEAVY = ("matplotlib", "scipy", "dp_accounting", "sklearn", "opacus", "pandas", "torch")

# Each stage runs after the previous ones in one process: what it lists was loaded by then.
STAGES = """
import json, sys
heavy = {heavy!r}
def loaded():
    return sorted(h for h in heavy if h in sys.modules)
out = {{}}
import privopt
out["import privopt"] = loaded()
from privopt.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
out["privopt --help"] = loaded()
import privopt.privacy.events, privopt.privacy
out["import privopt.privacy"] = loaded()
import privopt.data, privopt.sampling
out["import privopt.data"] = loaded()
from privopt import fit, PrivacyEngine
out["from privopt import fit"] = loaded()
privopt.privacy.epsilon_of
out["privopt.privacy.epsilon_of"] = loaded()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def stages():
    code = STAGES.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_privopt_and_help_load_no_heavy_library(stages):
    assert stages["import privopt"] == []
    assert stages["privopt --help"] == []


def test_privacy_events_and_data_load_no_accounting_library(stages):
    """The sampling and data code need the privacy events, not dp_accounting and scipy (~1 s)."""
    assert stages["import privopt.privacy"] == []
    assert stages["import privopt.data"] == ["torch"]


def test_fit_loads_no_plotting_library_and_accounting_loads_on_use(stages):
    assert "matplotlib" not in stages["from privopt import fit"]
    assert {"dp_accounting", "scipy"} <= set(stages["privopt.privacy.epsilon_of"])


@pytest.mark.parametrize("module", [privopt, privopt.api, privopt.privacy], ids=lambda m: m.__name__)
def test_every_public_name_imports(module):
    for name in module.__all__:
        exec(f"from {module.__name__} import {name}", {})
    assert set(dir(module)) >= set(module.__all__)


def test_lazy_privacy_names_are_exactly_the_public_ones():
    assert set(privopt.privacy._LAZY) == set(privopt.privacy.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        privopt.privacy.nope  # noqa: B018
    from privopt.privacy import accountant  # a submodule is still importable by name

    assert privopt.privacy.epsilon_of is accountant.epsilon_of


RUNS = """
import json, sys
from privopt.cli import main
code = main(["runs", {root!r}, "--csv", {csv!r}, "--markdown", {md!r}])
print(json.dumps([code, sorted(h for h in {heavy!r} if h in sys.modules)]))
"""


def test_privopt_runs_reads_and_writes_its_tables_without_torch(tmp_path):
    """Listing runs reads JSON records: it loads no heavy library (torch alone costs ~1 s)."""
    run = tmp_path / "sweep" / "eps1"
    run.mkdir(parents=True)
    # running: its status now is looked up in the folder's lock (privopt.runlock), without torch too
    record = {"algorithm": "dp-sgd", "model": {"name": "mlp"}, "dataset": {"name": "digits"}, "status": "running"}
    (run / "record.json").write_text(json.dumps(record))
    csv, md = tmp_path / "t.csv", tmp_path / "t.md"
    code = RUNS.format(root=str(tmp_path / "sweep"), csv=str(csv), md=str(md), heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, []]
    assert csv.read_text().splitlines()[1].startswith("eps1,dp-sgd,mlp,digits")
    assert md.is_file()
