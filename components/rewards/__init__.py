"""Rewards over episodes: outcome rewards (EM/F1 with a format penalty), and the methods' shaped rewards
(ARBOR's rubric shaping, RubricEM's stage returns, ARCO's decomposition) as they land."""
