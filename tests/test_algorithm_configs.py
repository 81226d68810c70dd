"""Algorithm hyper-parameters: frozen, validated configs that round-trip through the run record."""

import dataclasses
import json

import pytest

from privopt.algorithms import available_algorithms, get_algorithm
from privopt.algorithms.config import ROLES
from privopt.errors import ConfigError

ALGOS = sorted(available_algorithms())


@pytest.mark.parametrize("name", ALGOS)
def test_the_record_holds_the_whole_config_and_rebuilds_it(name):
    algo = get_algorithm(name)
    record = json.loads(json.dumps(algo.hyperparameters()))  # what record.json stores
    assert set(record) == set(type(algo).Config.field_names())
    rebuilt = get_algorithm(name, **record)
    assert rebuilt.config == algo.config
    with pytest.raises(dataclasses.FrozenInstanceError):
        algo.config.epochs = 3  # type: ignore[misc]  (frozen: any assignment fails)


@pytest.mark.parametrize("name", ALGOS)
def test_unknown_and_invalid_parameters_fail_by_name(name):
    with pytest.raises(ConfigError, match="unknown hyper-parameter.*no_such_knob"):
        get_algorithm(name, no_such_knob=1)
    config = available_algorithms()[name].Config
    first_positive = next(f for f in dataclasses.fields(config) if f.metadata.get("role") in ("lr", "clip", "epochs"))
    with pytest.raises(ConfigError, match=first_positive.name):
        get_algorithm(name, **{first_positive.name: -1})


def test_roles_tell_experiments_what_fields_mean():
    from privopt.algorithms.dro_double_spider import DPDoubleSPIDERConfig
    from privopt.algorithms.dro_recursive_spider import DPRecursiveSPIDERConfig, SCDROConfig

    # the scalar η-query has its own threshold ("auto": never binds), outside the tuning grid's clip
    assert DPDoubleSPIDERConfig.fields_with_role("clip") == ("clip_x",)
    assert DPDoubleSPIDERConfig.fields_with_role("refresh_batch") == ("N1", "N3")
    assert DPRecursiveSPIDERConfig.fields_with_role("batch") == ("b2", "b4", "s_batch")
    assert SCDROConfig.fields_with_role("clip") == ()  # no clipping in the non-private reference
    for name in ALGOS:
        for f in dataclasses.fields(available_algorithms()[name].Config):
            assert f.metadata.get("role") in (None, *ROLES)
    with pytest.raises(ConfigError, match="unknown role"):
        DPDoubleSPIDERConfig.fields_with_role("nope")


def test_a_config_object_or_keywords_but_not_both():
    from privopt.algorithms.dpsgd import DPSGD, DPSGDConfig

    cfg = DPSGDConfig(lr=0.5)
    assert DPSGD(config=cfg).config is cfg
    with pytest.raises(ConfigError, match="not both"):
        DPSGD(config=cfg, lr=0.1)
    with pytest.raises(ConfigError, match="needs a DPSGDConfig"):
        DPSGD(config=object())
    assert cfg.replace(lr=0.25).lr == 0.25 and cfg.lr == 0.5


def test_every_hyper_parameter_the_algorithm_pages_give_a_default_exists():
    """A `name` the docs give a default for is a field of some algorithm's config (or of the DRO
    reproduction's Budget): a renamed or removed option does not live on in the docs."""
    import pathlib
    import re

    from privopt.experiments.dro_protocol import Budget

    fields = {f.name for cls in available_algorithms().values() for f in dataclasses.fields(cls.Config)}
    fields |= {f.name for f in dataclasses.fields(Budget)}
    pages = sorted((pathlib.Path(__file__).resolve().parents[1] / "docs" / "algorithms").glob("*.md"))
    named = {
        (page.name, m.group(1))
        for page in pages
        for m in re.finditer(r"`([a-z_][a-z0-9_]*)`[^`\n]{0,30}default", page.read_text(encoding="utf-8"))
    }
    assert len(named) >= 4 and sorted((p, n) for p, n in named if n not in fields) == []


def test_the_algorithm_pages_name_no_option_or_function_the_code_lacks():
    """Every `snake_case` name on the algorithm pages occurs in the source or the tests (math such as
    `f_T` aside): a removed option or function does not live on in the docs."""
    import pathlib
    import re

    repo = pathlib.Path(__file__).resolve().parents[1]
    code = "\n".join(p.read_text(encoding="utf-8") for d in ("src", "tests") for p in (repo / d).rglob("*.py"))
    math_symbols = {"f_T"}
    stale = sorted(
        {
            (page.name, name)
            for page in (repo / "docs" / "algorithms").glob("*.md")
            for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*_[A-Za-z0-9_]+)`", page.read_text(encoding="utf-8"))
            if name not in code and name not in math_symbols
        }
    )
    assert stale == []
