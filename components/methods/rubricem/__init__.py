"""RubricEM (docs/methods/rubricem.md): a Plan/Research/Review/Answer scaffold trained with stage-structured GRPO.

- ``scaffold_format``, ``scaffold_agent``: the scaffold's tags, parser and validator, and its agent (3.2, B.1)
- ``scaffold_oracle``, ``warmstart_reflections``: the scaffold warm start's oracle turns and reflection rows (B.2)
- ``stagewise_judge``, ``stage_returns``: the stagewise evolving judge and SS-GRPO's stage returns (3.3)
- ``reflection``, ``bank``: the reflection meta-policy and the rubric bank (3.4)
- ``variants``: ``train_policy@scaffold_grpo``, ``@ss_grpo``, ``@meta_policy``, ``@rubricem``
- ``params``, ``plugin``: its params section and its registration (with the scaffold's warm-start format)
"""
