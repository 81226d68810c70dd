"""Public preprocessing constants: value ranges and normalisation constants fixed before any data is read.

Nothing here is computed from the records being loaded, so one record cannot move another
record's scaling. Every constant says where it comes from; ``docs/data.md`` ("Public
preprocessing") lists them with their sources.

Example:
    >>> import numpy as np
    >>> s = PublicScaling.box(0.0, 255.0, center=0.1307 * 255, scale=0.3081 * 255, source="MNIST")
    >>> s.apply(np.array([[0.0, 255.0, 300.0]]), mode="unit").tolist()
    [[0.0, 1.0, 1.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privopt.errors import ConfigError

__all__ = [
    "PublicScaling",
    "SCALING_MODES",
    "image_scaling",
    "IMAGE_NORMALIZATION",
    "COVTYPE_QUANTITATIVE",
    "covtype_scaling",
    "covtype_bounds",
    "ADULT_VOCABULARY",
    "ADULT_NUMERIC_BOUNDS",
    "BREAST_CANCER_RANGES",
    "breast_cancer_scaling",
]

SCALING_MODES = ("public", "unit", "none", "data")


def _float32(x: np.ndarray) -> np.ndarray:
    """``x`` as float32, a finite value past float32's range saturated at its largest value.

    Silently: numpy's overflow warning would tell stderr's readers that some record holds a value
    above 3.4e38, and a record's feature must not depend on more than that record.
    """
    with np.errstate(over="ignore"):
        out = np.array(x, dtype=np.float32)
    src = np.asarray(x)
    if src.dtype.kind == "f" and src.dtype.itemsize > 4:
        over = np.isinf(out) & np.isfinite(src)
        out[over] = np.copysign(np.finfo(np.float32).max, src[over])
    return out


@dataclass(frozen=True)
class PublicScaling:
    """Per-feature public constants: clip bounds ``[lower, upper]`` and a normalisation ``(x - center) / scale``.

    Arrays broadcast against one record (``[d]`` for tabular data, ``[C, 1, 1]`` for images).
    ``source`` names where the constants come from.
    """

    lower: np.ndarray
    upper: np.ndarray
    center: np.ndarray
    scale: np.ndarray
    source: str

    @classmethod
    def box(cls, lower, upper, *, center=None, scale=None, source: str) -> PublicScaling:
        """Bounds, plus normalisation constants (default: the bounds, i.e. min-max to [0, 1])."""
        lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
        if np.any(hi <= lo):
            raise ConfigError(f"public bounds need upper > lower ({source})")
        c = lo if center is None else np.asarray(center, dtype=np.float64)
        s = (hi - lo) if scale is None else np.asarray(scale, dtype=np.float64)
        return cls(lo, hi, c, s, source)

    def apply(self, x: np.ndarray, *, mode: str) -> np.ndarray:
        """Clip into the bounds, then ``"public"``: ``(x - center) / scale``; ``"unit"``: map bounds to [0, 1].

        ``"none"`` returns ``x`` unchanged. Returns float32.
        """
        if mode not in ("none", "unit", "public"):
            raise ConfigError(f"unknown scaling mode {mode!r}; use one of none, unit, public")
        # float32 and in place: full CIFAR-10 is 600 MB as float32, so avoid float64 copies.
        out = _float32(x)
        if mode == "none":
            return out
        f32 = lambda a: np.asarray(a, dtype=np.float32)
        np.clip(out, f32(self.lower), f32(self.upper), out=out)
        shift, div = (self.lower, self.upper - self.lower) if mode == "unit" else (self.center, self.scale)
        out -= f32(shift)
        out /= f32(div)
        return out

    def describe(self) -> dict:
        """JSON-friendly constants (all public)."""
        flat = lambda a: np.asarray(a, dtype=np.float64).ravel().tolist()
        return {
            "lower": flat(self.lower),
            "upper": flat(self.upper),
            "center": flat(self.center),
            "scale": flat(self.scale),
            "source": self.source,
        }


# ------------------------------------------------------------------------------- images

# Published per-channel mean/std of pixels scaled to [0, 1] (of each dataset's full official
# training set), as used by the reference PyTorch training scripts. Fixed constants: they do not
# depend on the records a run loads.
IMAGE_NORMALIZATION = {
    "mnist": ((0.1307,), (0.3081,), "PyTorch examples, mnist/main.py: Normalize((0.1307,), (0.3081,))"),
    "fashion-mnist": (
        (0.2860,),
        (0.3530,),
        "widely used Fashion-MNIST constants Normalize((0.2860,), (0.3530,)); the mean equals the "
        "official training-set mean pixel 72.94 / 255",
    ),
    "cifar10": (
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        "published CIFAR-10 training-set channel statistics Normalize((0.4914, 0.4822, 0.4465), "
        "(0.2470, 0.2435, 0.2616))",
    ),
}


def image_scaling(max_value: float, channels: int, *, normalization: str | None) -> PublicScaling:
    """Pixels in ``[0, max_value]``; ``"public"`` mode uses :data:`IMAGE_NORMALIZATION` ``[normalization]``.

    Without published constants (``normalization=None``) ``"public"`` is ``"unit"``: ``x / max_value``.
    """
    shape = (channels, 1, 1)
    lo, hi = np.zeros(shape), np.full(shape, float(max_value))
    if normalization is None:
        return PublicScaling.box(lo, hi, source=f"documented pixel range 0..{max_value:g} (x / {max_value:g})")
    mean, std, source = IMAGE_NORMALIZATION[normalization]
    center = np.asarray(mean, dtype=np.float64).reshape(shape) * max_value
    scale = np.asarray(std, dtype=np.float64).reshape(shape) * max_value
    return PublicScaling.box(lo, hi, center=center, scale=scale, source=f"pixel range 0..{max_value:g}; {source}")


# ------------------------------------------------------------------------------- Covertype

# UCI covtype.info, section 7 (units) and section 8 ("Basic Summary Statistics for quantitative
# variables only", whole 581,012-record dataset): name -> (mean, std, documented range or None).
COVTYPE_QUANTITATIVE = {
    "Elevation": (2959.36, 279.98, None),
    "Aspect": (155.65, 111.91, (0.0, 360.0)),  # degrees azimuth
    "Slope": (14.10, 7.49, (0.0, 90.0)),  # degrees
    "Horizontal_Distance_To_Hydrology": (269.43, 212.55, None),
    "Vertical_Distance_To_Hydrology": (46.42, 58.30, None),
    "Horizontal_Distance_To_Roadways": (2350.15, 1559.25, None),
    "Hillshade_9am": (212.15, 26.77, (0.0, 255.0)),  # 0 to 255 index
    "Hillshade_Noon": (223.32, 19.77, (0.0, 255.0)),
    "Hillshade_3pm": (142.53, 38.27, (0.0, 255.0)),
    "Horizontal_Distance_To_Fire_Points": (1980.29, 1324.19, None),
}
_NONNEGATIVE = {
    "Horizontal_Distance_To_Hydrology",
    "Horizontal_Distance_To_Roadways",
    "Horizontal_Distance_To_Fire_Points",
}
COVTYPE_STD_WIDTH = 5.0  # attributes without a documented range: published mean +- 5 published std


def covtype_bounds() -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` for the 54 Covertype features (the 44 binary columns: [0, 1])."""
    lo, hi = np.zeros(54), np.ones(54)
    for j, (name, (mean, std, rng)) in enumerate(COVTYPE_QUANTITATIVE.items()):
        if rng is not None:
            lo[j], hi[j] = rng
        else:
            lo[j], hi[j] = mean - COVTYPE_STD_WIDTH * std, mean + COVTYPE_STD_WIDTH * std
            if name in _NONNEGATIVE:
                lo[j] = 0.0  # a horizontal distance
    return lo, hi


