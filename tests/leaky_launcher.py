"""A user's own ``torchrun`` launcher (tests/test_failure_paths_distributed.py): it registers a model
that fails on one rank during training, then runs the privopt command line, as a user who brings
their own model to a distributed run does::

    torchrun --standalone --nproc_per_node=2 tests/leaky_launcher.py [--debug] train --config ... --out ...

``LEAK_RANK`` is the rank that fails (none when unset), ``LEAK_AFTER`` the forward passes it makes
first, ``LEAK_HOW`` how: ``raise`` (a ValueError quoting a "record", :data:`jobs_helpers.SECRET`)
or ``kill`` (the process dies at once, as when the kernel's out-of-memory killer ends it).
"""

import os
import signal
import sys

from torch import nn

from jobs_helpers import SECRET
from privopt.cli import main
from privopt.models import register_model


class LeakyNet(nn.Module):
    """A linear model whose forward pass fails on rank ``$LEAK_RANK`` after ``$LEAK_AFTER`` calls."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.lin, self.calls = nn.Linear(d, k), 0
        self.fails = os.environ.get("LEAK_RANK") == os.environ.get("RANK", "0")

    def forward(self, x):
        self.calls += 1
        if self.fails and self.calls > int(os.environ.get("LEAK_AFTER", "8")):
            if os.environ.get("LEAK_HOW") == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(f"{SECRET}: odd feature in a batch of {x.shape[0]}")
        return self.lin(x.flatten(1))


def leaky_net(*, input_shape, num_classes):
    d = 1
    for s in input_shape:
        d *= s
    return LeakyNet(d, num_classes)


if __name__ == "__main__":  # registered only here: pytest imports this file to collect doctests
    register_model("leaky-net")(leaky_net)
    sys.exit(main())
