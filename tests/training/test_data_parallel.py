"""Data-parallel training (issue 75): 2 ranks under ``torchrun`` (gloo on the CPU) train a tiny LoRA Qwen2 to the
weights one process trains on the same total batch, for GRPO and SFT; each episode is scored once, by the rank
that rolled it out; rank 0 alone writes; one of the 2 ranks killed with SIGKILL mid-step stops the job, leaves the
last complete checkpoint (every rank's optimizer and RNG files), which is refused on 1 process and resumes on 2 to
the uninterrupted weights, bit for bit.

The kill: rank 1 SIGKILLs itself after its rollout of step 2 has begun, before the update's gradient all-reduce;
rank 0 then waits in that collective, which gloo ends at once when the dead peer's socket closes (``Connection
reset by peer``; at the latest after ``RUBRICFLOW_RANK_TIMEOUT_S``, 60 s here), and torchrun stops the job with a
non-zero exit: about 15-20 s from launch to exit here, most of it the two interpreters' start.

Each 2-rank run is ``python -m torch.distributed.run --standalone --nproc_per_node 2 -m
tests.training.data_parallel_case`` (about 20 s on 2 shared cores: two interpreters importing torch and
transformers); the single-process reference runs the same case in this process. Tolerance: 1e-5 on the weights
(the ranks' gradient sums and the one process's accumulation add the same terms in another order, float32; the
measured difference after 3 steps is about 1e-6 for GRPO, 3e-7 for SFT). Full fine-tuning on 2 ranks (DeepSpeed,
the ``[gpu]`` extra; SFT under ZeRO-2 and ZeRO-3, GRPO under ZeRO-2 and ZeRO-3, the last with the policy generating
its own responses) is behind ``-m slow``: about 1.5 minutes a case here (measured: 4.7e-5, 5.2e-5, 7.8e-6 and, GRPO
under ZeRO-3, 1.0e-5 from one process; bound 1e-4).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from components.training.distributed import Ranks
from components.training.grpo.trainer import GRPOTrainer, _combined_reward_metrics
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams, SFTParams
from components.training.sft.trainer import SFTTrainer
from components.training.tiny import tiny_qwen2
from tests.training import data_parallel_case as case

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5
STOP_BOUND_S = 120  # launch (~10-20 s on 2 shared cores) + one step + the 60 s collective timeout, with margin

pytestmark = pytest.mark.usefixtures("one_thread")


def torchrun(out: Path, kind: str, steps: int, *extra: str, n: int = 2, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUBRICFLOW_RANK_TIMEOUT_S": "60"}
    if os.environ.get("RUBRICFLOW_DP_DEVICE", "cpu") == "cpu":  # scripts/gpu_tests.sh: cuda, DeepSpeed's own
        env["DS_ACCELERATOR"] = "cpu"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
            "-m", "tests.training.data_parallel_case", str(out), kind, str(steps), *extra]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done


def single(out: Path, kind: str, steps: int, *extra: str) -> None:
    case.main(str(out), kind, str(steps), *extra)


def results(out: Path) -> tuple[dict, dict]:
    return load_file(str(out)), json.loads(Path(f"{out}.json").read_text())


def max_difference(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def calls(out: Path, rank: int) -> list[tuple]:
    return [tuple(c) for c in json.loads(Path(f"{out}.calls.{rank}.json").read_text())]


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
    """3 GRPO steps in one process and on 2 ranks."""
    folder = tmp_path_factory.mktemp("grpo")
    single(folder / "one.st", "grpo", 3)
    torchrun(folder / "two.st", "grpo", 3)
    return folder


def test_two_ranks_train_grpo_to_the_single_process_weights(grpo_runs):
    (one, one_log), (two, two_log) = results(grpo_runs / "one.st"), results(grpo_runs / "two.st")
    assert two_log["world_size"] == 2 and one_log["world_size"] == 1
    before = {n: p.detach() for n, p in build_policy(tiny_qwen2(case.TOK.vocab_size, seed=0),
                                                     lora=LoRASettings(r=4, alpha=8)).model.named_parameters()
              if p.requires_grad}
    assert max_difference(one, before) > 1e-2  # the LoRA weights moved
    diff = max_difference(two, one)
    print(f"GRPO 2 ranks vs 1 process: max |dw| = {diff:.3g}; losses",
          [(round(a["loss"], 6), round(b["loss"], 6)) for a, b in zip(one_log["metrics"], two_log["metrics"])])
    assert diff < TOL
    for a, b in zip(one_log["metrics"], two_log["metrics"], strict=True):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "reward/mean", "reward/std", "advantage/abs_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        for key in ("episodes", "tokens", "optimizer_steps", "response_length"):
            assert b[key] == a[key], key


def test_each_episode_is_judged_once_and_rank_0_alone_writes(grpo_runs):
    rank0, rank1, alone = calls(grpo_runs / "two.st", 0), calls(grpo_runs / "two.st", 1), calls(grpo_runs / "one.st", 0)
    assert len(rank0) == len(rank1) == 3 * 8  # 2 of 4 prompts x 4 episodes, 3 steps, on each rank
    assert not set(rank0) & set(rank1)
    assert sorted(rank0 + rank1) == sorted(alone) and len(set(alone)) == len(alone) == 48
    for step in (1, 2, 3):  # whole groups: a prompt's 4 episodes are all on one rank
        prompts0 = [t.split("/")[0] for s, t in rank0 if s == step]
        prompts1 = [t.split("/")[0] for s, t in rank1 if s == step]
        assert not set(prompts0) & set(prompts1) and all(prompts0.count(p) == 4 for p in prompts0)
    logged = [json.loads(line) for line in Path(f"{grpo_runs / 'two.st'}.metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["rank"]) for m in logged] == [(1, 0), (2, 0), (3, 0)]  # on_metrics: rank 0 only
    # the run folder: keyed once, one dev file with every question in order, each played by one rank
    run = grpo_runs / "two.st.run"
    assert sorted(p.name for p in run.iterdir()) == ["dev.jsonl", "run_key.json"]
    assert [json.loads(line)["question_id"] for line in (run / "dev.jsonl").read_text().splitlines()] == \
        [f"q{i}" for i in range(5)]
    dev0, dev1 = (json.loads(Path(f"{grpo_runs / 'two.st'}.dev.{r}.json").read_text()) for r in (0, 1))
    assert (dev0["seen"], dev1["seen"]) == (["q0", "q1", "q2"], ["q3", "q4"])
    alone = json.loads(Path(f"{grpo_runs / 'one.st'}.dev.0.json").read_text())
    assert dev0["metrics"] == dev1["metrics"] == alone["metrics"]  # every rank has the whole evaluation's figures
    assert dev0["metrics"]["em"] == pytest.approx(2 / 5)  # q1 and q3 answered right, one on each rank


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    """3 SFT steps in one process and on 2 ranks."""
    folder = tmp_path_factory.mktemp("sft")
    single(folder / "one.st", "sft", 3)
    torchrun(folder / "two.st", "sft", 3)
    return folder


def test_two_ranks_train_sft_to_the_single_process_weights(sft_runs):
    (one, one_log), (two, two_log) = results(sft_runs / "one.st"), results(sft_runs / "two.st")
    diff = max_difference(two, one)
    print(f"SFT 2 ranks vs 1 process: max |dw| = {diff:.3g}; losses",
          [(round(a["loss"], 6), round(b["loss"], 6)) for a, b in zip(one_log["metrics"], two_log["metrics"])])
    assert diff < TOL
    for a, b in zip(one_log["metrics"], two_log["metrics"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert (b["tokens"], b["rows"]) == (a["tokens"], a["rows"])


@pytest.mark.parametrize("kind", ["grpo", pytest.param("sft", marks=pytest.mark.slow)])
def test_a_rank_killed_mid_step_stops_the_job_and_its_checkpoint_resumes_on_two_ranks_only(
        grpo_runs, sft_runs, tmp_path, kind):
    ckpt = tmp_path / "ckpt"
    started = time.monotonic()
    killed = torchrun(tmp_path / "killed.st", kind, 3, str(ckpt), "2", check=False, timeout=STOP_BOUND_S)
    stopped_s = time.monotonic() - started
    print(f"{kind}: rank 1 killed in step 2; job stopped {stopped_s:.1f} s after launch, exit {killed.returncode}")
    assert killed.returncode != 0 and stopped_s < STOP_BOUND_S
    assert "exitcode  : -9" in killed.stderr  # the killed rank, as torchrun reports it
    assert not (tmp_path / "killed.st").exists()  # no outputs from a run that did not finish
    # the last complete checkpoint stays latest; the interrupted step left none
    assert (ckpt / "latest").read_text().strip() == "step_000001"
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".tmp-")) == ["latest", "step_000001"]
    step = ckpt / "step_000001"
    own = step / "ranks" / "rank_00001"
    assert (own / "optimizer.pt").exists() and (own / "rng.json").exists() and (own / "rng.safetensors").exists()
    manifest = json.loads((step / "manifest.json").read_text())["files"]
    assert {"ranks/rank_00001/optimizer.pt", "ranks/rank_00001/rng.safetensors", "optimizer.pt"} <= set(manifest)
    assert json.loads((step / "trainer_state.json").read_text())["world_size"] == 2
    with pytest.raises(ValueError, match="written by 2 data-parallel rank.*this run has 1.*resume it with 2"):
        single(tmp_path / "refused.st", kind, 3, str(ckpt))
    torchrun(tmp_path / "resumed.st", kind, 3, str(ckpt))
    resumed, log = results(tmp_path / "resumed.st")
    assert log["resumed"] and len(log["metrics"]) == 2
    straight, straight_log = results((grpo_runs if kind == "grpo" else sft_runs) / "two.st")
    assert max_difference(resumed, straight) == 0.0  # the same ranks, the same sums: identical
    assert [m["loss"] for m in log["metrics"]] == [m["loss"] for m in straight_log["metrics"][1:]]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_fully_fine_tune_sft_under_zero_to_the_single_process_weights(tmp_path, stage):
    """ZeRO-3: the 2-rank checkpoint (each rank's optimizer partition) resumes on 2 ranks to the same weights."""
    pytest.importorskip("deepspeed")
    kind = f"sft_zero{stage}"
    torchrun(tmp_path / "one.st", kind, 3, n=1, timeout=900)
    torchrun(tmp_path / "two.st", kind, 3, timeout=900)
    (one, one_log), (two, two_log) = results(tmp_path / "one.st"), results(tmp_path / "two.st")
    assert one_log["optimizer"] == two_log["optimizer"] == ("DeepSpeedZeroOptimizer" + ("_Stage3" if stage == 3 else ""))
    diff = max_difference(two, one)
    print(f"SFT ZeRO-{stage}, 2 ranks vs 1 process: max |dw| = {diff:.3g}; losses",
          [(round(a["loss"], 6), round(b["loss"], 6)) for a, b in zip(one_log["metrics"], two_log["metrics"])])
    assert diff < 1e-4  # Adam divides by sqrt(v): tiny gradients' rounding shows (the plain-vs-ZeRO test's bound)
    for a, b in zip(one_log["metrics"], two_log["metrics"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    if stage == 3:
        torchrun(tmp_path / "first.st", kind, 1, str(tmp_path / "ckpt"), timeout=900)
        torchrun(tmp_path / "resumed.st", kind, 3, str(tmp_path / "ckpt"), timeout=900)
        resumed, log = results(tmp_path / "resumed.st")
        assert log["resumed"] and max_difference(resumed, two) == 0.0


@pytest.mark.slow
def test_two_ranks_fully_fine_tune_grpo_under_zero2_to_the_single_process_weights(tmp_path):
    """3 prompts on 2 ranks: rank 1's 4 rows take 2 micro-batches, rank 0's 8 take 3, so rank 1 adds a backward of
    nothing (ZeRO-2 reduces in every backward) and the weights still equal one process's."""
    pytest.importorskip("deepspeed")
    torchrun(tmp_path / "one.st", "grpo_zero2", 3, n=1, timeout=900)
    torchrun(tmp_path / "two.st", "grpo_zero2", 3, timeout=900)
    (one, one_log), (two, two_log) = results(tmp_path / "one.st"), results(tmp_path / "two.st")
    assert one_log["optimizer"] == two_log["optimizer"] == "DeepSpeedZeroOptimizer"
    diff = max_difference(two, one)
    print(f"GRPO ZeRO-2, 2 ranks vs 1 process: max |dw| = {diff:.3g}; losses",
          [(round(a["loss"], 6), round(b["loss"], 6)) for a, b in zip(one_log["metrics"], two_log["metrics"])])
    assert diff < 1e-4
    for a, b in zip(one_log["metrics"], two_log["metrics"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)


@pytest.mark.slow
def test_two_ranks_fully_fine_tune_grpo_under_zero3_to_the_single_process_weights(tmp_path):
    """The README's recipe: ZeRO-3 with every parameter sharded, each response generated by the policy itself, 3
    prompts on 2 ranks (rank 0 runs twice rank 1's generations and old-log-prob passes), two PPO epochs. The
    rollouts and the passes without gradient run on the whole weights, gathered once (``whole_weights``; without
    that gather the ranks' collectives part and the job fails); a 2-rank checkpoint resumes to the same weights."""
    pytest.importorskip("deepspeed")
    torchrun(tmp_path / "one.st", "grpo_zero3", 3, n=1, timeout=900)
    torchrun(tmp_path / "two.st", "grpo_zero3", 3, timeout=900)
    (one, one_log), (two, two_log) = results(tmp_path / "one.st"), results(tmp_path / "two.st")
    assert one_log["optimizer"] == two_log["optimizer"] == "DeepSpeedZeroOptimizer_Stage3"
    diff = max_difference(two, one)
    print(f"GRPO ZeRO-3, 2 ranks vs 1 process: max |dw| = {diff:.3g}; losses",
          [(round(a["loss"], 6), round(b["loss"], 6)) for a, b in zip(one_log["metrics"], two_log["metrics"])])
    assert diff < 1e-4
    assert len({m["reward/mean"] for m in one_log["metrics"]}) == 3  # the responses follow the weights
    for a, b in zip(one_log["metrics"], two_log["metrics"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        for key in ("reward/mean", "response_length", "tokens", "optimizer_steps", "old_logprob_pass"):
            assert b[key] == a[key], key
    torchrun(tmp_path / "first.st", "grpo_zero3", 1, str(tmp_path / "ckpt"), timeout=900)
    torchrun(tmp_path / "resumed.st", "grpo_zero3", 3, str(tmp_path / "ckpt"), timeout=900)
    resumed, log = results(tmp_path / "resumed.st")
    assert log["resumed"] and max_difference(resumed, two) == 0.0


def test_a_zero_run_key_holds_its_stage_not_its_persistence_threshold():
    from components.training.distributed import deepspeed_config
    from components.training.params import DeepSpeedParams

    assert DeepSpeedParams(param_persistence_threshold=0).keyed() is None  # unset: earlier runs keep their keys
    assert DeepSpeedParams(zero_stage=3, param_persistence_threshold=0).keyed() == DeepSpeedParams(zero_stage=3).keyed() \
        == {"zero_stage": 3, "offload_optimizer": False, "offload_params": False}
    assert deepspeed_config(3, param_persistence_threshold=0)["zero_optimization"][
        "stage3_param_persistence_threshold"] == 0


def test_whole_weights_gathers_nothing_without_zero3():
    """LoRA on N ranks (the plain stepper): no gather and no collective (no process group is open here)."""
    policy = build_policy(tiny_qwen2(case.TOK.vocab_size, seed=0), lora=LoRASettings(r=4, alpha=8))
    trainer = GRPOTrainer(policy, case._Engine(), lambda e, c: [0.0] * len(e), ["a"], GRPOParams(), ranks=Ranks(0, 2))
    with trainer.whole_weights():
        assert not trainer.stepper.forward_in_lockstep


def test_ranks_share_a_list_in_contiguous_runs_in_rank_order():
    items = list(range(10))
    for world in (1, 2, 3, 4, 10, 12):
        shares = [Ranks(r, world).share(items) for r in range(world)]
        assert [x for s in shares for x in s] == items
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_reward_metrics_of_the_ranks_sum_counts_and_weigh_rates_by_episodes():
    out = _combined_reward_metrics([(8, {"judge/calls": 8.0, "em": 0.5, "arco/unscored_steps": 1.0}),
                                    (4, {"judge/calls": 4.0, "em": 1.0, "arco/unscored_steps": 2.0})])
    assert out == {"judge/calls": 12.0, "em": pytest.approx((8 * 0.5 + 4 * 1.0) / 12), "arco/unscored_steps": 3.0}


class _Hooked:
    def state_dict(self):
        return {}

    def on_step_end(self, trainer, ctx, episodes, scores):
        return {}


def test_a_method_with_step_hooks_is_refused_on_several_ranks():
    """Unless it merges what the ranks' rewards left in it (ARBOR, RAR, ARCO); RubricEM says why it does not."""
    from components.methods.arco.params import ArcoParams
    from components.methods.arco.variants import ArcoState
    from components.methods.rubricem.variants import RubricEMState

    policy = build_policy(tiny_qwen2(case.TOK.vocab_size, seed=0), lora=LoRASettings(r=4, alpha=8))
    with pytest.raises(ValueError, match="_Hooked has step hooks .*on_step_end.* one process, not 2 ranks"):
        GRPOTrainer(policy, case._Engine(), lambda e, c: [0.0] * len(e), ["a"], GRPOParams(), method=_Hooked(),
                    ranks=Ranks(0, 2))
    GRPOTrainer(policy, case._Engine(), lambda e, c: [0.0] * len(e), ["a"], GRPOParams(), method=_Hooked())
    with pytest.raises(ValueError, match=r"RubricEMState has step hooks .*\(its Phase A trains the policy"):
        GRPOTrainer(policy, case._Engine(), lambda e, c: [0.0] * len(e), ["a"], GRPOParams(),
                    method=RubricEMState(), ranks=Ranks(0, 2))
    GRPOTrainer(policy, case._Engine(), lambda e, c: [0.0] * len(e), ["a"], GRPOParams(),
                method=ArcoState(ArcoParams(warmup_steps=0), lambda: None), ranks=Ranks(0, 2))


def test_two_ranks_keep_arbors_rubric_memory_equal_to_one_process(tmp_path):
    """ARBOR's memory on 2 ranks: each rank's reward leaves its groups' records (a draft each), the trainer merges
    them in rank order, the lifecycle runs on rank 0 alone and its state goes to rank 1: both ranks end with the
    memory one process builds, every group's draft admitted once."""
    single(tmp_path / "one.st", "grpo_arbor", 3)
    torchrun(tmp_path / "two.st", "grpo_arbor", 3)
    one, rank0, rank1 = (json.loads(Path(f"{tmp_path}/{name}.st.method.{r}.json").read_text())
                         for name, r in (("one", 0), ("two", 0), ("two", 1)))
    assert rank0 == rank1 == one
    assert len(one["drafts"]) == 3 * 4 and one["totals"]["admitted"] == 12  # 4 groups a step, 2 on each rank
    assert [json.loads(Path(f"{tmp_path}/two.st.hooks.{r}.json").read_text()) for r in (0, 1)] == [3, 0]
    assert max_difference(results(tmp_path / "two.st")[0], results(tmp_path / "one.st")[0]) < TOL


@pytest.mark.slow
def test_two_ranks_train_arco_and_its_rubric_model_to_the_single_process_weights(tmp_path):
    """ARCO on 2 ranks (one question a rank): each rank's mu writes and scores its own episodes' steps; mu warms up
    (step 1) and updates (step 3) on rank 0 alone over the whole step, the teacher asked once per episode there,
    and rank 1 takes rank 0's mu and optimizer after each step: both ranks end with one process's mu, exactly, and
    the policy within TOL; a 2-rank checkpoint taken before mu's update resumes to the same weights."""
    from safetensors.torch import load_file as read

    single(tmp_path / "one.st", "grpo_arco", 3)
    torchrun(tmp_path / "two.st", "grpo_arco", 3)
    (one, one_log), (two, two_log) = results(tmp_path / "one.st"), results(tmp_path / "two.st")
    mu_one = read(str(tmp_path / "one.st.mu.0.safetensors"))
    mu_ranks = [read(str(tmp_path / f"two.st.mu.{r}.safetensors")) for r in (0, 1)]
    assert all(max_difference(mu, mu_one) == 0.0 for mu in mu_ranks)  # rank 1's mu is rank 0's, trained
    diff = max_difference(two, one)
    print(f"ARCO 2 ranks vs 1 process: policy max |dw| = {diff:.3g}, mu 0; losses",
          [(round(a["loss"], 6), round(b["loss"], 6)) for a, b in zip(one_log["metrics"], two_log["metrics"])])
    assert diff < TOL
    assert [m["method/mu/updated"] for m in two_log["metrics"]] == [0.0, 0.0, 1.0]
    assert two_log["metrics"][0]["method/mu/warmup_trajectories"] == 4.0  # both ranks' episodes
    for a, b in zip(one_log["metrics"], two_log["metrics"], strict=True):
        assert set(a) == set(b)
        for key in {"loss", "grad_norm", "reward/mean", "method/mu/grad_norm", "method/mu/warmup_fit"} & set(a):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        assert b.get("reward/arco/steps") == a.get("reward/arco/steps")  # every step scored once, over the ranks
    teacher = [json.loads(Path(f"{tmp_path}/{n}.teacher.{r}.json").read_text()) for n, r in
               (("one.st", 0), ("two.st", 0), ("two.st", 1))]
    assert len(teacher[0]) == 4 and teacher[1] == teacher[0] and teacher[2] == []
    rank0, rank1 = calls(tmp_path / "two.st", 0), calls(tmp_path / "two.st", 1)
    assert not set(rank0) & set(rank1) and sorted(rank0 + rank1) == sorted(calls(tmp_path / "one.st", 0))
    torchrun(tmp_path / "first.st", "grpo_arco", 2, str(tmp_path / "ckpt"))
    torchrun(tmp_path / "resumed.st", "grpo_arco", 3, str(tmp_path / "ckpt"))
    resumed, log = results(tmp_path / "resumed.st")
    assert log["resumed"] and max_difference(resumed, two) == 0.0
    assert max_difference(read(str(tmp_path / "resumed.st.mu.1.safetensors")), mu_ranks[1]) == 0.0


def test_rar_checklists_written_on_one_rank_are_every_ranks():
    from components.methods.arbor.variants import RarState

    ranks = [RarState(), RarState()]
    ranks[0].checklists["q1"], ranks[1].checklists["q2"] = ["a"], ["b"]
    parts = [r.rank_share() for r in ranks]
    for r in ranks:
        r.merge_ranks(parts)
    assert ranks[0].checklists == ranks[1].checklists == {"q1": ["a"], "q2": ["b"]}


def test_zero_needs_every_rank_to_run_as_many_sft_micro_batches():
    from components.training.params import DeepSpeedParams

    policy = build_policy(tiny_qwen2(case.TOK.vocab_size, seed=0), lora=None)
    with pytest.raises(ValueError, match=r"sft.batch_size \(3\) must be a multiple of the ranks \(2\)"):
        SFTTrainer(policy, case.EXAMPLES, SFTParams(batch_size=3, micro_batch_size=1), pad_token_id=0,
                   zero=DeepSpeedParams(zero_stage=2), ranks=Ranks(0, 2))
