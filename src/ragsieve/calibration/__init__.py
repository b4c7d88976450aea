"""Calibration of the keep-rule: one estimator contract, one class per guarantee mode.

* :mod:`~ragsieve.calibration.base` -- the contract (``BaseCalibrator``, ``Guarantee``).
* :mod:`~ragsieve.calibration.split` -- marginal split conformal.
* :mod:`~ragsieve.calibration.query` -- per query: risk control, all evidence.
* :mod:`~ragsieve.calibration.pac` -- training-conditional (PAC).
* :mod:`~ragsieve.calibration.mondrian` -- per group.
* :mod:`~ragsieve.calibration.topic` -- per new topic.
* :mod:`~ragsieve.calibration.topic_pac` -- per new topic, with confidence (RCPS).
* :mod:`~ragsieve.calibration.bounds` -- Hoeffding-Bentkus and betting confidence bounds.
* :mod:`~ragsieve.calibration.budget` -- a per-query context budget.
* :mod:`~ragsieve.calibration.adaptive` -- adaptive conformal inference on feedback.
* :mod:`~ragsieve.calibration.stats` -- ranks, binomial tails, pooled CDFs.
* :mod:`~ragsieve.calibration.modes` -- mode names resolved (``make_calibrator``).
"""

from .._validation import check_alpha, check_scores
from .adaptive import AdaptiveCalibrator, AdaptiveConformalFilter
from .base import BaseCalibrator, Guarantee
from .budget import BudgetCalibrator, BudgetReport, approx_tokens, select_within_budget
from .modes import CALIBRATORS, MODES, calibrator_from_state, make_calibrator
from .mondrian import MondrianCalibrator
from .pac import PACCalibrator
from .query import QueryAllCalibrator, QueryRecallCalibrator
from .split import SplitConformalCalibrator
from .stats import binomial_sf, clopper_pearson_lower, conformal_rank, min_calibration_size
from .topic import TopicCalibrator
from .topic_pac import TopicPACCalibrator

__all__ = [
    "CALIBRATORS",
    "MODES",
    "AdaptiveCalibrator",
    "AdaptiveConformalFilter",
    "BaseCalibrator",
    "BudgetCalibrator",
    "BudgetReport",
    "Guarantee",
    "MondrianCalibrator",
    "PACCalibrator",
    "QueryAllCalibrator",
    "QueryRecallCalibrator",
    "SplitConformalCalibrator",
    "TopicCalibrator",
    "TopicPACCalibrator",
    "approx_tokens",
    "binomial_sf",
    "calibrator_from_state",
    "check_alpha",
    "check_scores",
    "clopper_pearson_lower",
    "conformal_rank",
    "make_calibrator",
    "min_calibration_size",
    "select_within_budget",
]
