"""Hand-made scaffold turns and trajectories shared by the RubricEM tests."""

from components.schemas import Question, Step, ToolCall, Trajectory

Q = Question(id="q1", question="Which river flows through the home town of Ossian Threll?", answers=["Ammel"],
             source="world")

PLAN_TEXT = ("<think>Two hops.</think>\n<structured_plan>\n<deep_analysis>Need the town, then its river."
             "</deep_analysis>\n<rubric>- town of Ossian Threll\n- river of that town</rubric>\n"
             "<research_plan>1. search Ossian Threll 2. search the town</research_plan>\n</structured_plan>")
TURN1 = PLAN_TEXT + '\n<call_tool name="search">Ossian Threll</call_tool>'
TURN2 = ("<think>He was born in Kestrow.</think>\n<state_evaluation>Town settled (d-Ossian Threll). River open."
         '</state_evaluation>\n<call_tool name="search">Kestrow</call_tool>')
REVIEW_TEXT = ("<think>All settled.</think>\n<state_evaluation>Both items covered.</state_evaluation>\n<review>\n"
               '<rubric_review>Town: <cite id="d-Ossian Threll">born in Kestrow</cite>; river: '
               '<cite id="d-Kestrow">the Ammel</cite></rubric_review>\n<writing_plan>Answer Ammel.</writing_plan>\n'
               "</review>\n")
TURN3 = REVIEW_TEXT + "<answer>Ammel</answer>"
OBS = ["[1] (d-Ossian Threll) born in Kestrow", "[1] (d-Kestrow) on the river Ammel", ""]
DOCS = ["d-Ossian Threll", "d-Kestrow"]


def hand_trajectory(raws, observations, answer, docs=DOCS, question=Q):
    """Turns ``raws`` with ``observations`` after each non-final turn; the last turn answers ``answer``."""
    steps = [Step(index=i, raw=r, observation=o, final_answer=answer if i == len(raws) - 1 and answer else None,
                  tool_call=ToolCall(name="search", observation=o) if o else None)
             for i, (r, o) in enumerate(zip(raws, observations))]
    return Trajectory(question_id=question.id, question=question.question, steps=steps, final_answer=answer,
                      docs_seen=docs, finish_reason="answer" if answer else "max_turns")


def episode_trajectory(marker: str, answer: str = "Ammel", review: bool = True, question=Q) -> Trajectory:
    """A full three-turn episode whose plan thinks ``marker`` (to tell attempts apart in judge prompts)."""
    last = (TURN3 if review else "<think>Done.</think>\n<state_evaluation>ok</state_evaluation>\n<answer>Ammel</answer>")
    raws = [TURN1.replace("Two hops.", f"Two hops. {marker}"), TURN2, last.replace("Ammel", answer)]
    return hand_trajectory(raws, OBS, answer, question=question)
