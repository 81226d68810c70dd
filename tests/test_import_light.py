"""What each entry point imports: heavy libraries load only where they are used."""

import json
import subprocess
import sys

import pytest

import privopt
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


@pytest.mark.parametrize("module", [privopt, privopt.privacy], ids=lambda m: m.__name__)
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
