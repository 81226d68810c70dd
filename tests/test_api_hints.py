"""A user's wrong or foreign keyword to make_private gets a ConfigError that says what to pass instead."""

import pytest
import torch

import privopt
from privopt.errors import ConfigError


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"noise_multiplier": 1.1}, "calibrates the noise exactly from epsilon= and delta="),
        ({"target_epsilon": 1.0}, "pass epsilon="),
        ({"poisson_sampling": True}, "always Poisson-sampled"),
        ({"max_grad_nrm": 1.0}, "did you mean 'max_grad_norm'?"),
    ],
)
def test_make_private_names_the_argument_and_what_to_pass(kwargs, says):
    model = torch.nn.Linear(3, 2)
    engine = privopt.PrivacyEngine()
    with pytest.raises(ConfigError) as err:
        engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
    name = next(iter(kwargs))
    assert f"make_private() takes no argument {name!r}" in str(err.value) and says in str(err.value)
    assert "max_grad_norm" in str(err.value).split("it takes:")[1]  # and lists what it does take
    assert engine.steps_taken == 0  # refused before anything was set up: the engine is still usable
