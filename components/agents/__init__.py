"""Agents over the search tools: ReAct, and (later) Co-ReAct, the RubricEM scaffold and test-time baselines."""
