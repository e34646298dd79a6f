"""Checks the tests share, written so that they can fail.

Two kinds of guard are easy to write so that they pass vacuously; these helpers are
the one place where they are written carefully:

* ``assert_alive`` / ``output_pairs``: "the compiled model equals TFLite" means little
  when TFLite's output hardly varies (a net whose logits collapsed onto a few values, a
  softmax whose probabilities all round to its zero point). Every output of every model
  a test compares must vary in proportion to its size, and a model must have outputs.
* ``function_asm`` / ``assert_functions_use``: "the kernel's instructions are in the
  assembly" must hold for each compiled function (not somewhere in a module of many),
  by mnemonic (``addp`` is not ``faddp``, ``sdot`` is not ``usdot``), and fails when
  there is nothing to look for or no such function.
"""

from __future__ import annotations

import math
import re

import numpy as np

# ------------------------------------------------------------------ outputs that vary

# An output of n int8 elements can take at most min(n, 256) distinct values. A live one
# takes at least this share of them (the zoo's outputs: 7 to 10 of 8-16 logits or
# channels, 61 of 256 and more of everything larger, e.g. 126-180 of the MobileNets'
# 1000 logits); a collapsed one takes a handful.
MIN_DISTINCT_SHARE = 1 / 4
# No one value may hold more than this share of the output. Not one half: a fused ReLU
# clamps about half of a zero-centred layer onto its zero point by design, more when the
# biases lean negative (the zoo's fully_connected: 10 of its 16 outputs, 0.625). A
# collapsed output puts nearly all its elements on one value.
MAX_MODE_SHARE = 2 / 3


def assert_alive(expected: np.ndarray, what: str) -> None:
    """Fail unless ``expected`` (a reference output) really varies: at least
    ``MIN_DISTINCT_SHARE`` of the min(size, 256) values it could take, and no value on
    more than ``MAX_MODE_SHARE`` of its elements. Both bounds scale with the size, so
    five distinct values among 1000 logits fail where they would pass a fixed count."""
    e = np.asarray(expected)
    assert e.size > 0, f"{what}: empty output"
    values, counts = np.unique(e, return_counts=True)
    need = math.ceil(MIN_DISTINCT_SHARE * min(e.size, 256))
    assert len(values) >= need, (f"{what}: collapsed output, {len(values)} distinct values "
                                 f"in {e.size} elements (at least {need} expected)")
    mode = int(counts.argmax())
    share = counts[mode] / e.size
    assert share <= MAX_MODE_SHARE, (f"{what}: collapsed output, {values[mode]} holds "
                                     f"{share:.0%} of its {e.size} elements")


def output_pairs(got: list, expected: list, what: str) -> list:
    """[(got, expected, |got - expected|)] per output (int32; float64 for a float output,
    0 where the values are equal), after checking that there
    is at least one output, as many as TFLite has, each of TFLite's shape and dtype, and
    each of TFLite's outputs alive (``assert_alive``). A loop over the result therefore
    cannot pass by having nothing to compare."""
    assert len(expected) > 0, f"{what}: the model has no outputs"
    assert len(got) == len(expected), f"{what}: {len(got)} outputs, TFLite has {len(expected)}"
    pairs = []
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape and g.dtype == e.dtype, \
            f"{what} output {i}: {g.shape} {g.dtype}, TFLite's is {e.shape} {e.dtype}"
        assert_alive(e, f"{what} output {i}")
        if np.issubdtype(e.dtype, np.floating):  # equal values (NaN to NaN), else how far
            same = (g == e) | (np.isnan(g) & np.isnan(e))
            pairs.append((g, e, np.where(same, 0.0, np.abs(g.astype(np.float64) - e))))
        else:
            pairs.append((g, e, np.abs(g.astype(np.int32) - e.astype(np.int32))))
    return pairs


def assert_exact(got: list, expected: list, what: str) -> None:
    """``output_pairs``' checks, then every element of every output equal to TFLite's."""
    for i, (_, _, diff) in enumerate(output_pairs(got, expected, what)):
        assert diff.max() == 0, f"{what} output {i}: {int((diff > 0).sum())} of {diff.size} " \
                                f"elements differ, by up to {diff.max()}"


