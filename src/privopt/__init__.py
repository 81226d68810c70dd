"""privopt: differentially private optimization of robust and non-convex objectives on PyTorch."""

__version__ = "0.1.0"
