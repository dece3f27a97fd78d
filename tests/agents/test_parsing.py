import pytest

from components.agents.parsing import parse_turn


@pytest.mark.parametrize("text,kind,arg", [
    ("Thought: need the film.\nAction: search[Nightfall Harbor]", "search", "Nightfall Harbor"),
    ("Thought: x\nAction: Search(Nightfall Harbor)", "search", "Nightfall Harbor"),
    ("Action: search: Nightfall Harbor", "search", "Nightfall Harbor"),
    ('Action: search["Nightfall Harbor"]', "search", "Nightfall Harbor"),
    ("Thought: read it\nAction: browse[w-doc-12]", "browse", "w-doc-12"),
    ("Thought: done\nAction: finish[1987]", "finish", "1987"),
    ("Thought: done\nAction: answer[yes]", "finish", "yes"),
    ('I will call {"tool": "search", "query": "Ossian Threll"}', "search", "Ossian Threll"),
    ('{"action": "finish", "answer": "Kestrow"}', "finish", "Kestrow"),
    ("The director was born there.\nFinal Answer: Kestrow", "finish", "Kestrow"),
    # drafts then corrects: the last action wins
    ("Action: search[Kestrow]\nHmm, no.\nAction: search[Ossian Threll]", "search", "Ossian Threll"),
])
def test_messy_outputs_parse(text, kind, arg):
    parsed = parse_turn(text)
    assert (parsed.kind, parsed.argument) == (kind, arg)
    assert parsed.text == f"{kind}[{arg}]"


def test_thought_is_extracted():
    parsed = parse_turn("Thought: I need the director.\nAction: search[Nightfall Harbor]")
    assert parsed.thought == "I need the director."


@pytest.mark.parametrize("text", ["I am not sure what to do.", "Action: search[]", ""])
def test_unparseable_turns_are_invalid_with_a_reason(text):
    parsed = parse_turn(text)
    assert parsed.kind == "invalid" and parsed.error and parsed.text == ""
