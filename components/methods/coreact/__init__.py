"""Co-ReAct (docs/methods/coreact.md): rubric-guided inference with a trained rubric generator.

- ``collect``, ``slates``, ``council``, ``collect_metrics``: branching points, MMR slates, the judge council
  and its Borda consensus (3.1); stage ``collect``
- ``rubric_generator``, ``rubric_eval``, ``generator_reward``, ``rubric_training``, ``oracle_rubrics``,
  ``generator_training``: the generator, the evaluator behind its listwise Spearman reward, its GRPO data, oracle
  warm start and the stage's recipe (3.2); stage ``train_rubric_generator``
- ``agent``, ``verifier``: the inject-verify-retry agent (3.3)
- ``baselines``: Best-of-N, Step-Back, CRITIC, Self-Refine, each with the rubric plug-in (4.1)
- ``guided_metrics``: retry and verification rates of ``evaluate@<method>`` runs (their comparison table is
  the shared ``components.reporting.methods``)
- ``params``, ``plugin``: its params sections and its registration
"""
