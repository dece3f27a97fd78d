"""The nano policy: a deterministic tokenizer fitted to the world's text, a chat template that renders what the lab
agent's SFT rows were rendered with, compact oracle episodes in the ReAct protocol, SFT through the project's
trainer with the same weights for the same seed, and GRPO steps through the project's trainer."""

from __future__ import annotations

import re

import pytest
import torch

from components.agents.parsing import parse_turn
from components.lab.nano import fit_tokenizer, nano_qwen2, token_classes
from components.lab.policy import (
    NanoPolicy,
    evaluate,
    grpo_questions,
    grpo_run,
    grpo_source,
    sft_corpus,
    sft_questions,
    train_nano,
)
from components.lab.world import LAB_PROMPT, build_lab_world, compact_episodes, render_chat, sft_rows
from components.llm.base import assistant, system, user
from components.params_load import load_params
from components.training.grpo.episodes import RewardOutput

TINY = ["lab.sft_protocols=[react]", "lab.grpo_worlds=0", "lab.sft_document_rows=0", "data.n_train=6", "data.n_dev=2", "data.n_test=2", "lab.sft_worlds=1", "lab.sft_questions_per_world=12",
        "lab.nano.vocab_size=400", "lab.nano.hidden_size=32", "lab.nano.num_layers=1", "lab.nano.num_heads=2",
        "lab.nano.num_kv_heads=1", "lab.nano.intermediate_size=64", "sft.max_steps=2", "sft.batch_size=4",
        "sft.micro_batch_size=2", "sft.warmup_steps=1", "agent.max_tokens=8",
        "grpo.group_size=2", "grpo.prompts_per_step=2", "grpo.lr=1.0e-2"]


@pytest.fixture(scope="module")
def params():
    return load_params("params.yaml", overlays=["lab"], overrides=TINY)


@pytest.fixture(scope="module")
def corpus(params):
    return sft_corpus(params)


def test_compact_episodes_are_react_turns_that_the_parser_reads_as_planned(params):
    lab = build_lab_world(params, params.seed + 1, 12)
    episodes, skipped = compact_episodes(lab, lab.questions, params.agent)
    assert len(episodes) + skipped["skipped"] == 12 and len(episodes) >= 10
    for traj, q in episodes:
        assert traj.final_answer in q.answers
        for step in traj.steps:
            parsed = parse_turn(step.raw)
            assert parsed.text == step.action and len(parsed.thought.split()) <= 6
    rows = sft_rows(episodes, params.agent)
    assert len(rows) == len(episodes)  # chat history: one row per episode
    for row in rows:
        assert row[0][0].startswith(f"<|system|>{LAB_PROMPT}<|end|>") and not row[0][1]
        trained = [text for text, trainable in row if trainable]
        assert all(t.startswith("Thought: ") and t.endswith("]<|end|>\n") for t in trained)
        assert not any("Observation:" in t for t in trained)


def test_the_tokenizer_is_fitted_deterministically_and_encodes_any_name(corpus):
    texts = ["".join(t for t, _ in row) for row in corpus.rows]
    a, b = fit_tokenizer(texts, 400), fit_tokenizer(texts, 400)
    assert a.get_vocab() == b.get_vocab() and len(a) == 400
    unseen = "Question: Where was Zyxqorth Blaventine born?"
    assert a.decode(a.encode(unseen)) == unseen
    assert a.decode(a.encode(texts[0])) == texts[0]
    assert len(a.encode(texts[0])) < len(texts[0]) / 2  # fitted: the world's words are a few tokens each
    messages = [system("s"), user("Question: q"), assistant("Thought: t\nAction: finish[x]"), user("Observation: o")]
    for gen in (False, True):
        assert a.apply_chat_template([m.model_dump() for m in messages], tokenize=False,
                                     add_generation_prompt=gen) == render_chat(messages, gen)


def test_the_same_seed_gives_the_same_weights(params, corpus):
    one, two, other = (train_nano(params, corpus, seed=s) for s in (0, 0, 1))
    for (k, v), (_, w) in zip(one.model.state_dict().items(), two.model.state_dict().items()):
        assert torch.equal(v, w), k
    assert not all(torch.equal(v, w) for v, w in zip(one.model.state_dict().values(),
                                                      other.model.state_dict().values()))
    assert one.info["sft_steps"] == 2 and one.info["final_loss"] < 7.0
    fresh = nano_qwen2(params.lab.nano, one.tokenizer, seed=0)
    assert not torch.equal(fresh.model.embed_tokens.weight, one.model.model.embed_tokens.weight)  # it trained


