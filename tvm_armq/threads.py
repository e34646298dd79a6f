"""The thread pool a compiled model runs with: ``compile_tflite(..., threads=N, cores=...)``.

TVM's runtime keeps one pool per calling thread. Left alone it sizes the pool when first
used, from ``TVM_NUM_THREADS`` or else from the cores it finds at the top frequency
(on a phone whose cores run at three frequencies, that can be one core). A model compiled
with ``threads=N`` sets its pool itself: its ``main`` first calls the library function
``tvm_armq_configure_pool`` (``pool_func``), which asks the runtime for N threads
(``runtime.config_threadpool``) on the fastest cores (``cores="big"``, the default) or
the slowest (``cores="little"``: TVM's affinity modes 1 and -1), each worker pinned to
one core where the machine has as many cores as the pool has threads (else TVM warns and
leaves them unpinned), the calling thread being one of the N. It does so once per calling thread:
``tvm_armq_pool_unconfigured`` (``GUARD_SOURCE``, a few lines of C++ linked into every
library by ``export.export_aarch64``) remembers per thread the request it last served,
so later runs cost a call and a compare, not a system call per worker.

The runtime caps the pool at what it was created with: ``TVM_NUM_THREADS`` where set, else
the cores the machine has. The emulated device starts its server with
``TVM_NUM_THREADS=1`` (one core) unless told otherwise; ``estimate --threads N`` runs
with ``TVM_NUM_THREADS=N`` and compiles with ``threads=N``.
"""

from __future__ import annotations

CORES = {"big": 1, "little": -1}  # TVM's ThreadGroup::AffinityMode, kBig and kLittle
POOL_FUNC = "tvm_armq_configure_pool"   # the library function main calls first
GUARD = "tvm_armq_pool_unconfigured"    # the C++ guard it consults

GUARD_SOURCE = f"""\
// {GUARD}(mode, threads): 1 the first time the calling thread asks for this pool
// (tvm_armq/threads.py), then 0 until it asks for another one.
#include <stdint.h>

#ifdef __cplusplus
extern "C"
#endif
int32_t {GUARD}(int32_t mode, int32_t threads) {{
  static thread_local int32_t served_mode = 0, served_threads = 0;  // threads >= 1
  if (served_mode == mode && served_threads == threads) return 0;
  served_mode = mode;
  served_threads = threads;
  return 1;
}}
"""


def check(threads: int | None, cores: str) -> None:
    """Refuse a pool no runtime can give, naming what is wrong."""
    if cores not in CORES:
        raise ValueError(f"cores {cores!r}: expected one of {', '.join(CORES)}")
    if threads is not None and (type(threads) is not int or threads < 1):  # not a bool
        raise ValueError(f"threads must be a whole number of at least 1, got {threads!r}")


def pool_func(threads: int, cores: str):
    """``tvm_armq_configure_pool()``: the runtime's pool for this thread set to ``threads``
    threads on ``cores``, once per calling thread (``GUARD``)."""
    import tvm

    mode = CORES[cores]
    src = f"""
# from tvm.script import tirx as T
@T.prim_func
def {POOL_FUNC}():
    T.func_attr({{"tirx.noalias": True}})
    if T.call_extern("int32", "{GUARD}", {mode}, {threads}) != 0:
        T.evaluate(T.call_packed("runtime.config_threadpool", {mode}, {threads}))
"""
    return tvm.script.from_source(src).with_attr("global_symbol", POOL_FUNC)


def configure_pool(mod, threads: int, cores: str = "big"):
    """``mod`` whose ``main`` sets its thread pool (``pool_func``) before anything else.

    The call has an effect and no result, so ``main`` becomes an impure function: Relax
    keeps an impure call where it is, outside the dataflow blocks, where a pure one with
    an unused result would be dropped."""
    from tvm import relax
    from tvm.script import relax as R

    check(threads, cores)
    main, done = mod["main"], relax.Var("pool", R.Tuple())
    call = relax.VarBinding(done, R.call_packed(POOL_FUNC, sinfo_args=R.Tuple()))
    body = relax.SeqExpr([relax.BindingBlock([call]), *main.body.blocks], main.body.body)
    mod["main"] = relax.Function(main.params, body, main.ret_ty, is_pure=False,
                                 attrs=main.attrs)
    mod[POOL_FUNC] = pool_func(threads, cores)
    return mod


def run_serially(mod):
    """``mod`` with the parallel loops of its PrimFuncs made serial: for ``threads=1``.

    A pool of one thread runs a parallel loop's tasks on the calling thread one after
    another, but the runtime is still entered for each loop (``TVMBackendParallelLaunch``,
    which reads ``TVM_NUM_THREADS`` from the environment every time unless the pool's size
    was given as a CPU list), and each task is a function taking its captured variables
    from a closure. Compiled for one thread, the loops run inline instead; the tasks'
    split (rows, channel blocks) stays as it was, as plain loops."""
    from tvm import tirx

    funcs = {gv: serial_func(f) for gv, f in mod.functions.items()
             if isinstance(f, tirx.PrimFunc)}
    for gv, f in funcs.items():
        mod[gv] = f
    return mod


def has_parallel_loop(func) -> bool:
    """Whether ``func`` (a PrimFunc) has a parallel loop: it enters the runtime's pool."""
    import tvm_ffi
    from tvm import tirx

    found = []

    def note(loop):
        found.append(loop.kind == tirx.ForKind.PARALLEL)
        return loop

    tvm_ffi.structural_map(func.body, [(tirx.For, note)])
    return any(found)


def serial_func(func):
    """``func`` (a PrimFunc) with its parallel loops made serial (``run_serially``)."""
    import tvm_ffi
    from tvm import tirx

    def serial(loop):
        if loop.kind != tirx.ForKind.PARALLEL:
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                        loop.thread_binding, loop.annotations, loop.step, loop.span)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, serial)]))

