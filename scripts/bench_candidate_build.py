"""How long MetaSchedule takes to build one tuning candidate: stock ``default_build``
against tvm_armq's ``tuning._build_candidate``, through the LocalBuilder tuning uses (fresh
worker processes per round, as MetaSchedule starts them).

    python scripts/bench_candidate_build.py [--model conv2d_3x3] [--isa neon] [--n 8]
"""

from __future__ import annotations

import argparse
import sys
import time

from tvm.s_tir import meta_schedule as ms

from tvm_armq import targets, tuning, zoo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="conv2d_3x3")
    ap.add_argument("--isa", default="neon")
    ap.add_argument("--n", type=int, default=tuning.BATCH, help="candidates per round")
    a = ap.parse_args()
    task = tuning.tasks_of_model(zoo.build(a.model), a.isa)[0]
    tgt = targets.resolve(a.isa)
    ctx = ms.TuneContext(mod=tuning._workload(task.func), target=tgt, task_name=task.name,
                         space_generator=tuning.design_space(task.plan, tgt))
    (sch,) = ctx.generate_design_space()
    inputs = [ms.builder.BuilderInput(sch.mod, tgt) for _ in range(a.n)]
    for name, f_build in [("stock default_build", None),
                          ("tuning._build_candidate", tuning._build_candidate)]:
        builder = ms.builder.LocalBuilder(max_workers=tuning._builder().max_workers,
                                          timeout_sec=tuning.BUILD_TIMEOUT_S, f_build=f_build,
                                          f_export=tuning._export_aarch64_so,
                                          initializer=tuning._init_worker)
        start = time.monotonic()
        results = builder.build(inputs)
        took = time.monotonic() - start
        failed = [r.error_msg for r in results if r.error_msg]
        if failed:
            print(f"{name}: {len(failed)} builds failed: {failed[0][:500]}")
            return 1
        print(f"{name:24s} {a.n} candidates in {took:6.1f} s: {took / a.n:5.2f} s each "
              f"({builder.max_workers} workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