def test_saved_and_loaded_policy_evaluates_and_grpo_updates_it(params, corpus, tmp_path):
    nano = train_nano(params, corpus, seed=0)
    loaded = NanoPolicy.load(nano.save(tmp_path / "sft"))
    assert loaded.tokenizer.get_vocab() == nano.tokenizer.get_vocab()
    lab = build_lab_world(params, params.seed)
    result = evaluate(loaded, lab, lab.splits["test"], params.agent)
    assert result["n"] == 2 and 0.0 <= result["em"] <= 1.0
    before = [p.detach().clone() for p in loaded.model.parameters()]

    def longer(episodes, ctx):  # any reward that differs within a group makes the trainer update
        return RewardOutput([float(e.info["episode"] % 2) for e in episodes])

    curve = grpo_run(params, loaded, lab, seed=0, steps=1, eval_every=1, reward=longer)
    assert [p["step"] for p in curve] == [0.0, 1.0]
    assert {"dev_em", "reward", "time/rollout", "time/update"} <= set(curve[-1])
    assert any(not torch.equal(a, b) for a, b in zip(before, loaded.model.parameters()))


def test_embedding_std_sets_the_tied_embeddings_scale_and_is_seeded(params, corpus):
    tok = fit_tokenizer(["".join(t for t, _ in row) for row in corpus.rows], 400)
    wide = params.lab.nano.model_copy(update={"embedding_std": 0.5})
    a, b = nano_qwen2(wide, tok, seed=3), nano_qwen2(wide, tok, seed=3)
    default = nano_qwen2(params.lab.nano.model_copy(update={"embedding_std": None, "class_direction": 0.0}), tok, seed=3)
    emb = a.get_input_embeddings().weight
    assert torch.equal(emb, b.get_input_embeddings().weight)
    assert abs(emb.std().item() - 0.5) < 0.05 and default.get_input_embeddings().weight.std().item() < 0.05
    assert a.get_output_embeddings().weight.data_ptr() == emb.data_ptr()  # tied: the LM head has the same scale


def test_a_name_and_a_document_id_are_one_token_each(corpus):
    tok = fit_tokenizer(["".join(t for t, _ in row) for row in corpus.rows] + corpus.documents, 4096)
    text = "".join(t for t, _ in corpus.rows[0])
    ids = re.findall(r"wd-\d+", text)
    assert ids and all(len(tok.encode(i, add_special_tokens=False)) == 1 for i in ids)
    assert len(tok.encode(" Corus Ulawyn", add_special_tokens=False)) <= 3  # unseen: a few pieces, still encodes


def test_opening_worlds_add_only_each_questions_first_turn(params):
    base = sft_corpus(params)
    more = sft_corpus(params.model_copy(update={"lab": params.lab.model_copy(update={"sft_opening_worlds": 1})}))
    extra = more.rows[len(base.rows):]
    assert more.rows[:len(base.rows)] == base.rows and more.episodes == base.episodes
    assert len(extra) == more.counts["opening_rows"] >= 10
    for (prompt, p_trainable), (reply, r_trainable) in extra:
        assert prompt.endswith("<|assistant|>") and "Observation" not in prompt and not p_trainable
        assert r_trainable and parse_turn(reply.removesuffix("<|end|>\n")).text.startswith("search[")


