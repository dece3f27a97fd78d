"""The rubric memory as a state machine driven by scripted scores: admission, the consolidation trigger and
de-duplication, both retirement rules, capacity replacement by cumulative variance with maturity, LRU
rotation, serialisation (and snapshots without the cumulative variance)."""

import json

import numpy as np
import pytest

from components.methods.arbor.params import ArborParams
from components.methods.arbor.memory import CommonRubric, GroupRecord, RubricMemory, RubricText

F1 = [1.0, 0.5, 0.0]
GOOD = [1.0, 0.5, 0.0]        # variance 1/6, Pearson +1 with F1
FLAT = [0.5, 0.5, 0.5]        # variance 0
BACKWARDS = [0.0, 0.5, 1.0]   # Pearson -1


def rt(title):
    return RubricText(title=title, description=f"{title} done well", counter_description=f"{title} done badly")


class FakeEmbed:
    """Title -> vector; unknown titles get their own axis (orthogonal to everything else)."""

    def __init__(self, vectors=None):
        self.vectors = dict(vectors or {})
        self.calls = 0

    def __call__(self, texts):
        self.calls += 1
        out = []
        for t in texts:
            title = t.split(".")[0]
            if title not in self.vectors:
                v = np.zeros(32)
                v[len(self.vectors)] = 1.0
                self.vectors[title] = v
            out.append(self.vectors[title])
        return np.stack(out)


def memory(**overrides):
    return RubricMemory(ArborParams(**overrides), embed=FakeEmbed())


def drafts_record(*scores_list, f1=F1, qid="q1"):
    return GroupRecord(qid, f"question {qid}", list(f1), {}, [(rt(f"draft{k}"), s) for k, s in enumerate(scores_list)])


def add_common(m, title, step=1):
    m.consolidate([rt(title)], step)
    return m.common[-1].id


# ---------------------------------------------------------------- admission


def test_admission_needs_variance_and_non_negative_correlation():
    m = memory(k_consol=100)
    events = m.apply_step(1, [], [drafts_record(GOOD, FLAT, BACKWARDS, [1.0, None, None])])
    assert events.admitted == 1
    assert events.rejected == {"low_variance": 1, "low_correlation": 1, "unscored": 1}
    (d,) = m.drafts
    assert d.rubric.title == "draft0" and d.variance == pytest.approx(1 / 6) and d.pearson == pytest.approx(1.0)
    assert (d.question_id, d.step) == ("q1", 1)


def test_admission_thresholds_are_inclusive_and_constant_f1_checks_variance_only():
    m = memory(delta_v=1 / 6, rho_min=1.0)
    assert m.admission(GOOD, F1).admitted  # variance exactly delta_v, Pearson exactly rho_min
    assert m.admission([1.0, 0.5, 0.25], F1).reason == "low_variance"
    flat_f1 = [0.5, 0.5, 0.5]  # the unlabelled-induction case: correlation undefined
    result = memory().admission(BACKWARDS, flat_f1)
    assert result.admitted and result.pearson is None


# ---------------------------------------------------------------- consolidation


def test_consolidation_triggers_at_k_consol_drafts_and_clears_the_candidate_pool():
    m = memory(k_consol=3)
    m.apply_step(1, [], [drafts_record(GOOD, GOOD)])
    assert len(m.drafts) == 2 and not m.needs_consolidation()
    m.apply_step(2, [], [drafts_record(GOOD, qid="q2")])
    assert len(m.drafts) == 3 and m.needs_consolidation()
    sources = [d.id for d in m.drafts]
    events = m.consolidate([rt("Targeted queries"), rt("Stops on evidence")], step=2)
    assert m.drafts == [] and not m.needs_consolidation()
    assert [r.rubric.title for r in m.common] == ["Targeted queries", "Stops on evidence"]
    assert events.added == [r.id for r in m.common] and m.common[0].sources == sources
    assert m.totals["consolidations"] == 1


