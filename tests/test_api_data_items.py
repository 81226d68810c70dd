"""make_private's data: the engines take one input tensor and one target tensor per batch. A map-style
dataset whose items collate to something else (a dict of inputs) is refused with a DataError
naming it, before anything runs (was: ``TypeError: unhashable type: 'slice'`` from the probe)."""

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset as TorchDataset

import privopt
from privopt.errors import DataError


class DictInputs(TorchDataset):
    def __init__(self, n=100):
        self.x, self.y = torch.randn(n, 6), torch.randint(0, 3, (n,))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"features": self.x[i]}, self.y[i]


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, batch):
        return self.fc(batch["features"])


def test_dict_inputs_are_refused_by_name():
    model = DictModel()
    with pytest.raises(DataError, match="inputs.*tensor.*dict"):
        privopt.PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=DictInputs(),
            batch_size=20, epochs=1, epsilon=1.0, delta=1e-4, max_grad_norm=1.0,
        )  # fmt: skip
