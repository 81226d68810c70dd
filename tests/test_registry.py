"""privopt.registry.Registry and the extension points built on it (models, datasets, feature maps)."""

import pytest

from privopt.data import features as features_mod
from privopt.data import registry as data_registry
from privopt.errors import ConfigError
from privopt.models import available_models, build_model, register_model
from privopt.registry import Registry


def test_registry_classes_and_named_objects():
    reg = Registry("widget")

    @reg.register
    class Knob:
        name = "knob"

    @reg.register_as("lever")
    def lever():
        return "pulled"

    assert reg.names() == ("knob", "lever")
    assert reg.lookup("knob") is Knob and reg.lookup("lever")() == "pulled"
    assert list(reg.entries()) == ["knob", "lever"] and "knob" in reg and "dial" not in reg
    reg.register(Knob)  # the same object again: no-op
    with pytest.raises(ConfigError, match="widget name 'knob' registered twice"):
        reg.add("knob", object())
    with pytest.raises(ConfigError, match="unknown widget 'dial'; available: knob, lever"):
        reg.lookup("dial")
    with pytest.raises(ConfigError, match="unknown widget"):
        reg.lookup(3)  # type: ignore[arg-type]


def test_builtin_extension_points_reject_a_second_owner_of_a_name():
    # Load the built-in entries first (they register lazily) so nothing here can take their names.
    available_models(), data_registry.available_datasets(), features_mod.available_features()
    with pytest.raises(ConfigError, match="model name 'mlp' registered twice"):
        register_model("mlp")(lambda **kw: None)
    with pytest.raises(ConfigError, match="dataset name 'digits' registered twice"):
        data_registry.register_dataset("digits", needs_files=False)(lambda ctx: None)
    with pytest.raises(ConfigError, match="feature map name 'scattering' registered twice"):
        features_mod.register_features("scattering")(lambda **kw: None)


def test_unknown_names_list_the_choices():
    with pytest.raises(ConfigError, match="unknown model 'perceptron'; available: .*mlp"):
        build_model("perceptron", input_shape=(4,), num_classes=2)
    assert "mlp" in available_models()
    with pytest.raises(ConfigError, match="unknown dataset 'nope'; available: .*digits"):
        data_registry.dataset_options("nope")
    with pytest.raises(ConfigError, match="unknown feature map 'wavelets'; available: none, .*scattering"):
        features_mod.build_feature_map("wavelets", input_shape=(1, 8, 8))


def test_gradient_engines_share_the_registry():
    from privopt.grads import get_engine, register_engine
    from privopt.grads.engine import VmapEngine, available_engines

    assert {"vmap", "ghost", "auto"} <= set(available_engines())
    assert isinstance(get_engine("vmap"), VmapEngine)
    register_engine(VmapEngine)  # the same class again: no-op

    class Impostor(VmapEngine):
        name = "vmap"

    with pytest.raises(ConfigError, match="gradient engine name 'vmap' registered twice"):
        register_engine(Impostor)
    with pytest.raises(ConfigError, match="unknown gradient engine 'warp'; available: .*auto"):
        get_engine("warp")


def test_misspelt_names_and_keys_get_a_suggestion():
    from privopt.config import RunConfig

    with pytest.raises(ConfigError, match=r"unknown model 'mlpp' \(did you mean 'mlp'\?\)"):
        build_model("mlpp", input_shape=(4,), num_classes=2)
    with pytest.raises(ConfigError, match=r"\['algoritm'\] \(did you mean 'algorithm'\?\)"):
        RunConfig.from_dict({"algoritm": "dp-sgd"})
    with pytest.raises(ConfigError, match=r"\['epsilom'\] \(did you mean 'epsilon'\?\)"):
        RunConfig.from_dict({"privacy": {"epsilom": 1.0}})
    with pytest.raises(ConfigError) as far:  # nothing close: no guess, the choices are still listed
        build_model("zzzzzz", input_shape=(4,), num_classes=2)
    assert "did you mean" not in str(far.value) and "mlp" in str(far.value)