def test_class_direction_gives_the_names_a_shared_direction_at_init(params, corpus):
    tok = fit_tokenizer(["".join(t for t, _ in row) for row in corpus.rows] + corpus.documents, 600)
    classes = token_classes(tok)
    assert all(tok.decode([i]).startswith(" ") and tok.decode([i])[1].isupper() for i in classes["name"])
    assert classes["name"] and classes["number"] and not set(classes["name"]) & set(classes["number"])

    def mean_cosine(model, ids):
        e = torch.nn.functional.normalize(model.get_input_embeddings().weight[ids].detach(), dim=1)
        return ((e @ e.T).sum() - len(ids)) / (len(ids) * (len(ids) - 1))

    shared = params.lab.nano.model_copy(update={"embedding_std": 0.1, "class_direction": 1.0})
    plain = params.lab.nano.model_copy(update={"embedding_std": 0.1, "class_direction": 0.0})
    names = classes["name"]
    assert mean_cosine(nano_qwen2(shared, tok, seed=0), names) > 0.3 > 0.05 > abs(
        mean_cosine(nano_qwen2(plain, tok, seed=0), names))
    e = torch.nn.functional.normalize(nano_qwen2(shared, tok, seed=0).get_input_embeddings().weight.detach(), dim=1)
    assert abs((e[names] @ e[classes["number"]].T).mean()) < 0.2  # one direction per class, not one for all


def test_sft_own_questions_holds_the_rest_of_the_train_split_out_for_grpo(params):
    lab = build_lab_world(params, params.seed)
    train = lab.splits["train"]
    assert sft_questions(params.lab, lab) == train and grpo_questions(params.lab, lab) == train  # None: both read all
    held = params.model_copy(update={"lab": params.lab.model_copy(update={"sft_own_questions": 4})})
    assert sft_questions(held.lab, lab) == train[:4] and grpo_questions(held.lab, lab) == train[4:]
    assert not {q.id for q in sft_questions(held.lab, lab)} & {q.id for q in grpo_questions(held.lab, lab)}
    rows = sft_corpus(held).rows
    assert not any(q.question in row[0][0] for q in train[4:] for row in rows)  # GRPO's questions never SFT rows
    assert any(q.question in row[0][0] for q in train[:4] for row in rows)


def test_document_rows_add_each_worlds_paragraphs_trained_whole(params, corpus):
    """lab.sft_document_rows: k copies of every paragraph of the worlds the SFT reads, one segment trained whole;
    off (0) leaves the episode rows as they are."""
    k = 2
    more = sft_corpus(params.model_copy(update={"lab": params.lab.model_copy(update={"sft_document_rows": k})}))
    assert more.rows[:len(corpus.rows)] == corpus.rows and more.documents == corpus.documents
    extra = more.rows[len(corpus.rows):]
    assert len(extra) == k * len(corpus.documents) and more.counts["document_rows"] == len(extra)
    assert all(len(row) == 1 and row[0][1] for row in extra)
    own = {d.text for d in build_lab_world(params, params.seed).world.documents}
    assert own <= {row[0][0] for row in extra}  # the lab world's own paragraphs are among them
    assert "document_rows" not in corpus.counts


def test_grpo_worlds_trains_on_unread_questions_each_served_its_own_world(params):
    lab = build_lab_world(params, params.seed)
    assert grpo_source(params, lab) == (grpo_questions(params.lab, lab), lab.toolbox)  # 0: the lab world's own
    settings = {"grpo_worlds": 1, "sft_worlds": 1, "grpo_questions_per_world": 40}
    one = params.model_copy(update={"lab": params.lab.model_copy(update=settings)})
    questions, toolbox = grpo_source(one, lab)
    sft_world = build_lab_world(params, params.seed + 1, params.lab.sft_questions_per_world)
    read = {q.question for q in sft_world.questions}
    assert len(questions) >= 40 - len(read) and not {q.question for q in questions} & read
    assert len(questions) == len({q.id for q in questions})
    two = one.model_copy(update={"lab": one.lab.model_copy(update={"grpo_worlds": 2, "sft_worlds": 2})})
    questions, toolbox = grpo_source(two, lab)
    assert len({q.id.split(":")[0] for q in questions[:2]}) == 2  # interleaved world by world
    for q in questions[:2]:  # the same paragraph id names another text in each world: each gets its own
        doc = q.gold_chain[0].doc_id
        own = build_lab_world(params, int(q.id.split(":")[0][1:]), 40)
        d = {d.id: d for d in own.world.documents}[doc]
        assert toolbox.for_question(q).call("browse", doc).observation.startswith(f"{d.title}\n{d.text[:40]}")
    with pytest.raises(ValueError, match="lab.sft_worlds"):
        grpo_source(two.model_copy(update={"lab": two.lab.model_copy(update={"grpo_worlds": 3})}), lab)
