"""The judge bench's shared pieces: a fixed trajectory set built from the embedded world with oracle labels
(:mod:`.trajectories`), the registry of bench judgments that the methods fill from their own packages
(:mod:`.registry`; the shared answer judge's is :mod:`.answer`), the agreement metrics computed from a table of
verdicts (:mod:`.metrics`) and the report written from them (:mod:`.report`).

Nothing here asks a model by itself, and nothing here imports a method package: each method registers its
judgments from ``components/methods/<m>/bench.py`` (imported by its ``plugin.py``), and the runner,
``scripts/judge_bench.py``, asks whichever are registered.
"""
