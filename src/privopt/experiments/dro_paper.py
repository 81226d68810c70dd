"""Paper A's published numbers: Table 3 (test accuracy) and Table 2 (membership-inference AUC).

The reports print them beside the measured tables (``docs/algorithms/dro.md``, "Reproducing Paper A").
"""

from __future__ import annotations

__all__ = ["PAPER_NONPRIVATE", "PAPER_TABLE2", "PAPER_TABLE3", "TABLE3_ORDER"]

# The paper's Table 3 (test accuracy, %): dataset -> epsilon -> method -> value.
TABLE3_ORDER = ("dp-sgda", "private-diff", "dp-double-spider", "dp-recursive-spider")
PAPER_TABLE3: dict[str, dict[float, dict[str, float]]] = {
    ds: {eps: dict(zip(TABLE3_ORDER, vals)) for eps, vals in rows.items()}
    for ds, rows in {
        "cifar10-st": {
            0.5: (41.80, 43.06, 56.31, 53.81),
            1.0: (45.10, 46.13, 55.67, 55.93),
            5.0: (51.54, 51.29, 55.69, 56.58),
            10.0: (52.47, 51.68, 57.26, 55.67),
        },
        "mnist-st": {
            0.5: (99.16, 99.18, 99.49, 99.66),
            1.0: (99.48, 99.30, 99.50, 99.56),
            5.0: (99.49, 99.47, 99.47, 99.45),
            10.0: (99.55, 99.32, 99.46, 99.45),
        },
        "fashion-mnist": {
            0.5: (88.13, 88.82, 91.39, 92.27),
            1.0: (89.16, 89.51, 91.37, 91.87),
            5.0: (90.45, 90.70, 91.36, 91.59),
            10.0: (90.39, 91.29, 91.38, 91.58),
        },
        "celeba": {
            0.5: (88.16, 88.18, 89.37, 90.37),
            1.0: (89.17, 89.01, 89.37, 90.32),
            5.0: (89.76, 90.14, 89.38, 90.41),
            10.0: (89.93, 90.35, 89.38, 90.45),
        },
    }.items()
}
PAPER_NONPRIVATE = {"cifar10-st": 67.58}
# The paper's Table 2 (MIA AUC on CIFAR10-ST, mean, std over 5 runs).
PAPER_TABLE2 = {
    "dp-double-spider": {
        0.1: (0.9719, 0.0059),
        1.0: (0.9723, 0.0045),
        3.0: (0.9717, 0.0025),
        5.0: (0.9723, 0.0021),
        8.0: (0.9724, 0.0033),
        10.0: (0.9715, 0.0022),
    },
    "dp-recursive-spider": {
        0.1: (0.8234, 0.0127),
        1.0: (0.7932, 0.0072),
        3.0: (0.7958, 0.0240),
        5.0: (0.8014, 0.0383),
        8.0: (0.8001, 0.0302),
        10.0: (0.7825, 0.0149),
    },
}
