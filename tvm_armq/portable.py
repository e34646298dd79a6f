"""One library for every Arm CPU: each GEMM and depthwise layer carries a kernel per ISA
level and the CPU it runs on picks one.

Read this first. A ``portable`` build (``targets.portable()``; ``compile --isa portable``)
compiles the whole model for the baseline level, neon, so every instruction outside the
GEMM and depthwise kernels runs on any Armv8.0 CPU. Each conv2d / dense layer becomes three
functions (a depthwise layer alike, its kernel built for each level: sdot from dotprod up):

    <layer>__<kernel of level L>   the layer's GEMM planned, scheduled and compiled for L
                                   alone (its own LLVM module with L's target features: no
                                   instruction of a higher level can leak into the code a
                                   lower-level CPU runs), one per level of the build
    the layer's dispatcher         in the baseline module: asks ``tvm_armq_level()`` which
                                   level this CPU runs and calls that level's function
                                   directly (``call_cpacked``: a C call, no lookup)

Weights are constants of the dispatcher: a packed layout two levels share is stored once.

``tvm_armq_level()`` is a small C function linked into every library (``SELECT_SOURCE``,
written by ``export.export_aarch64``). TVM's generated code could call ``getauxval``
itself, but not keep the answer: the C function reads ``getauxval(AT_HWCAP)`` bit
``HWCAP_ASIMDDP`` (dotprod) and ``getauxval(AT_HWCAP2)`` bit ``HWCAP2_I8MM`` once per
process, applies the ``TVM_ARMQ_ISA`` cap (``neon`` | ``dotprod`` | ``i8mm``), and
returns the cached level on every later call: a load and a compare per layer. A cap above
what the CPU has is refused: the level comes back negative, the dispatcher's assertion
fails with a message, and nothing runs an instruction the CPU lacks. The library's
``tvm_armq_selected_level`` function (callable over RPC) reports the choice.
"""

from __future__ import annotations

import dataclasses
import re

from .targets import LEVELS

ENV_CAP = "TVM_ARMQ_ISA"
SELECTOR = "tvm_armq_selected_level"   # the library function that reports the choice
LEVEL_CODE = {name: i for i, name in enumerate(LEVELS)}  # what tvm_armq_level() returns
CAP_ABOVE_CPU, CAP_UNKNOWN = -1, -2  # its refusals

# getauxval bits (Linux and Android, arch/arm64/include/uapi/asm/hwcap.h)
AT_HWCAP, AT_HWCAP2 = 16, 26
HWCAP_ASIMDDP, HWCAP2_I8MM = 1 << 20, 1 << 13

SELECT_SOURCE = f"""\
// tvm_armq_level(): the ISA level this CPU runs tvm_armq kernels at (tvm_armq/portable.py).
// 0 neon, 1 dotprod, 2 i8mm; {CAP_ABOVE_CPU}: {ENV_CAP} asks for more than the CPU has;
// {CAP_UNKNOWN}: {ENV_CAP} names no level. Computed once per process, then cached.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

static int32_t cpu_level(void) {{
#if defined(__linux__)
  unsigned long hwcap = getauxval({AT_HWCAP}), hwcap2 = getauxval({AT_HWCAP2});
  if (!(hwcap & {HWCAP_ASIMDDP}UL)) return 0;
  return (hwcap2 & {HWCAP2_I8MM}UL) ? 2 : 1;
#else
  return 0;
#endif
}}

static int32_t decide(void) {{
  static const char* const names[] = {{{", ".join(f'"{n}"' for n in LEVELS)}}};
  int32_t cpu = cpu_level();
  const char* cap = getenv("{ENV_CAP}");
  if (cap == NULL || cap[0] == 0) return cpu;
  for (int32_t i = 0; i < {len(LEVELS)}; ++i) {{
    if (strcmp(cap, names[i]) == 0) {{
      if (i <= cpu) return i;
      fprintf(stderr, "tvm_armq: {ENV_CAP}=%s, but this CPU runs %s at most\\n", cap,
              names[cpu]);
      return {CAP_ABOVE_CPU};
    }}
  }}
  fprintf(stderr, "tvm_armq: {ENV_CAP}=%s is not one of {", ".join(LEVELS)}\\n", cap);
  return {CAP_UNKNOWN};
}}

#ifdef __cplusplus
extern "C"
#endif
int32_t tvm_armq_level(void) {{
  static volatile int32_t cached = -100;  // a race only computes the same value twice
  if (cached == -100) cached = decide();
  return cached;
}}
"""


@dataclasses.dataclass
class Variant:
    """One level's function of a GEMM or depthwise layer: compiled into that level's
    module."""

    level: str
    symbol: str
    func: object
    kernel: str


