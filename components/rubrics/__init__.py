"""Rubric data structures and their lifecycles: ARBOR's rubric memory (:mod:`.arbor_memory`), its contrastive
anchors (:mod:`.contrast`) and sparse pairwise comparison graph (:mod:`.pairwise_graph`), and the text
judges are shown of a trajectory (:mod:`.trajectory_text`). LLM calls live in :mod:`components.judges`."""