def covtype_scaling() -> PublicScaling:
    """Covertype: clip to :func:`covtype_bounds`; ``"public"`` standardises the 10 quantitative
    attributes with covtype.info's published mean/std and keeps the binary columns 0/1."""
    lo, hi = covtype_bounds()
    center, scale = np.zeros(54), np.ones(54)
    for j, (mean, std, _) in enumerate(COVTYPE_QUANTITATIVE.values()):
        center[j], scale[j] = mean, std
    return PublicScaling.box(
        lo, hi, center=center, scale=scale,
        source="UCI covtype.info: units/ranges (section 7) and published whole-dataset mean/std (section 8); "
        f"unbounded attributes clipped to mean +- {COVTYPE_STD_WIDTH:g} std (distances at 0)",
    )  # fmt: skip


# ------------------------------------------------------------------------------- Adult

# The category lists of UCI adult.names ("7. Attribute Information"), in that order; "?" marks a
# missing value in the data files. A fixed vocabulary keeps the feature layout independent of
# which values happen to occur in the loaded records.
ADULT_VOCABULARY = {
    "workclass": (
        "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov", "Without-pay",
        "Never-worked",
    ),
    "education": (
        "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th",
        "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool",
    ),
    "marital-status": (
        "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed", "Married-spouse-absent",
        "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
        "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing", "Transport-moving",
        "Priv-house-serv", "Protective-serv", "Armed-Forces",
    ),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany", "Outlying-US(Guam-USVI-etc)",
        "India", "Japan", "Greece", "South", "China", "Cuba", "Iran", "Honduras", "Philippines", "Italy",
        "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal", "Ireland", "France", "Dominican-Republic", "Laos",
        "Ecuador", "Taiwan", "Haiti", "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand",
        "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
    ),
}  # fmt: skip