def test_consolidated_rubrics_too_close_to_the_pool_or_each_other_are_dropped():
    base = np.zeros(32)
    base[0] = 1.0

    def near(cos):
        v = np.zeros(32)
        v[0], v[1] = cos, np.sqrt(1 - cos**2)
        return v

    embed = FakeEmbed({"Old": base, "Same idea": near(0.95), "Edge": near(0.9), "Different": near(0.89)})
    m = RubricMemory(ArborParams(), embed=embed)
    add_common(m, "Old")
    events = m.consolidate([rt("Same idea"), rt("Edge"), rt("Different"), rt("Different")], step=3)
    assert events.duplicates == 3  # cosine 0.95 and exactly 0.9 with Old; the second Different with the first
    assert [r.rubric.title for r in m.common] == ["Old", "Different"]


# ---------------------------------------------------------------- activations and retirement


def activate(m, step, rubric_id, scores, f1=F1):
    return m.apply_step(step, [rubric_id], [GroupRecord("q", "q", list(f1), {rubric_id: list(scores)}, [])])


def test_kappa_consecutive_low_variance_activations_are_tolerated_and_one_more_retires():
    m = memory(kappa=5)
    rid = add_common(m, "R")
    for step in range(1, 6):
        assert activate(m, step, rid, FLAT).retired == []
    assert m.get(rid).low_var_streak == 5
    events = activate(m, 6, rid, FLAT)
    assert events.retired == [(rid, "low_variance")] and m.common == []
    assert m.retired[0].retired_reason == "low_variance" and m.retired[0].retired_step == 6


def test_the_low_variance_count_is_per_step_not_per_group():
    """ARBOR activates two rubrics a step and tolerates kappa = 5 low-variance activations: a step of many flat
    groups counts once (per group, a 32-prompt batch would retire a rubric inside its first step); a step whose
    groups' mean variance reaches delta_v resets the count, however many of them were flat."""
    m = memory(kappa=5)
    rid = add_common(m, "R")
    flat = [GroupRecord(f"q{i}", "q", list(F1), {rid: list(FLAT)}, []) for i in range(8)]
    assert m.apply_step(1, [rid], flat).retired == [] and m.get(rid).low_var_streak == 1 and m.get(rid).uses == 8
    good = [GroupRecord("g", "q", list(F1), {rid: list(GOOD)}, [])]
    m.apply_step(2, [rid], flat[:2] + good)  # mean variance (0 + 0 + 1/6) / 3 >= 0.05
    assert m.get(rid).low_var_streak == 0
    m.apply_step(3, [rid], flat[:4] + good)  # (1/6) / 5 < 0.05: a low-variance step despite the good group
    assert m.get(rid).low_var_streak == 1


def test_a_discriminating_activation_resets_the_low_variance_count():
    m = memory(kappa=2)
    rid = add_common(m, "R")
    for step, scores in enumerate([FLAT, FLAT, GOOD, FLAT, FLAT], 1):
        activate(m, step, rid, scores)
    assert m.get(rid).low_var_streak == 2 and m.get(rid).uses == 5


def test_negative_cumulative_correlation_retires_and_undefined_correlation_does_not():
    m = memory()
    rid = add_common(m, "R")
    assert activate(m, 1, rid, GOOD, f1=[0.0, 0.0, 0.0]).retired == []  # F1 constant: rho undefined
    assert m.get(rid).rho is None
    assert activate(m, 2, rid, GOOD).retired == []  # pooled pairs: rho > 0
    # a strongly reversed activation drags the cumulative correlation below rho_min = 0
    events = activate(m, 3, rid, [0.0, 0.0, 1.0], f1=[1.0, 1.0, 0.0])
    assert events.retired == [(rid, "low_correlation")]
    xs = [1, .5, 0, 1, .5, 0, 0, 0, 1]
    ys = [0, 0, 0, 1, .5, 0, 1, 1, 0]
    assert m.retired[0].rho == pytest.approx(np.corrcoef(xs, ys)[0, 1])


def test_activation_with_nothing_scored_changes_no_statistic():
    m = memory()
    rid = add_common(m, "R")
    activate(m, 1, rid, [None, None, None])
    assert m.get(rid).uses == 0 and m.get(rid).last_used_step == 1


