"""The one clipping helper: text within budget unchanged, the mark after a cut, the budget kept when the mark is
counted in it, and the head-and-tail form keeping both ends."""

from components.clipping import clip, clip_middle


def test_clip_leaves_text_within_the_budget_alone_and_marks_a_cut():
    assert clip("short", 5) == "short"
    assert clip("abcdef  ghij", 8) == "abcdef [...]"          # cut at 8, trailing spaces dropped, then the mark
    assert clip("abcdefghij", 4, " [truncated]") == "abcd [truncated]"


def test_clip_with_the_mark_within_the_budget_never_exceeds_it():
    text = "x" * 50
    out = clip(text, 20, " ...[truncated]", marker_within=True)
    assert out == "xxxxx ...[truncated]" and len(out) == 20
    assert clip("x" * 20, 20, " ...", marker_within=True) == "x" * 20
    assert clip("x" * 21, 20, " ...", marker_within=True) == "x" * 16 + " ..."
    assert clip("abcdef", 3, " ...", marker_within=True) == " ..."  # a budget smaller than the mark keeps only it


def test_clip_middle_keeps_both_ends():
    assert clip_middle("0123456789", 10) == "0123456789"
    assert clip_middle("0123456789abc", 6) == "012\n[...]\nabc"
    assert clip_middle("0123456789", 1) == "\n[...]\n"         # half a character of each end is nothing, not all
