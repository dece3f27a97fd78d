"""Registers Co-ReAct with the method registry: its agents (the inject-verify-retry agent, the four baselines
with the rubric plug-in), the params.methods entries it evaluates, its stages (collect's branching points, the rubric
generator trained listwise and pairwise) and its params sections. Co-ReAct trains a rubric generator, not the policy, so it
registers no ``train_policy`` variant; its health figures are those of the generator's training runs
(``train_rubric_generator@<reward>``: metrics.csv a step, metrics.json at the end), which the head-to-head report
shows beside every method that serves that generator."""

from components.method_registry import Evaluation, HealthMetric, MethodSpec, Out, Stage
from components.methods.coreact import agent, baselines, bench  # noqa: F401  (their @AGENTS / bench registrations run on import)

RUN_FILES = ("tasks/runtime.py", "components/params_cli.py", "components/run_files.py", "components/params.py",
             "components/params_load.py")
LISTWISE = "train_rubric_generator@listwise"

COLLECT = Stage(
    "collect", "collect",
    deps=("tasks/collect.py", *RUN_FILES, "components/methods/coreact", "components/judges", "components/agents",
          "components/llm", "components/retrieval", "outputs/data/train.jsonl", "outputs/data/corpus.jsonl",
          "outputs/index"),
    params=("seed", "profile", "profiles", "collect", "agent", "llm", "retrieval"),
    outs=(Out("outputs/collect/branching_points.parquet"),
          Out("outputs/responses/collect.jsonl", persist=True, note="the replies it used: what dvc repro replays"),
          Out("outputs/collect/shard-0-of-1"), Out("outputs/collect/timings.json", cache=False)),
    metrics=(Out("outputs/collect/metrics.json", cache=False),))

TRAIN_RUBRIC_GENERATOR = Stage(
    "train_rubric_generator", "train_rubric_generator", args={"reward": "${item}"}, foreach=("listwise", "pairwise"),
    note="Co-ReAct's generator, listwise (served as rubric_generator_trained) and pairwise",
    deps=("tasks/train_rubric_generator.py", *RUN_FILES, "components/methods/coreact", "components/judges",
          "components/training", "components/llm", "components/embedded", "outputs/collect/branching_points.parquet",
          "outputs/data/train.jsonl",
          # the gold chains of prepare's questions and sft_data's worlds, for the oracle warm start
          "outputs/sft_data/trajectories.jsonl", "outputs/sft_data/worlds"),
    params=("seed", "profile", "profiles", "llm", "lora", "grpo", "sft", "rubric_generator",
            "coreact.observation_chars", "train_policy.engine", "train_policy.n_ctx"),
    outs=(Out("outputs/train_rubric_generator/${item}/adapter"),
          Out("outputs/responses/train_rubric_generator/${item}.jsonl", persist=True,
              note="the evaluator's replies: what dvc repro replays"),
          Out("outputs/train_rubric_generator/${item}/ckpt"), Out("outputs/train_rubric_generator/${item}/warm_start"),
          *(Out(f"outputs/train_rubric_generator/${{item}}/{name}", cache=False)
            for name in ("heldout_before.json", "heldout.json", "timings.json"))),
    metrics=(Out("outputs/train_rubric_generator/${item}/metrics.json", cache=False),),
    plots=(Out("outputs/train_rubric_generator/${item}/metrics.csv", cache=False, x="step"),),
    # head_to_head: the training compute and health of the rows that serve the generator
    report=tuple(f"outputs/train_rubric_generator/${{item}}/{name}"
                 for name in ("metrics.csv", "metrics.json", "timings.json")))

SPEC = MethodSpec(name="coreact", sections=("coreact", "rubric_generator", "collect"),
                  agents=("coreact", "self_refine", "step_back", "critic", "best_of_n"),
                  doc="docs/methods/coreact.md", agent_defaults="coreact", stages=(COLLECT, TRAIN_RUBRIC_GENERATOR),
                  # its params.methods entries: the trained generator (listwise, or its pairwise ablation) or the
                  # untrained base writing the rubrics, and the four baselines alone and with the rubric plug-in
                  evaluations=(Evaluation("coreact", serves=(LISTWISE,)), Evaluation("coreact_untrained"),
                               Evaluation("coreact_pairwise", serves=("train_rubric_generator@pairwise",)),
                               Evaluation("coreact_no_verify", serves=(LISTWISE,)),
                               *(Evaluation(m) for m in ("self_refine", "best_of_n", "step_back", "critic")),
                               *(Evaluation(f"{m}_rubric", serves=(LISTWISE,))
                                 for m in ("self_refine", "best_of_n", "step_back", "critic"))),
                  health=(HealthMetric("points_train", "training points", "final"),
                          HealthMetric("points_held_out", "held-out points", "final"),
                          HealthMetric("reward/rho_mean", "training rho", "mean"),
                          HealthMetric("reward/flat_rate", "training flat rate", "mean"),
                          HealthMetric("reward/evaluator/failures", "failed evaluator calls"),
                          HealthMetric("heldout_before.spearman_with_unparsed", "held-out rho before (greedy)", "final"),
                          HealthMetric("heldout_after.spearman_with_unparsed", "held-out rho after (greedy)", "final"),
                          HealthMetric("heldout_change_unparsed_as_chance.delta_mean", "held-out rho change (per point, greedy and sampled)", "final"),
                          HealthMetric("heldout_after.flat_rate", "held-out flat rate after (greedy)", "final"))).register()
