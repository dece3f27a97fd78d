"""One of 2 data-parallel ranks killed with SIGKILL mid-step (issue 75.4): the job stops by itself within a bound,
no checkpoint of the interrupted step appears (the last complete one stays ``latest``), and the resumed 2-rank run
ends with the weights of an uninterrupted one, bit for bit.

Rank 1 of ``torchrun --nproc_per_node 2 -m tests.training.data_parallel_case ... grpo 3 CKPT 2`` kills itself after
its rollout of step 2 has begun, before the update's gradient all-reduce; rank 0 then waits in that collective,
which gloo ends at once when the dead peer's socket closes (``Connection reset by peer``; at the latest after
``RUBRICFLOW_RANK_TIMEOUT_S``, 60 s here), and torchrun stops the job with a non-zero exit. Measured here: about
15 s from start to exit, most of it the two interpreters' start.
"""

import time

import pytest

from tests.training.test_data_parallel import max_difference, results, torchrun

STOP_BOUND_S = 120  # start (~10-20 s on 2 shared cores) + one step + the 60 s collective timeout, with margin


@pytest.mark.parametrize("kind", ["grpo", pytest.param("sft", marks=pytest.mark.slow)])
def test_a_rank_killed_mid_step_stops_the_job_and_the_resume_gives_the_uninterrupted_weights(tmp_path, kind):
    ckpt = tmp_path / "ckpt"
    started = time.monotonic()
    killed = torchrun(tmp_path / "killed.st", kind, 3, str(ckpt), "2", check=False, timeout=STOP_BOUND_S)
    stopped_s = time.monotonic() - started
    print(f"{kind}: rank 1 killed in step 2; job stopped after {stopped_s:.1f} s with exit {killed.returncode}")
    assert killed.returncode != 0 and stopped_s < STOP_BOUND_S
    assert "exitcode  : -9" in killed.stderr  # the killed rank, as torchrun reports it
    assert (ckpt / "latest").read_text().strip() == "step_000001"
    assert sorted(p.name for p in ckpt.iterdir()) in (["latest", "step_000001"],
                                                      ["latest", "step_000001"] + [p.name for p in ckpt.glob(".tmp-*")])
    assert not (tmp_path / "killed.st").exists()  # the run's outputs: none from a run that did not finish
    torchrun(tmp_path / "resumed.st", kind, 3, str(ckpt))
    torchrun(tmp_path / "straight.st", kind, 3)
    (resumed, log), (straight, _) = results(tmp_path / "resumed.st"), results(tmp_path / "straight.st")
    assert log["resumed"] and len(log["metrics"]) == 2
    assert max_difference(resumed, straight) == 0.0
