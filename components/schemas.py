"""Typed records that cross stage boundaries (JSONL / Parquet files), as pydantic v2 models.

Every field carries a description; unknown fields are rejected so a misspelt key in a data file is an
error that names the field (see ``components.io``). Records are plain data: no behaviour beyond small
derived properties.

    from components.schemas import Question
    q = Question(id="w-1", question="...", answers=["Paris"], source="world")
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

QuestionType = Literal["bridge", "comparison", "inference", "compositional", "other"]
Stage = Literal["plan", "research", "review", "answer"]


class Record(BaseModel):
    """Base for every record: strict about unknown keys, tolerant of numeric coercion."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class SubQuestion(Record):
    """One hop of a question's gold reasoning chain."""

    question: str = Field(description="The single-hop question answered at this hop.")
    answer: str = Field(description="The gold answer of this hop (feeds the next hop).")
    doc_id: str | None = Field(default=None, description="Id of the paragraph that states the answer.")


class Question(Record):
    """A question with its gold answers, from the embedded world or a benchmark."""

    id: str = Field(description="Stable id, unique within a data source.")
    question: str = Field(description="The question text shown to the agent.")
    answers: list[str] = Field(min_length=1, description="Gold answers; the first is canonical, the rest aliases.")
    type: QuestionType = Field(default="other", description="Reasoning type (bridge, comparison, ...).")
    source: str = Field(description="Data source: 'world', 'hotpotqa', '2wikimultihopqa', 'musique', 'bamboogle'.")
    split: str = Field(default="dev", description="train / dev / test.")
    supporting_doc_ids: list[str] = Field(default_factory=list, description="Ids of the gold supporting paragraphs.")
    gold_chain: list[SubQuestion] = Field(default_factory=list, description="Gold sub-questions in hop order.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Source-specific extras (level, hops, ...).")


class Document(Record):
    """A titled paragraph of the retrieval corpus."""

    id: str = Field(description="Stable document id (unique in the corpus).")
    title: str = Field(description="Title, e.g. the entity the paragraph is about.")
    text: str = Field(description="Paragraph text.")
    source: str = Field(default="", description="Where the paragraph came from.")


class SearchHit(Record):
    """One result of the ``search`` tool."""

    doc_id: str = Field(description="Id of the retrieved document.")
    title: str = Field(description="Document title.")
    snippet: str = Field(description="Leading part of the text shown to the agent.")
    score: float = Field(description="Retriever score (higher is better; scale depends on the retriever).")


class ToolCall(Record):
    """A tool invocation made by the agent and what it returned."""

    name: str = Field(description="Tool name: 'search' or 'browse'.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Parsed arguments, e.g. {'query': ...}.")
    observation: str = Field(default="", description="Text returned to the agent (after truncation).")
    doc_ids: list[str] = Field(default_factory=list, description="Documents the call returned or opened.")
    error: str | None = Field(default=None, description="Tool error shown to the agent, if any.")


class Step(Record):
    """One reason/act/observe turn of an agent."""

    index: int = Field(ge=0, description="0-based turn number.")
    raw: str = Field(default="", description="The policy's raw output for this turn.")
    thought: str = Field(default="", description="Reasoning text extracted from the output.")
    action: str = Field(default="", description="Normalised action string, e.g. 'search[Nightfall Harbor]'.")
    tool_call: ToolCall | None = Field(default=None, description="The tool call, if the action called a tool.")
    observation: str = Field(
        default="", description="What the policy was shown after this turn: tool output, format reminder or budget note."
    )
    final_answer: str | None = Field(default=None, description="Answer, if this turn answered.")
    parse_error: str | None = Field(default=None, description="Why the output could not be parsed, if it could not.")
    stage: Stage | None = Field(default=None, description="RubricEM stage of this turn, when staged.")
    rubric: str | None = Field(default=None, description="Rubric injected before this turn (Co-ReAct), if any.")
    prompt_tokens: int = Field(default=0, ge=0, description="Prompt tokens of the policy call.")
    completion_tokens: int = Field(default=0, ge=0, description="Completion tokens of the policy call.")
    latency_s: float = Field(default=0.0, ge=0, description="Wall time of the policy call plus tool call.")


