"""Plain-text table of an evaluation report."""

from __future__ import annotations

import math
from typing import Any

from .sweep import EvaluationReport

__all__ = ["format_table"]


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        if math.isnan(x):
            return "nan"
        return f"{x:.{digits}f}"
    return str(x)


def format_table(report: EvaluationReport) -> str:
    """Render the report rows as an aligned text table.

    Columns: method, parameter, target, coverage mean ± sd over splits, mean per-query
    coverage, fraction of queries with all evidence kept, snippet and character removal,
    mean threshold, and (conformal rows) whether coverage is within tolerance.
    """
    header = ["method", "param", "target", "coverage", "± sd", "q-cov", "q-all", "removed",
              "chars rm", "tau", "guaranteed", "value", "ok"]
    lines = []
    for r in report.results:
        method, guaranteed, value = r["method"], "", ""
        if method == "conformal":
            param = f"alpha={r['alpha']:g}"
            ok = "yes" if r["within_tolerance"] else "NO"
            method = "conformal" if r.get("mode", "marginal") == "marginal" else r["mode"]
            guaranteed, value = r.get("guaranteed_metric", ""), _fmt(r.get("guaranteed_value"))
        elif method == "top-k":
            param, ok = f"k={r['k']}", ""
        elif method.endswith("(calibrated)"):
            param, ok = f"alpha={r['alpha']:g}", ""
            if method.startswith("top-k"):
                param += f" k~{r['k_mean']:.1f}"
        elif method == "budget":
            param, ok = f"chars={r['budget']}", ""
            guaranteed = "predicted lower"
            value = _fmt(r.get("predicted_coverage_lower_mean"))
        else:
            param, ok = f"theta={r['theta']:g}", ""
        lines.append([
            method, param, _fmt(r["target"]), _fmt(r["coverage_mean"]), _fmt(r["coverage_std"]),
            _fmt(r["query_coverage_mean"]), _fmt(r["query_all_kept_mean"]), _fmt(r["removal_mean"]),
            _fmt(r["removal_chars_mean"]), _fmt(r.get("threshold_mean")), guaranteed, value, ok,
        ])
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines]
    summary = (
        f"{report.n_queries} queries, {report.n_snippets} (query, snippet) pairs, "
        f"{report.n_relevant} relevant, {report.n_groups} groups; {report.n_splits} group-disjoint "
        f"splits, {report.calibration_fraction:g} of groups for calibration. "
        f"ok = the mode's guaranteed value >= target - {report.info.get('tolerance_se', 3):g} "
        "standard errors."
    )
    return "\n".join(out) + "\n" + summary
