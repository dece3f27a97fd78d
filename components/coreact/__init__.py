"""Co-ReAct: branching-point data, the rubric generator and the inject-verify-retry agent."""
