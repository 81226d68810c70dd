"""Ghost-norm engine: per-sample clipping without materialising ``[B, d]`` per-sample gradients.

Because each sample's loss depends only on its own output (sample-mixing layers are rejected by
:func:`privopt.grads.validate_model`), the per-sample gradient of a Linear weight is ``G_i^T A_i``
(output-gradients times inputs, one row per token), so its norm and the clipped sum
``sum_i c_i G_i^T A_i`` follow from one forward and one backward pass. The package is split by
responsibility:

* :mod:`~privopt.grads.ghost.layout` — where the batch dimension is in every layer call;
* :mod:`~privopt.grads.ghost.capture` — forward/backward capture at one parameter point;
* :mod:`~privopt.grads.ghost.rules` — per-layer rules, registered by layer type (extensible with
  :func:`register_layer_rule`); :mod:`~privopt.grads.ghost.fallback` — the vmap rule;
* :mod:`~privopt.grads.ghost.pieces` — the forms of one call's contribution to a parameter;
* :mod:`~privopt.grads.ghost.keep`, :mod:`~privopt.grads.ghost.terms` — per-parameter norms and
  clipped sums, safe in floating point;
* :mod:`~privopt.grads.ghost.engine` — :class:`GhostEngine`.

How it all works, and why it is safe in floating point: ``docs/engines.md``.

Limitations: a parameter used outside the ``forward`` of every module owning it (tied weights,
e.g. ``F.linear(h, self.embed.weight)`` in a parent while ``self.embed`` runs too) sends the model
to the vmap engine (:mod:`~privopt.grads.ghost.escape`), but a tensor a module derives from its
parameter and hands out is not followed; with dropout
in train mode the two points of a difference query draw different masks (as with any two forward
passes).
"""

from privopt.grads.ghost.engine import GhostEngine
from privopt.grads.ghost.pieces import ConvOuterProducts, DenseGrads, EmbeddingGrads, OuterProductGrads, Piece
from privopt.grads.ghost.rules import LayerRule, register_layer_rule, rule_for, unregister_layer_rule
from privopt.grads.ghost.tuning import TUNING

__all__ = [
    "TUNING",
    "ConvOuterProducts",
    "DenseGrads",
    "EmbeddingGrads",
    "GhostEngine",
    "LayerRule",
    "OuterProductGrads",
    "Piece",
    "register_layer_rule",
    "rule_for",
    "unregister_layer_rule",
]
