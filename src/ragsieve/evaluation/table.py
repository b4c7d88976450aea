"""Plain-text tables of an evaluation report and of an answer report."""

from __future__ import annotations

import math
from typing import Any

from .answers import AnswerReport
from .sweep import EvaluationReport

__all__ = ["answer_header", "format_answer_table", "format_table"]


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


def _cutoff(row: dict[str, Any]) -> str:
    """``q=0.2: keep bm25 >= 6.1`` (a quantile of the score) or ``keep bm25 >= 6``."""
    keep = row.get("keep") or f"theta={row.get('theta')}"
    return keep if row.get("quantile") is None else f"q={row['quantile']:g}: {keep}"


def format_table(report: EvaluationReport) -> str:
    """Render the report rows as an aligned text table.

    Columns: method, parameter, target, coverage mean ± sd over splits, mean per-query
    coverage, fraction of queries with all evidence kept, snippet and character removal,
    mean threshold (nonconformity units), and (conformal rows) whether coverage is within
    tolerance. A fixed-threshold row's parameter is its keep rule in the score's own units
    (mean cut-off over splits), after the quantile of the score it cuts at.
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
        else:  # a fixed cut-off, in the score's own units and direction
            param, ok = _cutoff(r), ""
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


def _diff(row: dict[str, Any], name: str, digits: int = 3) -> str:
    """``+0.012 [-0.004, +0.030]``: the row's difference from ``all`` and its interval."""
    ci = row.get("ci", {}).get(name)
    if not ci:
        return "-"
    if ci["n"] < 2 or not math.isfinite(ci["low"]):
        return f"{ci['estimate']:+.{digits}f}"
    return f"{ci['estimate']:+.{digits}f} [{ci['low']:+.{digits}f}, {ci['high']:+.{digits}f}]"


def answer_header(generated: Any, judged: Any) -> list[str]:
    """The columns of an answer report's table (text and page): the context's, then the
    generated answers' when ``generated``, then the nuggets' when ``judged``."""
    header = ["method", "param", "queries", "snippets", "chars", "in ctx", "in ctx vs all"]
    if generated:
        header += ["EM", "F1", "F1 vs all", "abstain"]
    if judged:
        header += ["nugget F1", "nugget F1 vs all"]
    return header


def format_answer_table(report: AnswerReport) -> str:
    """Render an answer report: per method, the context size, whether a gold answer is
    in it, and the generated answers' EM, F1 and nugget F1, each with its paired bootstrap
    interval of the difference from ``all``."""
    generated, judged = report.info.get("generated"), report.info.get("judged")
    header = answer_header(generated, judged)
    lines = []
    for r in report.results:
        method = r["method"]
        if r.get("mode") not in (None, "marginal"):
            method += f" [{r['mode']}]"
        param = "" if "alpha" not in r else f"alpha={r['alpha']:g}"
        if "k" in r:
            param += f" k~{r['k']:.1f}"
        line = [method, param.strip(), str(r["n_queries"]), _fmt(r.get("context_snippets_mean"), 1),
                _fmt(r.get("context_chars_mean"), 0), _fmt(r.get("answer_in_context_mean")),
                _diff(r, "answer_in_context")]
        if generated:
            line += [_fmt(r.get("em_mean")), _fmt(r.get("f1_mean")), _diff(r, "f1"),
                     _fmt(r.get("abstained_mean"))]
        if judged:
            line += [_fmt(r.get("nugget_f1_mean")), _diff(r, "nugget_f1")]
        lines.append(line)
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines]
    info = report.info
    summary = (
        f"{info.get('n_queries_evaluated')} test queries with gold answers over "
        f"{info.get('n_splits')} topic-disjoint split(s); 'vs all' = paired bootstrap "
        f"{info.get('confidence', 0.95):.0%} interval of the difference from 'all'."
    )
    if generated:
        gen = info.get("generator", {})
        summary += (f" Generator {gen.get('model')} ({info.get('llm_requests', 0)} requests, "
                    f"{info.get('llm_cache_hits', 0)} from the cache).")
    if judged:
        summary += f" Judge replies unparseable (left out): {info.get('judge_unparsed', 0)}."
    return "\n".join(out) + "\n" + summary