def assert_within_float_tolerance(got: list, expected: list, what: str) -> None:
    """``output_pairs``' checks, then every output within the stated float tolerance of
    TFLite's: ``report.FLOAT_RELATIVE_TOLERANCE`` of its largest magnitude (a model whose
    float layers are TVM's code, e.g. a dynamic-range one)."""
    from tvm_armq.report import FLOAT_RELATIVE_TOLERANCE

    for i, (_, e, diff) in enumerate(output_pairs(got, expected, what)):
        bound = FLOAT_RELATIVE_TOLERANCE * float(np.abs(e).max())
        assert diff.max() <= bound, f"{what} output {i}: {diff.max():g} > {bound:g}"


# A live output takes more values than this in ``cli run``'s report of it: a model that
# ran everything but collapsed onto a sign or a saturated pair passes nothing on its
# word. (``assert_alive`` asks more of the outputs it sees itself; ``run`` reports only
# the count.)
MIN_RUN_DISTINCT = 3
_RUN_OUTPUT = re.compile(r"^output (\d+): shape .*?, (\d+) distinct values, ", re.M)


def assert_run_exact(stdout: str, outputs: int, what: str) -> None:
    """Fail unless ``tvm-armq run`` printed a line for each of the model's ``outputs``
    outputs (numbered 0, 1, ...), each of at least ``MIN_RUN_DISTINCT`` distinct values in
    TFLite's, and ended on a zero maximum difference: ``run``'s verdict, read so that a
    missing or a collapsed output cannot pass it."""
    assert outputs > 0, f"{what}: a model without outputs checks nothing"
    found = [(int(i), int(n)) for i, n in _RUN_OUTPUT.findall(stdout)]
    assert [i for i, _ in found] == list(range(outputs)), \
        f"{what}: run reported outputs {[i for i, _ in found]}, the model has {outputs}"
    dead = [i for i, n in found if n < MIN_RUN_DISTINCT]
    assert not dead, f"{what}: outputs {dead} take fewer than {MIN_RUN_DISTINCT} values"
    last = stdout.strip().splitlines()[-1]
    assert last == "max abs difference against TFLite: 0", f"{what}: {last}"


# ------------------------------------------------------------------ tiers


def same_code_at_every_level(model) -> bool:
    """True when ``inspect`` names the same kernels for ``model`` at every ISA level, each
    of them a ``_neon`` one (or no kernel: TVM's own code; or float): the same code runs at
    each level, so the fast tier runs such a model at one level. Nothing is built."""
    from tvm_armq import build
    from tvm_armq.report import Lowered
    from tvm_armq.targets import LEVELS

    kernels = [sorted(r.kernel if isinstance(r, Lowered) else "float"
                      for r in build.inspect(model, level)) for level in LEVELS]
    return all(k == kernels[0] for k in kernels) and \
        all(k == "float" or k.endswith("_neon") for k in kernels[0])


def tier(*values, id: str, fast: bool):
    """``pytest.param`` of ``values``, marked ``exhaustive`` unless the fast tier runs it."""
    import pytest

    return pytest.param(*values, id=id, marks=() if fast else pytest.mark.exhaustive)


def one_level_in_turn(i: int) -> str:
    """The level the fast tier runs the ``i``-th level-independent case at: the levels in
    turn, so that each runs some."""
    from tvm_armq.targets import LEVELS

    return list(LEVELS)[i % len(LEVELS)]


# ------------------------------------------------------------------ instructions


def _functions(asm: str) -> dict[str, str]:
    """symbol -> text of every function in an LLVM assembly listing (from its ``.type``
    directive to the next one)."""
    parts = re.split(r"\n(?=\t\.type\t)", asm)
    found = {}
    for part in parts:
        m = re.match(r"\t\.type\t([^,\n]+),@function", part)
        if m:
            found[m.group(1)] = part
    return found