# ---------------------------------------------------------------- capacity and maturity


def test_full_pool_replaces_only_a_mature_rubric_with_the_lowest_cumulative_variance():
    m = memory(max_common=2, maturity_activations=3, kappa=10)
    a, b = add_common(m, "A"), add_common(m, "B")
    events = m.consolidate([rt("C")], step=1)
    assert events.dropped_full == 1 and [r.id for r in m.common] == [a, b]  # nobody mature yet
    for step in range(2, 5):
        m.apply_step(step, [a, b], [GroupRecord("q", "q", F1, {a: GOOD, b: [0.75, 0.5, 0.25]}, [])])
    assert m.get(a).variance_sum == pytest.approx(3 / 6) and m.get(b).variance_sum == pytest.approx(3 / 24)
    events = m.consolidate([rt("D")], step=5)
    assert events.replaced == [b] and [r.rubric.title for r in m.common] == ["A", "D"]
    assert m.retired[-1].id == b and m.retired[-1].retired_reason == "replaced"


WIDE = [1.0, 0.25, 0.25]  # variance 1/8, Pearson > 0 with F1


def test_capacity_ranks_on_cumulative_variance_where_the_mean_would_pick_the_other_rubric():
    """ARBOR 3.3: the full pool replaces the entry with the lowest *cumulative* within-group variance. A was
    activated twice with variance 1/6 (sum 1/3, mean 1/6); B four times with variance 1/8 (sum 1/2, mean
    1/8). The mean would replace B; the cumulative rule replaces A."""
    m = memory(max_common=2, maturity_activations=2, kappa=10)
    a, b = add_common(m, "A"), add_common(m, "B")
    for step in (1, 2):
        m.apply_step(step, [a, b], [GroupRecord("q", "q", F1, {a: GOOD, b: WIDE}, [])])
    for step in (3, 4):
        m.apply_step(step, [b], [GroupRecord("q", "q", F1, {b: WIDE}, [])])
    ra, rb = m.get(a), m.get(b)
    assert (ra.uses, rb.uses) == (2, 4) and m.retired == []
    assert ra.mean_variance == pytest.approx(1 / 6) and rb.mean_variance == pytest.approx(1 / 8)
    assert ra.cumulative_variance == pytest.approx(1 / 3) and rb.cumulative_variance == pytest.approx(1 / 2)
    assert min([ra, rb], key=lambda r: r.mean_variance).id == b  # what a mean-variance rule would replace
    events = m.consolidate([rt("C")], step=5)
    assert events.replaced == [a] and [r.rubric.title for r in m.common] == ["B", "C"]
    assert m.retired[-1].id == a and m.retired[-1].retired_reason == "replaced"
    # the sum survives a snapshot, so a resumed run ranks the same way
    copy = memory(max_common=2, maturity_activations=2, kappa=10)
    copy.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert copy.get(b).cumulative_variance == pytest.approx(1 / 2)


def test_an_equal_cumulative_variance_replaces_the_older_rubric():
    m = memory(max_common=2, maturity_activations=1, kappa=10)
    a = add_common(m, "A", step=1)
    b = add_common(m, "B", step=2)
    m.apply_step(3, [a, b], [GroupRecord("q", "q", F1, {b: GOOD, a: GOOD}, [])])
    assert m.consolidate([rt("C")], step=4).replaced == [a]


def test_a_mature_rubric_is_replaced_but_not_a_young_one_beside_it():
    m = memory(max_common=2, maturity_activations=2, kappa=10)
    a, b = add_common(m, "A"), add_common(m, "B")
    for step in (1, 2):  # A matures with the higher variance; B stays young with variance 0
        m.apply_step(step, [a], [GroupRecord("q", "q", F1, {a: GOOD}, [])])
    m.apply_step(3, [b], [GroupRecord("q", "q", F1, {b: [0.5, 0.5, 0.5]}, [])])
    m.consolidate([rt("C")], step=4)
    assert [r.rubric.title for r in m.common] == ["B", "C"]