class Trajectory(Record):
    """A full agent episode on one question."""

    question_id: str = Field(description="Id of the question answered.")
    question: str = Field(description="Question text.")
    steps: list[Step] = Field(default_factory=list, description="Turns in order.")
    final_answer: str | None = Field(default=None, description="The answer given, or None if none was given.")
    finish_reason: Literal["answer", "max_turns", "search_budget", "llm_failure", "error"] = Field(
        default="answer", description="Why the episode ended."
    )
    docs_seen: list[str] = Field(default_factory=list, description="Unique doc ids returned by tools, in order.")
    policy: str = Field(default="", description="Role/model that acted.")
    prompt_tokens: int = Field(default=0, ge=0, description="Sum over steps.")
    completion_tokens: int = Field(default=0, ge=0, description="Sum over steps.")
    wall_s: float = Field(default=0.0, ge=0, description="Episode wall time.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Method-specific extras.")

    @property
    def n_tool_calls(self) -> int:
        return sum(1 for s in self.steps if s.tool_call is not None)

    def without_timings(self) -> Trajectory:
        """This episode with its wall-clock fields zeroed: what a versioned output stores, so that a re-run
        that replays the same calls writes the same bytes (timings go to the stage's timings.json)."""
        return self.model_copy(update={"wall_s": 0.0, "steps": [s.model_copy(update={"latency_s": 0.0})
                                                                  for s in self.steps]})


class Candidate(Record):
    """One sampled next action at a branching point, with provenance."""

    action: str = Field(description="Normalised action string.")
    raw: str = Field(default="", description="Raw policy output that produced it.")
    model: str = Field(description="Candidate-policy role/model that sampled it.")
    temperature: float = Field(ge=0, description="Sampling temperature.")
    sample_index: int = Field(default=0, ge=0, description="Index among samples with the same model and temperature.")


class JudgeVote(Record):
    """One council judge's listwise ranking of a slate."""

    judge: str = Field(description="Judge role/model name.")
    permutation: list[int] = Field(description="permutation[j] = slate position shown under the j-th neutral label.")
    labels: list[str] = Field(description="Neutral labels shown, in order (e.g. X, Y, Z, W).")
    ranking: list[list[int]] = Field(
        default_factory=list,
        description="Slate positions from best to worst; an inner list with several items is a tie.",
    )
    rationale: str = Field(default="", description="The judge's stated reason.")
    valid: bool = Field(description="Whether the ranking parsed as a full ranking of the slate.")
    error: str | None = Field(default=None, description="Parse or call error when not valid.")
    latency_s: float = Field(default=0.0, ge=0, description="Wall time of the judge call.")


class BranchingPoint(Record):
    """A prefix of a trajectory with a candidate pool, a slate and the council's consensus."""

    question_id: str = Field(description="Question the prefix belongs to.")
    question: str = Field(description="Question text.")
    depth: int = Field(ge=0, description="Number of committed steps in the prefix.")
    prefix: list[Step] = Field(default_factory=list, description="Committed steps before this point.")
    candidates: list[Candidate] = Field(default_factory=list, description="The whole sampled pool.")
    slate: list[int] = Field(default_factory=list, description="Indices into candidates chosen by MMR.")
    votes: list[JudgeVote] = Field(default_factory=list, description="Per-judge rankings.")
    consensus: list[int] = Field(default_factory=list, description="Slate positions ordered by Borda, best first.")
    borda_scores: list[float] = Field(default_factory=list, description="Borda score per slate position.")
    n_distinct: int = Field(default=0, ge=0, description="Distinct actions in the pool after de-duplication.")
    kept: bool = Field(default=True, description="Whether the point enters the training set.")
    drop_reason: str | None = Field(
        default=None, description="Why it was dropped: too_few_distinct, too_few_valid_judges, final_answer."
    )
    committed: int | None = Field(default=None, description="Index into candidates of the action executed next.")


class Criterion(Record):
    """One checkable item of a rubric."""

    text: str = Field(description="What a good action or answer satisfies.")
    weight: float = Field(default=1.0, ge=0, description="Relative importance.")
    kind: str = Field(default="", description="Optional tag: 'process', 'outcome', 'negative', ...")
    stage: int | None = Field(default=None, description="What part of a trajectory it judges: RubricEM's scaffold "
                              "stage (0 plan .. 3 answer) or ARCO's step index; None: the whole trajectory, or "
                              "the next action (Co-ReAct).")

    @model_serializer(mode="wrap")
    def _stage_when_set(self, handler):
        out = handler(self)
        if self.stage is None:  # records written before criteria had a stage read and write the same bytes
            out.pop("stage", None)
        return out


class Rubric(Record):
    """A set of weighted criteria: the one rubric type every method can express its rubrics in (Co-ReAct's
    generator writes it directly; ARBOR's memory, RubricEM's judge buffers and ARCO's step criteria convert to
    it for the per-step rubric logs, ``rubrics/step_N.jsonl`` of a training run)."""

    id: str = Field(default="", description="Stable id when stored.")
    criteria: list[Criterion] = Field(default_factory=list, description="The criteria.")
    source: str = Field(default="", description="Provenance: who produced it (generator role, ARBOR memory pool, "
                        "RubricEM judge buffer, ARCO's mu) and for what.")
    raw: str = Field(default="", description="Raw generator text, kept for audit.")

