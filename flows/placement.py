"""Which Ray resources a submitted task asks for: the training tasks a GPU slot each
(``sweep.ray_gpus_per_training_task``), everything else (evaluation, judging, reports) none, so evaluations
keep running on CPUs while a training run waits for a GPU.

Ray sets ``CUDA_VISIBLE_DEVICES`` of a task that was given GPUs to those GPUs only, so inside it
``train_policy.device: auto`` resolves to the GPU Ray handed out (components/training/device.py). A task that
asks for no GPU sees every GPU of its node: with the default 0, training on a GPU node would share cuda:0.

    with ray_placement(train_policy, settings, "ray"):
        pool.submit(train_policy, parameters=...)     # @ray.remote(num_gpus=...) for this submission only
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from components.params import SweepParams

TRAINING_TASKS = frozenset({"train_policy", "sft", "train_rubric_generator"})
"""Task names (``@task(name=...)``) that update weights: the ones that ask Ray for GPUs."""


def ray_resources(task: Any, settings: SweepParams) -> dict[str, float]:
    """The Ray remote options of ``task`` (a Prefect task, or its name): ``num_gpus`` for a training task when
    ``settings.ray_gpus_per_training_task`` is above 0, else nothing (Ray's default: one CPU)."""
    name = task if isinstance(task, str) else task.name
    gpus = settings.ray_gpus_per_training_task
    return {"num_gpus": gpus} if name in TRAINING_TASKS and gpus > 0 else {}


@contextmanager
def ray_placement(task: Any, settings: SweepParams, runner: str) -> Iterator[dict[str, float]]:
    """Submissions inside ask Ray for ``ray_resources(task, settings)`` (prefect-ray's ``remote_options``);
    with the thread runner, or nothing to ask for, it changes nothing. Yields the options."""
    options = ray_resources(task, settings) if runner == "ray" else {}
    if not options:
        yield options
        return
    from prefect_ray.context import remote_options

    with remote_options(**options):
        yield options
