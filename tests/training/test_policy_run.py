"""The train_policy stage's recipe (components.policy_run, its run key and its warm start): each agent
starts from its own warm start (adapter, prompts, run key), and the dev evaluation scores greedy episodes (EM/F1
over all questions, unanswered = 0)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from components.io import read_jsonl
from components.params_load import load_params
from components.params_section import ParamsError

from components.run_spec import run_spec
from components.schemas import Question, Trajectory
from components.policy_run import dev_evaluation
from components.training.grpo.policy_run_key import run_settings
from components.training.warm_started import warm_start_adapter, warm_start_options


def test_each_agent_starts_from_its_own_warm_start(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml", overrides=["methods.sft.options.system_prompt=compact",
                                                               "methods.sft_scaffold.options.max_tokens=300",
                                                               f"run.out_dir={tmp_path}"])
    spec = run_spec(params)
    assert warm_start_options(spec, "react") == {"system_prompt": "compact"}
    assert warm_start_options(spec, "scaffold") == {"max_tokens": 300}  # the scaffold warm start's own
    assert warm_start_adapter(spec, "react") == tmp_path / "sft" / "adapter"
    assert warm_start_adapter(spec, "scaffold") == tmp_path / "sft_scaffold" / "adapter"
    assert warm_start_adapter(spec, "coreact") is None and warm_start_options(spec, "coreact") == {}
    cold = load_params(repo_root / "params.yaml", overrides=["train_policy.warm_start.react=null"])
    assert warm_start_options(run_spec(cold), "react") == {} and warm_start_adapter(run_spec(cold), "react") is None
    # the run key follows the agent's own warm start only
    other = load_params(repo_root / "params.yaml", overrides=["methods.sft_scaffold.options.max_tokens=200"])
    base = load_params(repo_root / "params.yaml")
    assert run_settings(other, "grpo", "react") == run_settings(base, "grpo", "react")
    assert run_settings(other, "ss_grpo", "scaffold") != run_settings(base, "ss_grpo", "scaffold")


def test_warm_start_folders_are_named_after_their_stage(repo_root, tmp_path):
    spec = run_spec(load_params(repo_root / "params.yaml", overrides=[f"run.out_dir={tmp_path}"]))
    assert spec.warm_start_folder("sft_data", "sft") == tmp_path / "sft_data"
    assert spec.warm_start_folder("sft", "sft_scaffold") == tmp_path / "sft_scaffold"
    assert spec.warm_start_folder("sft_data", "sft_scaffold") == tmp_path / "sft_data_scaffold"
    with pytest.raises(ParamsError, match="coreact"):
        spec.warm_start_folder("sft", "coreact")


def test_dev_evaluation_scores_greedy_episodes(tmp_path):
    questions = [Question(id=f"q{i}", question=f"Q{i}?", answers=[a], source="world")
                 for i, a in enumerate(["Paris", "1901", "Ada Lovelace", "blue"])]
    finals = [("Paris", "answer"), ("1902", "answer"), ("Lovelace", "answer"), (None, "search_budget")]
    seen = {}

    def rollout_fn(engine, prompts, group_size, sampling):
        seen.update(group_size=group_size, temperature=sampling.temperature, n=len(prompts))
        return [SimpleNamespace(info={"trajectory": Trajectory(
            question_id=q.id, question=q.question, steps=[], final_answer=a, finish_reason=r, policy="p")})
            for q, (a, r) in zip(prompts, finals)]

    metrics = dev_evaluation(rollout_fn, object(), questions, 64, tmp_path / "dev.jsonl")
    assert seen == {"group_size": 1, "temperature": 0.0, "n": 4}
    assert metrics["em"] == 0.25  # only Paris
    assert abs(metrics["f1"] - (1 + 0 + 2 / 3 + 0) / 4) < 1e-9  # "Lovelace" vs "Ada Lovelace": P=1, R=1/2
    assert metrics["answered"] == 0.75 and metrics["search_budget"] == 0.25
    assert [t.question_id for t in read_jsonl(tmp_path / "dev.jsonl", Trajectory)] == ["q0", "q1", "q2", "q3"]


def test_a_run_folder_resumes_only_under_the_same_settings(tmp_path, repo_root):
    from components.run_files import keyed_folder

    params = load_params(repo_root / "params.yaml")
    folder = tmp_path / "train" / "grpo"
    assert keyed_folder(folder, run_settings(params, "grpo")) is False  # nothing to resume yet
    (folder / "ckpt").mkdir()
    (folder / "dev_before.json").write_text("{}")
    longer = load_params(repo_root / "params.yaml", overrides=["grpo.steps=99"])
    assert keyed_folder(folder, run_settings(longer, "grpo")) is True  # more steps: resume
    recomputing = load_params(repo_root / "params.yaml", overrides=["grpo.gradient_checkpointing=false",
                                                                     "grpo.micro_batch_tokens=512"])
    assert run_settings(recomputing, "grpo") == run_settings(params, "grpo")  # how the same update is computed
    assert (folder / "ckpt").exists()
    other = load_params(repo_root / "params.yaml", overrides=["grpo.lr=0.5"])
    assert keyed_folder(folder, run_settings(other, "grpo")) is False
    assert sorted(p.name for p in folder.iterdir()) == ["run_key.json"]  # stale checkpoint and files gone
    arbor = load_params(repo_root / "params.yaml", overrides=["arbor.alpha=0.5"])
    assert run_settings(arbor, "rar") != run_settings(params, "rar")  # rar reads params.arbor
    assert run_settings(arbor, "grpo") == run_settings(params, "grpo")
    # a method field marked execution-only (how mu batches its generation) may change on resume; others may not
    batched = load_params(repo_root / "params.yaml", overrides=["arco.write_batch=1"])
    assert run_settings(batched, "arco") == run_settings(params, "arco")
    for execution in ("arco.engine=hf", "arco.micro_batch_tokens=null", "arco.checkpoint_min_tokens=0"):
        assert run_settings(load_params(repo_root / "params.yaml", overrides=[execution]), "arco") == run_settings(params, "arco")
    smaller = load_params(repo_root / "params.yaml", overrides=["arco.micro_batch=3"])
    assert run_settings(smaller, "arco") != run_settings(params, "arco")


def test_resumed_steps_keep_their_timings_in_metrics_csv(tmp_path):
    from components.policy_run import resumed_rows

    csv = tmp_path / "metrics.csv"
    csv.write_text("step,loss,time/rollout,time/update\n1,0.5,12.5,3.0\n2,0.4,11.0,2.5\n")
    history = [{"loss": 0.5}, {"loss": 0.4}]  # what the checkpoint restores: no wall-clock fields
    rows = resumed_rows(history, csv)
    assert rows == [{"step": 1, "loss": 0.5, "time/rollout": 12.5, "time/update": 3.0},
                    {"step": 2, "loss": 0.4, "time/rollout": 11.0, "time/update": 2.5}]
    assert resumed_rows([], csv) == []  # a fresh run starts an empty table
    assert resumed_rows(history, tmp_path / "missing.csv") == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}]


def test_a_resumed_run_adds_its_time_to_the_earlier_invocations(tmp_path):
    from components.io import write_json
    from components.policy_run import accumulated_timings

    path = tmp_path / "timings.json"
    assert accumulated_timings(path, 5.0) == {"wall_s": 5.0, "sessions_s": [5.0]}
    write_json(path, {"wall_s": 100.0})  # a file from before sessions were recorded
    assert accumulated_timings(path, 5.0) == {"wall_s": 105.0, "sessions_s": [100.0, 5.0]}
    write_json(path, {"wall_s": 105.0, "sessions_s": [100.0, 5.0]})
    assert accumulated_timings(path, 2.5)["wall_s"] == 107.5


def test_dev_evaluation_serves_batch_invariant_when_asked(tmp_path):
    from contextlib import contextmanager

    question = Question(id="q0", question="Q?", answers=["Paris"], source="world")
    inside = []

    class Engine:
        active = False

        @contextmanager
        def batch_invariant(self):
            self.active = True
            yield
            self.active = False

    def rollout_fn(engine, prompts, group_size, sampling):
        inside.append(engine.active)
        return [SimpleNamespace(info={"trajectory": Trajectory(
            question_id="q0", question="Q?", steps=[], final_answer="Paris", finish_reason="answer", policy="p")})]

    engine = Engine()
    assert dev_evaluation(rollout_fn, engine, [question], 8, tmp_path / "a.jsonl", True)["batch_invariant"] == 1.0
    assert dev_evaluation(rollout_fn, engine, [question], 8, tmp_path / "b.jsonl")["batch_invariant"] == 0.0
    assert inside == [True, False] and engine.active is False


def test_how_the_dev_evaluation_is_served_is_not_part_of_the_run_key(repo_root):
    params = load_params(repo_root / "params.yaml")
    other = params.model_copy(update={"train_policy": params.train_policy.model_copy(
        update={"eval_batch_invariant": not params.train_policy.eval_batch_invariant})})
    assert run_settings(params, "grpo") == run_settings(other, "grpo")
    fewer = params.model_copy(update={"train_policy": params.train_policy.model_copy(update={"eval_questions": 3})})
    assert run_settings(params, "grpo") != run_settings(fewer, "grpo")


def test_a_branch_is_keyed_by_its_checkpoints_manifest(tmp_path, repo_root):
    for name, digest in (("a", "1" * 64), ("b", "2" * 64)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(f'{{"files": {{"weights": "{digest}"}}}}')
    keys = [run_settings(load_params(repo_root / "params.yaml", overrides=overrides), "arco_frozen")
            for overrides in ([], [f"train_policy.branch_from={tmp_path / 'a'}"],
                              [f"train_policy.branch_from={tmp_path / 'b'}"])]
    assert keys[0]["branch_from"] is None and len({str(k) for k in keys}) == 3
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "manifest.json").write_bytes((tmp_path / "a" / "manifest.json").read_bytes())
    moved = load_params(repo_root / "params.yaml", overrides=[f"train_policy.branch_from={tmp_path / 'moved'}"])
    assert run_settings(moved, "arco_frozen") == keys[1]  # the same checkpoint copied elsewhere: the same run
    missing = load_params(repo_root / "params.yaml", overrides=[f"train_policy.branch_from={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        run_settings(missing, "arco_frozen")


def test_a_branch_from_a_run_under_other_settings_is_refused(tmp_path, repo_root):
    from components.io import write_json
    from components.training.grpo.policy_run_key import check_branch, lineage_record

    step = tmp_path / "arco" / "ckpt" / "step_000001"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    source = run_settings(load_params(repo_root / "params.yaml"), "arco")
    write_json(tmp_path / "arco" / "lineage.json", lineage_record(source))
    frozen = load_params(repo_root / "params.yaml", overrides=[f"train_policy.branch_from={step}"])
    check_branch(str(step), run_settings(frozen, "arco_frozen"))  # same shared settings: accepted
    other = load_params(repo_root / "params.yaml", overrides=[f"train_policy.branch_from={step}", "lora.r=4"])
    with pytest.raises(ValueError, match="other settings"):
        check_branch(str(step), run_settings(other, "arco_frozen"))
    (tmp_path / "arco" / "lineage.json").unlink()
    with pytest.warns(UserWarning, match="no lineage.json"):
        check_branch(str(step), run_settings(frozen, "arco_frozen"))


def test_a_branch_matches_adapters_by_content_not_by_their_out_dir(tmp_path, repo_root):
    """A sweep's runs resolve adapter paths against the main job's run.out_dir, a stage run against its own:
    the same weights in two folders are one lineage, other weights are another. A lineage.json of version 1
    (adapter paths) is still checked as it was written."""
    import shutil

    from components.io import write_json
    from components.training.grpo.policy_run_key import check_branch, lineage, lineage_record

    def out_dir(name, weights):
        adapter = tmp_path / name / "sft" / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text('{"r": 8}')
        (adapter / "adapter_model.safetensors").write_bytes(weights)
        return load_params(repo_root / "params.yaml", overrides=[f"run.out_dir={tmp_path / name}"])

    main, stage = out_dir("main", b"w1"), out_dir("stage", b"w1")
    step = tmp_path / "main" / "train" / "grpo" / "ckpt" / "step_000001"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    source = run_settings(main, "grpo")
    write_json(step.parent.parent / "lineage.json", lineage_record(source))
    branch = lambda p: p.model_copy(update={"train_policy": p.train_policy.model_copy(
        update={"branch_from": str(step)})})
    check_branch(str(step), run_settings(branch(stage), "grpo"))  # same weights, other folder: accepted
    shutil.rmtree(tmp_path / "stage")
    other = out_dir("stage", b"w2")
    with pytest.raises(ValueError, match=r"\(llm\.backends\.embedded-0_5b-sft\.lora, warm_start differ"):
        check_branch(str(step), run_settings(branch(other), "grpo"))  # the refusal names what differs
    write_json(step.parent.parent / "lineage.json", {"lineage": lineage(source, version=1)})  # an older run
    check_branch(str(step), run_settings(branch(main), "grpo"))
    with pytest.raises(ValueError, match="other settings"):  # version 1 keyed the paths: refused as before
        check_branch(str(step), run_settings(branch(other), "grpo"))


def _greedy_engine_and_rollouts(calls: list[str]):
    from contextlib import nullcontext

    engine = SimpleNamespace(batch_invariant=nullcontext)

    def rollout_fn(engine, prompts, group_size, sampling):
        calls.append(prompts[0].id)
        return [SimpleNamespace(info={"trajectory": Trajectory(
            question_id=q.id, question=q.question, steps=[], final_answer="Paris", finish_reason="answer",
            policy="p")}) for q in prompts]

    return engine, rollout_fn


def test_variants_of_one_warm_start_share_the_dev_evaluation_of_their_start(repo_root, tmp_path):
    from components.policy_run import shared_dev_before

    params = load_params(repo_root / "params.yaml", overrides=[f"run.cache_dir={tmp_path / 'cache'}"])
    dev = [Question(id="d0", question="Where?", answers=["Paris"], source="world")]

    def key(variant, agent="react", options=None, questions=dev, p=params):
        return shared_dev_before(p, run_settings(p, variant, agent), agent, options or {}, questions)

    assert key("grpo") == key("dapo")  # only training differs
    assert key("grpo").parent == tmp_path / "cache" / "dev_before"
    assert key("scaffold_grpo", "scaffold") == key("ss_grpo", "scaffold")
    assert key("scaffold_grpo", "scaffold") != key("grpo")
    guidance = {"guidance": object()}  # an object enters the key by its type, not its address
    assert key("meta_policy", "scaffold", guidance) == key("rubricem", "scaffold", {"guidance": object()})
    assert key("meta_policy", "scaffold", guidance) != key("scaffold_grpo", "scaffold")
    assert key("grpo", questions=dev * 2) != key("grpo")
    other_world = load_params(repo_root / "params.yaml", overrides=[f"run.cache_dir={tmp_path / 'cache'}",
                                                                    "world.n_people=81"])
    assert key("grpo", p=other_world) != key("grpo")


def test_a_shared_dev_evaluation_is_measured_once_and_copied_whole(tmp_path):
    from components.policy_run import measure_dev_before

    dev = [Question(id="d0", question="Where?", answers=["Paris"], source="world")]
    calls: list[str] = []
    engine, rollout_fn = _greedy_engine_and_rollouts(calls)
    shared = tmp_path / "cache" / "dev_before" / "k"
    first, second, alone = (tmp_path / n for n in ("grpo", "dapo", "other"))
    for folder in (first, second, alone):
        folder.mkdir()
    measure_dev_before(rollout_fn, engine, dev, 8, first, True, shared)
    measure_dev_before(rollout_fn, engine, dev, 8, second, True, shared)
    assert calls == ["d0"]  # the second run read the first one's measurement
    for name in ("dev_before.json", "dev_before.jsonl"):
        assert (second / name).read_bytes() == (first / name).read_bytes()
    measure_dev_before(rollout_fn, engine, dev, 8, alone, False, None)
    assert calls == ["d0", "d0"]
    (shared / "dev_before.json").unlink()  # a measurement cut off before its summary is not reused
    measure_dev_before(rollout_fn, engine, dev, 8, alone, True, shared)
    assert calls == ["d0", "d0", "d0"] and (shared / "dev_before.json").exists()


def test_a_folder_from_before_its_stage_keyed_runs_is_adopted_only_when_asked(tmp_path):
    from components.run_files import keyed_folder

    legacy = tmp_path / "sft"
    (legacy / "ckpt").mkdir(parents=True)
    (legacy / "adapter.safetensors").write_text("weights")
    assert keyed_folder(legacy, {"lr": 1}, adopt_unkeyed=True) is True  # taken as this run's, not emptied
    assert (legacy / "adapter.safetensors").exists()
    assert keyed_folder(legacy, {"lr": 2}, adopt_unkeyed=True) is False  # keyed now: other settings start afresh
    assert not (legacy / "adapter.safetensors").exists()
    unkeyed = tmp_path / "other"
    unkeyed.mkdir()
    (unkeyed / "file").write_text("x")
    assert keyed_folder(unkeyed, {"lr": 1}) is False and not (unkeyed / "file").exists()
    empty = tmp_path / "empty"
    assert keyed_folder(empty, {"lr": 1}, adopt_unkeyed=True) is False
