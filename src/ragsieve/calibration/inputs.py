"""Labelled pairs as a calibrator's inputs: the one translation ``calibrate`` and ``evaluate`` share.

A calibrator's ``fit`` and ``predict`` take, besides the scores, the inputs its mode asks
for (``fit_requires`` / ``predict_requires``): the query of every pair, its groups (the
topic, or for the ``group`` mode the attribute it is conditional on, as ``group_kind``
says) and its length (the snippet texts, measured in the calibrator's own unit).
:class:`CalibrationInputs` reads them from the pairs once; ``ConformalFilter.calibrate``
and every split of ``evaluation.evaluate`` hand a calibrator the same arguments through
:meth:`CalibrationInputs.arguments`, so a deployed filter is fitted as a split measures it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import first_appearance_codes
from ..errors import DataError
from ..types import Pair
from .base import BaseCalibrator

__all__ = ["CalibrationInputs"]



@dataclass(frozen=True)
class CalibrationInputs:
    """Per-pair inputs of a calibrator besides the scores, aligned with the pairs.

    Attributes
    ----------
    relevant : numpy.ndarray of bool
    query_index : numpy.ndarray of int
        The pair's query, numbered by first appearance.
    group_index : numpy.ndarray of int
        The pair's topic (``Pair.group``), numbered by first appearance.
    lengths : numpy.ndarray of int
        Characters of the snippet text.
    attribute : numpy.ndarray or None
        The ``group`` mode's attribute of every pair (a ``Pair.meta`` field), as str.
    texts : tuple of str or None
        The snippet texts: a length-aware mode (budget) measures them in its own unit
        (chars or tokens); without them it gets ``lengths``.
    """

    relevant: np.ndarray
    query_index: np.ndarray
    group_index: np.ndarray
    lengths: np.ndarray
    attribute: np.ndarray | None = None
    texts: tuple[str, ...] | None = None

    def fields(self) -> dict[str, Any]:
        """The inputs as keyword arguments (the fields of this class only)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CalibrationInputs)}

    @classmethod
    def from_pairs(cls, pairs: Sequence[Pair], *, group_by: str | None = None,
                   missing_group: str | None = None) -> CalibrationInputs:
        """Read the inputs of labelled pairs.

        Parameters
        ----------
        pairs : sequence of Pair
            Pairs with ``relevant`` in {0, 1} (the caller checks the labels).
        group_by : str, optional
            The ``Pair.meta`` field holding the ``group`` mode's attribute.
        missing_group : str, optional
            The attribute of a pair without that field; None (the default) refuses such
            pairs.

        Raises
        ------
        DataError
            ``missing_group`` is None and a pair lacks the ``group_by`` field.

        Examples
        --------
        >>> from ragsieve.types import Pair
        >>> pairs = [Pair("q1", "a", "x", "ab", 1, "t"), Pair("q2", "b", "y", "abc", 0, "s")]
        >>> CalibrationInputs.from_pairs(pairs).query_index.tolist()
        [0, 1]
        """
        pairs = list(pairs)
        attribute = None
        if group_by is not None:
            missing = [p for p in pairs if group_by not in p.meta]
            if missing and missing_group is None:
                raise DataError(
                    f"{len(missing)} calibration pair(s) lack the group field {group_by!r} "
                    f"(first: query_id={missing[0].query_id!r}, snippet_id={missing[0].snippet_id!r})."
                )
            attribute = np.array([str(p.meta.get(group_by, missing_group)) for p in pairs],
                                 dtype=object)
        return cls(
            relevant=np.array([p.relevant == 1 for p in pairs], dtype=bool),
            query_index=first_appearance_codes([p.query_id for p in pairs]),
            group_index=first_appearance_codes([p.group for p in pairs]),
            lengths=np.array([len(p.text) for p in pairs], dtype=int),
            attribute=attribute,
            texts=tuple(p.text for p in pairs),
        )

    def arguments(self, calibrator: BaseCalibrator, index: Any = None) -> dict[str, Any]:
        """The keyword inputs of ``calibrator.fit`` / ``predict`` for the pairs at ``index``.

        ``query_ids``, ``lengths`` (the texts where known and the mode measures lengths)
        and ``groups``: the attribute
        for a ``group_kind == "attribute"`` mode, else the topics (the topic modes calibrate
        per topic; the budget mode adds a topic-bootstrap bound; the others ignore them).

        Parameters
        ----------
        calibrator : BaseCalibrator
        index : array-like of int or bool, optional
            The pairs to take (all when None).

        Raises
        ------
        ValueError
            An ``"attribute"`` mode and no attribute was read (``from_pairs(group_by=...)``).
        """
        pick = slice(None) if index is None else np.asarray(index)
        if calibrator.group_kind == "attribute":
            if self.attribute is None:
                raise ValueError(f"mode {calibrator.mode!r} needs each pair's group attribute; "
                                 "read the pairs with group_by (CLI --group-by FIELD).")
            groups = self.attribute[pick]
        else:
            groups = self.group_index[pick]
        if self.texts is None or "lengths" not in calibrator.fit_requires | calibrator.predict_requires:
            lengths: Any = self.lengths[pick]
        else:
            lengths = np.asarray(self.texts, dtype=object)[pick].tolist()
        return {"query_ids": self.query_index[pick], "groups": groups, "lengths": lengths}

    def fit(self, calibrator: BaseCalibrator, scores: Any, index: Any = None) -> BaseCalibrator:
        """``calibrator.fit`` on the pairs at ``index`` (all when None); returns ``calibrator``.

        ``scores`` are aligned with every pair; the ones at ``index`` are used.
        """
        pick = slice(None) if index is None else np.asarray(index)
        return calibrator.fit(np.asarray(scores, dtype=float)[pick], self.relevant[pick],
                              **self.arguments(calibrator, index))

    def predict(self, calibrator: BaseCalibrator, scores: Any) -> np.ndarray:
        """``calibrator.predict`` over every pair: the keep-mask."""
        return calibrator.predict(np.asarray(scores, dtype=float), **self.arguments(calibrator))
