"""Mine Prompts: seconds per iteration of a resumed run against the same iterations of a fresh run
(issue 34: a stopped T=30 run resumed at 8.7 s an iteration, a fresh one ran at 1.4 s).

    python bench/mine_resume_speed.py [T] [stop_after]

A fresh run of T iterations on the synthetic world is timed iteration by iteration. A second
run (another store, so nothing is cached) is stopped after `stop_after` iterations, as the tab's
Stop does (the method is closed and saves its state), and resumed up to T in a new engine. Each
iteration is timed as the CPU time of this process between two IterationDone events. Prints the
mean prompts and CPU seconds per iteration of the fresh run's first `stop_after` iterations, and of
iterations stop_after+1..T in both runs; the headline, last, is resumed / fresh (first iterations):
about 1 when a resumed run, whose archive is already long, goes as fast as a fresh run starts.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time

from _common import report

GA = dict(population=12, select=3, mutations=3, n=16, seed=0)


def iteration_seconds(events) -> dict[int, tuple[float, int]]:
    """{iteration: (CPU seconds of this process since the previous IterationDone or the first event,
    prompts in its population)}. CPU time, not wall time: on a shared machine the load of other
    processes would otherwise swamp the difference measured."""
    from engine.methods import mine

    out, last = {}, None
    for event in events:
        now = time.process_time()
        last = last or now
        if isinstance(event, mine.IterationDone):
            out[event.iteration] = (now - last, len(event.record["population"]))
            last = now
    return out


def per_iteration(times: dict, iterations) -> tuple[float, float]:
    """(mean seconds per iteration, mean prompts per iteration) over `iterations`."""
    chosen = [times[t] for t in iterations]
    return statistics.mean(s for s, _ in chosen), statistics.mean(k for _, k in chosen)


def main() -> None:
    from engine.core.engine import Engine
    from engine.methods import mine

    T = int(sys.argv[1]) if len(sys.argv) > 1 else 14
    stop_after = int(sys.argv[2]) if len(sys.argv) > 2 else T // 2

    def engine(data_dir: str | None = None):
        e = Engine("synthetic", data_dir=data_dir or tempfile.mkdtemp(prefix="gaplens-bench-resume-"), max_images=256)
        e.model_id("generator")   # load outside the timing
        return e

    fresh = iteration_seconds(mine.run(mine.MineRequest(iterations=T, **GA), engine()))

    first = engine()
    events = mine.run(mine.MineRequest(iterations=T, **GA), first)
    run_id = None
    for event in events:
        run_id = getattr(event, "run_id", run_id)
        if isinstance(event, mine.IterationDone) and event.iteration + 1 == stop_after:
            break
    events.close()   # what Stop does: the method saves its state and the run is kept
    again = engine(str(first.store.data_dir))
    resumed = iteration_seconds(mine.run(mine.MineRequest(resume=run_id, iterations=T), again))

    later = [t for t in range(stop_after, T) if t in fresh and t in resumed]
    early_s, early_k = per_iteration(fresh, range(stop_after))
    late_s, late_k = per_iteration(fresh, later)
    resumed_s, resumed_k = per_iteration(resumed, later)
    report(iterations=T, stopped_after=stop_after, compared_iterations=len(later),
           fresh_first_iterations_prompts_per_iteration=early_k, fresh_later_iterations_prompts_per_iteration=late_k,
           resumed_prompts_per_iteration=resumed_k, fresh_first_iterations_cpu_s_per_iteration=early_s,
           fresh_later_iterations_cpu_s_per_iteration=late_s, resumed_cpu_s_per_iteration=resumed_s,
           resumed_over_fresh=resumed_s / early_s)


if __name__ == "__main__":
    main()