# ---------------------------------------------------------------- active selection


def with_rho(m, title, xs, ys):
    rid = add_common(m, title)
    m.get(rid).corr.add(xs, ys)
    return rid


def test_top_correlation_holds_one_slot_and_the_other_rotates_least_recently_used():
    m = memory(active_rubrics=2)
    assert m.choose_active() == []  # empty P: the step keeps the base reward
    c1 = with_rho(m, "R1", [0, 1, 1], [0, 1, 1])          # rho 1
    c2 = with_rho(m, "R2", [0, 1, 0, 1], [0, 1, 1, 1])    # rho ~0.58
    c3 = with_rho(m, "R3", [0, 1, 0, 0], [0, 1, 1, 1])    # rho ~0.33
    c4 = add_common(m, "R4")                               # never activated: rho undefined
    picks = []
    for step in range(1, 6):
        active = [r.id for r in m.choose_active()]
        picks.append(active)
        m.apply_step(step, active, [])
    assert picks == [[c1, c2], [c1, c3], [c1, c4], [c1, c2], [c1, c3]]
    assert m.get(c2).last_used_step == 4 and m.get(c4).last_used_step == 3


def test_a_single_common_rubric_is_activated_alone():
    m = memory(active_rubrics=2)
    rid = add_common(m, "Only")
    assert [r.id for r in m.choose_active()] == [rid]


# ---------------------------------------------------------------- state


def test_state_round_trips_through_json():
    m = memory(k_consol=100)
    a = with_rho(m, "R1", [0, 1, 1], [0, 1, 1])
    m.apply_step(1, [a], [drafts_record(GOOD)])
    state = json.loads(json.dumps(m.state_dict()))
    copy = memory(k_consol=100)
    copy.load_state_dict(state)
    assert copy.state_dict() == m.state_dict()
    assert [r.id for r in copy.choose_active()] == [a] and copy.get(a).rho == pytest.approx(1.0)
    assert copy._new_id("c") == m._new_id("c")
    with pytest.raises(ValueError, match="version"):
        copy.load_state_dict({**state, "version": 99})


def test_a_snapshot_entry_without_its_cumulative_variance_gets_it_from_its_score_sums():
    """Every snapshot written so far holds ``variance_sum``; an entry lacking it is estimated as uses x the
    pooled variance of its scores, never below the true sum when the groups have equal sizes."""
    m = memory(k_consol=100, kappa=10)
    a, b, idle = add_common(m, "A"), add_common(m, "B"), add_common(m, "Idle")
    m.apply_step(1, [a, b], [GroupRecord("q", "q", F1, {a: GOOD, b: GOOD}, [])])
    m.apply_step(2, [a, b], [GroupRecord("q", "q", F1, {a: GOOD, b: [0.5, 0.25, 0.0]}, [])])
    state = json.loads(json.dumps(m.state_dict()))
    for entry in state["common"]:
        del entry["variance_sum"]
    copy = memory(k_consol=100, kappa=10)
    copy.load_state_dict(state)
    # A scored the same way twice: no spread between its group means, the estimate is exact
    assert copy.get(a).variance_sum == pytest.approx(m.get(a).variance_sum) == pytest.approx(1 / 3)
    # B's groups have different means: the estimate adds that spread, so it is above the true sum
    pooled = float(np.var(GOOD + [0.5, 0.25, 0.0]))
    assert copy.get(b).variance_sum == pytest.approx(2 * pooled) and copy.get(b).variance_sum > m.get(b).variance_sum
    assert copy.get(idle).variance_sum == 0.0 and copy.get(idle).uses == 0
    assert CommonRubric.model_validate({"id": "c9", "rubric": rt("x").model_dump(), "created_step": 1,
                                        "uses": 3}).variance_sum == 0.0  # no scored pairs: nothing to derive


def test_common_rubric_records_are_strict():
    with pytest.raises(ValueError, match="colour"):
        CommonRubric.model_validate({"id": "c1", "rubric": rt("x").model_dump(), "created_step": 1, "colour": 1})
