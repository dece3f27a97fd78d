"""What scripted test policies need to read from an agent prompt, in either history format."""

import re


def question_of(messages) -> str:
    return messages[1].content.split("\n", 1)[0].removeprefix("Question: ")


def depth_of(messages) -> int:
    """Steps already taken: assistant turns (chat format) or numbered history lines (scratchpad)."""
    chat = sum(1 for m in messages if m.role == "assistant")
    return chat or len(re.findall(r"^\d+\. Action:", messages[-1].content, flags=re.M))
