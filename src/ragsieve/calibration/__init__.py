"""Calibration of the keep-threshold: split conformal and the other guarantee modes.

* :mod:`~ragsieve.calibration.split` -- ``SplitConformalCalibrator`` (the marginal rule)
  and the shared validation helpers.
* :mod:`~ragsieve.calibration.modes` -- per-query (risk control, all-evidence),
  training-conditional (PAC), per-group (Mondrian) and per-topic (two-layer) calibrators,
  resolved by name with :func:`make_calibrator`.
"""

from .modes import (
    MODES,
    MondrianCalibrator,
    PACCalibrator,
    QueryAllCalibrator,
    QueryRecallCalibrator,
    TopicCalibrator,
    binomial_sf,
    make_calibrator,
)
from .split import (
    SplitConformalCalibrator,
    check_alpha,
    check_scores,
    conformal_rank,
    min_calibration_size,
)

__all__ = [
    "MODES",
    "MondrianCalibrator",
    "PACCalibrator",
    "QueryAllCalibrator",
    "QueryRecallCalibrator",
    "SplitConformalCalibrator",
    "TopicCalibrator",
    "binomial_sf",
    "check_alpha",
    "check_scores",
    "conformal_rank",
    "make_calibrator",
    "min_calibration_size",
]
