"""ARBOR (docs/methods/arbor.md): a reusable rubric memory giving process rewards during GRPO.

- ``memory``: the memory's admission, consolidation and retirement (3.3), a state machine
- ``contrast``, ``induction``: contrastive anchor pairs and the LLM calls that write and merge rubrics (3.2)
- ``pairwise_graph``, ``pairwise_judge``: the sparse comparison graph and the pairwise process judge (3.4)
- ``shaping``: reward shaping from judged scores (Eq. 3-4)
- ``rar``: the Rubrics-as-Rewards baseline's calls
- ``variants``: ``train_policy@arbor``, ``@arbor_no_memory``, ``@rar``
- ``params``, ``plugin``: its params section and its registration
"""