# Numeric Adult features used, after a fixed per-record transform: name -> (transform, lower, upper, source).
# fnlwgt (the survey's sampling weight: how many people a record stands for) is not a feature.
ADULT_NUMERIC_BOUNDS = {
    "age": ("identity", 17.0, 90.0, "adult.names extraction rule AAGE>16; the 1994 CPS top-codes age at 90"),
    "education-num": ("identity", 1.0, 16.0, "the 16 education levels listed in adult.names"),
    "capital-gain": ("log1p", 0.0, float(np.log1p(99999.0)), "five-digit field, 99999 = top code"),
    "capital-loss": ("log1p", 0.0, float(np.log1p(99999.0)), "five-digit field, as capital-gain"),
    "hours-per-week": ("identity", 1.0, 99.0, "adult.names extraction rule HRSWK>0; two-digit field (top code 99)"),
}


# ------------------------------------------------------------------------------- breast cancer

# scikit-learn's load_breast_cancer description, table "Summary Statistics" (Min, Max) of the
# Wisconsin Diagnostic Breast Cancer data, in feature order.
BREAST_CANCER_RANGES = (
    (6.981, 28.11), (9.71, 39.28), (43.79, 188.5), (143.5, 2501.0), (0.053, 0.163), (0.019, 0.345),
    (0.0, 0.427), (0.0, 0.201), (0.106, 0.304), (0.05, 0.097), (0.112, 2.873), (0.36, 4.885), (0.757, 21.98),
    (6.802, 542.2), (0.002, 0.031), (0.002, 0.135), (0.0, 0.396), (0.0, 0.053), (0.008, 0.079),
    (0.001, 0.03), (7.93, 36.04), (12.02, 49.54), (50.41, 251.2), (185.2, 4254.0), (0.071, 0.223),
    (0.027, 1.058), (0.0, 1.252), (0.0, 0.291), (0.156, 0.664), (0.055, 0.208),
)  # fmt: skip


def breast_cancer_scaling() -> PublicScaling:
    """Breast cancer: min-max to [0, 1] with the published ranges (``"public"`` = ``"unit"``)."""
    lo, hi = np.array(BREAST_CANCER_RANGES).T
    return PublicScaling.box(lo, hi, source="scikit-learn load_breast_cancer DESCR, 'Summary Statistics' min/max")
