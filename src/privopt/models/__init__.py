"""privopt.models: small DP-compatible models (no BatchNorm) behind a registry.

Example:
    >>> from privopt.models import build_model, available_models
    >>> available_models()
    ['cnn', 'logreg', 'mlp', 'resnet20']
    >>> build_model("logreg", input_shape=(54,), num_classes=1)[0].weight.shape
    torch.Size([1, 54])
"""

from privopt.models.registry import available_models, build_model, count_parameters, register_model

__all__ = ["available_models", "build_model", "count_parameters", "register_model"]
