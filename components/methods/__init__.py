"""The four methods, one package each; they never import each other (checked by the import contracts in
``pyproject.toml``). Each registers itself in its ``plugin`` module (:mod:`components.method_registry`), owns
its ``params.yaml`` sections in its ``params`` module, and builds on the shared seams (``agents``, ``judges``,
``rewards``, ``training``, ``evaluation``, ``retrieval``, ``llm``).

- :mod:`.coreact`: Co-ReAct (branching points, council, rubric generator, inject-verify-retry agent, baselines)
- :mod:`.arbor`: ARBOR (rubric memory, contrastive induction, sparse pairwise judging, shaping; RaR)
- :mod:`.rubricem`: RubricEM (scaffold, stagewise judge, SS-GRPO, reflection meta-policy, rubric bank)
- :mod:`.arco`: ARCO (rubric model mu with generation and score heads, decomposition, co-evolution)
"""
