"""Where the nano's answers come from: `answer_sources` sorts episodes by right/wrong and by whether a gold answer
was in their observations; `closed_book` scopes each question to another question's paragraphs."""

from components.lab.policy import answer_sources, closed_book
from components.schemas import Question, Step, Trajectory


def _question(i: int, answer: str) -> Question:
    return Question(id=f"q{i}", question=f"Where was person {i} born?", answers=[answer], type="compositional",
                    source="world", split="test", metadata={"paragraph_ids": [f"p{i}a", f"p{i}b"]})


def _episode(q: Question, observation: str, answer: str | None) -> Trajectory:
    return Trajectory(question_id=q.id, question=q.question, final_answer=answer,
                      steps=[Step(index=0, action="search[ x ]", observation=observation)])


def test_each_episode_is_sorted_by_its_answer_and_what_it_was_shown():
    qs = [_question(i, "Port Veyra") for i in range(4)]
    shown, other = "Person was born in Port Veyra.", "Person was born in Lund."
    eps = [_episode(qs[0], shown, "Port Veyra"), _episode(qs[1], other, "port veyra"),
           _episode(qs[2], shown, "Lund"), _episode(qs[3], other, None)]
    assert answer_sources(eps, qs) == {"right_seen": 1, "right_unseen": 1, "wrong_seen": 1, "wrong_unseen": 1}


def test_closed_book_gives_no_question_its_own_paragraphs_and_keeps_the_rest():
    qs = [_question(i, "x") for i in range(3)]
    shut = closed_book(qs)
    assert [q.metadata["paragraph_ids"] for q in shut] == [["p1a", "p1b"], ["p2a", "p2b"], ["p0a", "p0b"]]
    assert [(q.id, q.question, q.answers) for q in shut] == [(q.id, q.question, q.answers) for q in qs]
    assert qs[0].metadata["paragraph_ids"] == ["p0a", "p0b"]  # the originals are untouched
