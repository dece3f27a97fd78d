"""Run one function in several fresh processes released at the same moment, as runs started side by side are."""

import multiprocessing


def run_side_by_side(target, *args, n: int = 3, timeout_s: float = 60) -> list[int | None]:
    """Spawn ``n`` processes running ``target(start, *args)``; each should wait on the event ``start``, which is set
    once all have started. Returns their exit codes (None for one still running after ``timeout_s``)."""
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: nothing inherited from earlier tests
    start = ctx.Event()
    procs = [ctx.Process(target=target, args=(start, *args)) for _ in range(n)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(timeout_s)
    return [proc.exitcode for proc in procs]
