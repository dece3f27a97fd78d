"""Evaluation extras for Co-ReAct and the test-time baselines (paper 4.5, Table 3): search behaviour with
utilisation, the verification failure (retry) rate, and the cost per question per role.

- **Behaviour** (per method): tool calls per question (the steps' tool calls plus CRITIC's verification
  searches, ``metadata.guided.extra_tool_calls``), unique documents retrieved, unique documents cited (see
  :mod:`components.evaluation.behaviour`) and **utilisation** = mean cited / mean retrieved (Table 3's ratio:
  Co-ReAct's 18.6 / 19.3 = 0.96).
- **Verification** (Co-ReAct): of the steps whose first draft the verifier judged, the share it rejected,
  which each triggered a retry (paper: 159 of 743, 21.4%); plus rubric-guided steps, generator failures,
  verifier failures and token-budget hits. ``retry_rate`` counts the retries of any method (Self-Refine,
  CRITIC) over its recorded steps.
- **Cost** (per question, per role): model calls, failures and tokens from each trajectory's
  ``metadata.guided.cost`` (every role an agent called: policy, rubric generator, verifier, scorer); a plain
  ReAct trajectory counts its ``policy_calls`` and step tokens. These come from the records, so they are the
  same on a resumed or cached run; :func:`accounting_per_question` divides the pool's live accounting (which
  also holds the answer judge) for MLflow.

    metrics.update(guided_metrics(table, trajectories))
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from components.evaluation.behaviour import BEHAVIOUR_COLUMNS  # Table 3's columns, shared with the reports
from components.schemas import Trajectory

__all__ = ["BEHAVIOUR_COLUMNS", "accounting_per_question", "behaviour_table", "cost_per_question", "guided_metrics", "verification_stats"]


def _guided(t: Trajectory) -> dict:
    return t.metadata.get("guided") or {}


def verification_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    steps = [r for t in trajectories for r in _guided(t).get("steps", [])]
    first = [r["drafts"][0] for r in steps if r.get("drafts")]
    judged = [d for d in first if d.get("accepted") is not None]
    rejected = sum(d["accepted"] is False for d in judged)
    retried = sum(r.get("retries", 0) > 0 for r in steps)
    return {
        "guided_steps": float(len(steps)),
        "rubric_steps": float(sum(bool(r.get("rubric")) for r in steps)),
        "rubric_failures": float(sum("rubric_error" in r for r in steps)),
        "verified_steps": float(len(judged)),
        "verification_failures": float(rejected),
        "verification_failure_rate": rejected / len(judged) if judged else float("nan"),
        "verifier_failures": float(len(first) - len(judged)),
        "retries": float(sum(r.get("retries", 0) for r in steps)),
        "retry_rate": retried / len(steps) if steps else float("nan"),
        "token_budget_hits": float(sum(bool(_guided(t).get("token_budget_hit")) for t in trajectories)),
    }


def _trajectory_cost(t: Trajectory) -> dict[str, dict[str, float]]:
    cost = _guided(t).get("cost")
    if cost is not None:
        return cost
    calls = t.metadata.get("policy_calls") or []
    return {"policy": {"calls": len(calls) or len(t.steps), "failures": int(t.finish_reason == "llm_failure"),
                       "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens}}


def cost_per_question(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``cost.<role>.<calls|failures|prompt_tokens|completion_tokens>`` averaged over the questions, and
    ``cost.calls`` / ``cost.tokens`` over every role."""
    totals: dict[str, dict[str, float]] = {}
    for t in trajectories:
        for role, c in _trajectory_cost(t).items():
            mine = totals.setdefault(role, {})
            for k, v in c.items():
                mine[k] = mine.get(k, 0.0) + float(v)
    n = max(len(trajectories), 1)
    out = {f"cost.{role}.{k}": v / n for role, c in sorted(totals.items()) for k, v in sorted(c.items())}
    out["cost.calls"] = sum(c.get("calls", 0.0) for c in totals.values()) / n
    out["cost.tokens"] = sum(c.get("prompt_tokens", 0.0) + c.get("completion_tokens", 0.0) for c in totals.values()) / n
    return out


def guided_metrics(table: pd.DataFrame, trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Behaviour with utilisation, verification and cost, for one method's evaluation (``table`` is the
    per-question table of ``tasks.evaluate.score``)."""
    extra = [float(_guided(t).get("extra_tool_calls", 0)) for t in trajectories]
    retrieved, cited = float(table["unique_docs_retrieved"].mean()), float(table["unique_docs_cited"].mean())
    out = {
        "tool_calls_total_per_question": float(table["tool_calls"].mean()) + sum(extra) / max(len(extra), 1),
        "utilisation": cited / retrieved if retrieved else float("nan"),
        **verification_stats(trajectories),
        **cost_per_question(trajectories),
    }
    return {k: round(v, 6) for k, v in out.items()}


def accounting_per_question(llm_metrics: dict[str, float], n_questions: int) -> dict[str, float]:
    """The pool's calls and tokens per role (``llm.<role>.calls`` ...) divided by the questions run."""
    n = max(n_questions, 1)
    keep = (".calls", ".failures", ".prompt_tokens", ".completion_tokens", ".cost")
    return {f"{k}_per_question": v / n for k, v in llm_metrics.items() if k.endswith(keep)}


def behaviour_table(metrics_by_method: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Table 3 from each method's evaluate metrics: tool calls, retrieved documents, cited sources,
    utilisation, verification failure rate and calls per question."""
    rows = [{"method": m, **{label: metrics.get(key, float("nan")) for key, label in BEHAVIOUR_COLUMNS.items()}}
            for m, metrics in metrics_by_method.items()]
    return pd.DataFrame(rows).set_index("method")