@dataclasses.dataclass
class Variants:
    """What a portable build compiles besides the baseline module: every layer's per-level
    functions, grouped by level when linked (``link``)."""

    levels: tuple
    items: list = dataclasses.field(default_factory=list)

    def symbol(self, label: str, kernel: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", label)
        return f"tvm_armq_{base}_{len(self.items)}__{kernel}"

    def add(self, level: str, label: str, func, kernel: str) -> str:
        sym = self.symbol(label, kernel)
        self.items.append(Variant(level, sym, func.with_attr("global_symbol", sym), kernel))
        return sym

    def run_serially(self) -> None:
        """Every level function's parallel loops made serial (``threads.run_serially``: a
        build for one thread)."""
        from .threads import serial_func

        for v in self.items:
            v.func = serial_func(v.func)

    def compile_level(self, level: str):
        """The library of ``level``'s functions (the baseline level's also holds the level
        selector), compiled for that level alone; None if it has none."""
        import tvm

        from .targets import resolve

        funcs = {v.symbol: v.func for v in self.items if v.level == level}
        if level == self.levels[0]:
            funcs[SELECTOR] = selector_func()
        return tvm.compile(tvm.IRModule(funcs), target=resolve(level)) if funcs else None

    def link(self, executable) -> None:
        """Import each level's library (``compile_level``) into ``executable``'s."""
        for level in self.levels:
            lib = self.compile_level(level)
            if lib is not None:
                executable.mod.import_module(lib.mod)


def level_name(code: int) -> str:
    """The level ``tvm_armq_level()`` returned ``code`` for; a refusal raises."""
    names = list(LEVELS)
    if 0 <= code < len(names):
        return names[code]
    why = {CAP_ABOVE_CPU: f"{ENV_CAP} asks for an ISA level this CPU lacks",
           CAP_UNKNOWN: f"{ENV_CAP} is not one of {', '.join(LEVELS)}"}
    raise RuntimeError(why.get(code, f"tvm_armq_level() returned {code}"))


def selector_func():
    """``tvm_armq_selected_level(out)``: out[0] = the level code this CPU runs.

    It is marked ``tirx.noalias`` like every kernel, and must be: TVM 0.27's LLVM code
    generator can carry one function's missing mark over to the others of its module
    (which ones depends on the order of their names). Without it, the neon GEMMs that
    share its module lost their ``noalias`` arguments, kept their accumulators in memory
    (a store at every K step) and cost 1.7x the cycles of the neon build's."""
    import tvm

    src = f"""
# from tvm.script import tirx as T
@T.prim_func
def {SELECTOR}(out: T.Buffer((1,), "int32")):
    T.func_attr({{"tirx.noalias": True}})
    out[0] = T.call_extern("int32", "tvm_armq_level")
"""
    return tvm.script.from_source(src).with_attr("global_symbol", SELECTOR)


def _buffer(name: str, shape, dtype: str) -> str:
    return f'{name}: T.Buffer({tuple(int(s) for s in shape)!r}, "{dtype}")'


def dispatcher(inputs, consts, out, calls: dict, attrs: dict):
    """The dispatcher PrimFunc of one layer: parameters ``inputs`` (name, shape, dtype),
    ``consts`` (name, shape, dtype) and ``out`` (name, shape, dtype); ``calls``: level ->
    (symbol, the parameter names that level's function takes, in order)."""
    import tvm

    params = ", ".join(_buffer(*p) for p in [*inputs, *consts, out])
    order = sorted(calls, key=LEVEL_CODE.get, reverse=True)  # the richest level first
    lines = []
    for i, level in enumerate(order):
        symbol, args = calls[level]
        call = f'T.evaluate(T.call_cpacked("__tvm_ffi_{symbol}", {", ".join(args)}))'
        if len(order) == 1:
            lines.append(f"    {call}")
            continue
        test = ("if" if i == 0 else "elif") + f" level >= {LEVEL_CODE[level]}:"
        lines += ["    " + (test if i < len(order) - 1 else "else:"), f"        {call}"]
    attr = ", ".join(f'"{k}": "{v}"' for k, v in attrs.items())
    src = f"""
# from tvm.script import tirx as T
@T.prim_func
def dispatch({params}):
    T.func_attr({{"tirx.noalias": True, {attr}}})
    level: T.int32 = T.call_extern("int32", "tvm_armq_level")
    assert level != {CAP_ABOVE_CPU}, "{ENV_CAP} asks for an ISA level this CPU lacks"
    assert level != {CAP_UNKNOWN}, "{ENV_CAP} is not one of {', '.join(LEVELS)}"
{chr(10).join(lines)}
"""
    return tvm.script.from_source(src)


def unique_consts(per_level: dict) -> tuple[list, dict]:
    """The constants of every level's function, each distinct array once: (arrays,
    level -> indices into arrays, in that function's order)."""
    import numpy as np

    arrays, index = [], {}
    for level, consts in per_level.items():
        idx = []
        for c in consts:
            for i, a in enumerate(arrays):
                if a.shape == c.shape and a.dtype == c.dtype and np.array_equal(a, c):
                    idx.append(i)
                    break
            else:
                arrays.append(c)
                idx.append(len(arrays) - 1)
        index[level] = idx
    return arrays, index