def _references(func: str) -> set[str]:
    """The symbols a function's instructions name: operands only, since a part of
    ``_functions`` also ends with the next function's ``.globl`` directive, which is no
    reference."""
    code = "\n".join(re.findall(r"^\t[a-z].*$", func, re.M))
    return set(re.findall(r"[\w.$]+", code))


def function_asm(asm: str, name: str) -> str:
    """The assembly of the compiled function ``name`` of a module: TVM's entry points
    (``name``, its ``__tvm_ffi_name`` wrapper, its ``name_compute_`` body) and every
    function they reference (the ``__tvm_parallel_lambda`` a parallel loop becomes),
    transitively. Empty if the module has no function ``name``."""
    funcs = _functions(asm)
    own = re.compile(rf"(__tvm_ffi_)?{re.escape(name)}(_compute_)?")
    todo = [s for s in funcs if own.fullmatch(s)]
    seen: set[str] = set()
    while todo:
        sym = todo.pop()
        if sym in seen:
            continue
        seen.add(sym)
        refs = _references(funcs[sym])
        todo += [s for s in funcs if s in refs and s not in seen]
    return "\n".join(funcs[s] for s in funcs if s in seen)


def mnemonics(asm: str) -> set[str]:
    """The instruction mnemonics of an assembly fragment (``b.ne``, ``sdot``, ...)."""
    return set(re.findall(r"^\t([a-z][a-z0-9.]*)(?:\t|$)", asm, re.M))


# A pairwise widening add whose result is added to an accumulator is one instruction,
# which LLVM selects: saddlp + add = sadalp. The neon 8-byte kernel (smull, saddlp, addp)
# compiles to saddlp alone for K = 8 (one block), to both for K = 24 and to sadalp alone
# for K = 72 read in place (test_neon_8_byte_kernel_on_device), so either form counts.
FOLDED = {"saddlp": "sadalp", "uaddlp": "uadalp"}


def assert_functions_use(asm: str, names, instructions, what: str) -> None:
    """Fail unless every compiled function of ``names`` contains every mnemonic of
    ``instructions`` (or its ``FOLDED`` accumulating form); fails on an empty ``names``
    or ``instructions`` (a check of nothing) and on a name the module does not define."""
    names, instructions = list(names), list(instructions)
    assert names, f"{what}: no function to check"
    assert instructions, f"{what}: no instruction to look for"
    for name in names:
        body = function_asm(asm, name)
        assert body, f"{what}: no function {name} in the assembly"
        found = mnemonics(body)
        missing = [ins for ins in instructions if ins not in found and FOLDED.get(ins) not in found]
        assert not missing, f"{what}: {name} has no {', '.join(missing)}"


# A parallel loop's body becomes a private function of its own (``.L`` before the name in
# the assembly); TVM's runtime allocates through its workspace pool with this call.
PARALLEL_TASK = "__tvm_parallel_lambda"
WORKSPACE_ALLOC = "__TVMBackendAllocWorkspace"


def assert_no_workspace_per_task(asm: str, what: str) -> None:
    """Fail if a parallel task of the module allocates from the runtime's workspace pool:
    what a macro tile keeps in registers must live on the stack (``forms.registers``), not
    cost two runtime calls per tile. Fails on a module with no parallel task (nothing
    checked)."""
    funcs = _functions(asm)
    tasks = [s for s in funcs if s.removeprefix(".L").startswith(PARALLEL_TASK)]
    assert tasks, f"{what}: no parallel task to check"
    pooled = [s for s in tasks if WORKSPACE_ALLOC in _references(funcs[s])]
    assert not pooled, (f"{what}: {len(pooled)} of {len(tasks)} parallel tasks allocate from "
                        f"the workspace pool ({', '.join(sorted(pooled)[:3])}, ...)")


def llvm_source(exe) -> str:
    """The LLVM IR of every LLVM module of a compiled executable's library (the VM's own
    module and the kernels it imports)."""
    return "".join(m.inspect_source("ll") for m in [exe.mod, *exe.mod.imports]
                   if m.kind == "llvm")
