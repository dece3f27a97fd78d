"""The judge bench's shared pieces: a fixed trajectory set built from the embedded world with oracle labels
(:mod:`.trajectories`), the agreement metrics computed from a table of verdicts (:mod:`.metrics`) and the
report written from them (:mod:`.report`).

Nothing here asks a model, and nothing here imports a method package: the runner that asks the answer judge
and ARBOR's pairwise judge is ``scripts/judge_bench.py`` (a script may import a method; a shared module may not).
"""
