"""The ``agent`` section of params.yaml (the ReAct loop's budgets and prompt form, components/agents/react.py) and the
model of one ``methods`` entry (an agent, its role rebindings, its options). A pydantic leaf (it imports only
``params_section``), composed in ``components.params.Params``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from components.params_section import Section


class AgentParams(Section):
    max_turns: int = Field(default=8, ge=1, description="Turn budget per episode.")
    max_search_calls: int = Field(default=5, ge=1, description="Tool-call budget per episode.")
    observation_max_chars: int = Field(default=1200, ge=50, description="Observation truncation.")
    max_tokens: int = Field(default=256, ge=8, description="Completion tokens per policy turn.")
    temperature: float = Field(default=0.0, ge=0, le=2, description="Policy temperature at evaluation.")
    force_answer: bool = Field(
        default=True,
        description="When the turn or search budget ends without an answer, make one more policy call that "
        "must answer (the episode keeps its finish reason; metadata.forced_answer marks it).",
    )
    history_format: Literal["chat", "scratchpad"] = Field(
        default="chat",
        description="How earlier turns are shown: as chat turns, or as one numbered history in a fresh user "
        "message (helps small models that copy their own earlier turns).",
    )


class MethodParams(Section):
    """One evaluable method: an agent from the agent registry, the roles it rebinds, and its options."""

    agent: str = Field(default="react", description="Agent registry name (or a dotted import path).")
    roles: dict[str, str] = Field(default_factory=dict, description="Role -> backend rebindings for this method.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the agent.")
    description: str = Field(default="", description="What the method is, for reports and the UI.")
