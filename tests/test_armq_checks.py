"""The shared guards of ``armq_checks`` fail on the cases they exist to catch (host only).

Each case here is one a guard once let through (issue 20): five distinct values among
1000 logits, an output mostly on one value, a model with no outputs, an instruction
found only inside another mnemonic (``addp`` in ``faddp``), a function of the module
without the kernel's instruction while the others have it, an empty instruction list; and
a parallel task that allocates from the runtime's workspace pool; a ``run`` report that
misses an output, reports a collapsed one or ends on a difference.
"""

from __future__ import annotations

import numpy as np
import pytest
from armq_checks import (assert_alive, assert_functions_use, assert_no_workspace_per_task,
                         assert_run_exact, assert_within_float_tolerance, function_asm,
                         mnemonics, output_pairs)


def _logits(seed: int = 0, size: int = 1000) -> np.ndarray:
    """int8 values spread over most of the range, like a net's logits."""
    return np.random.default_rng(seed).integers(-110, 110, size, endpoint=True).astype(np.int8)


def test_live_outputs_pass():
    assert_alive(_logits(), "logits")
    assert_alive(np.arange(10, dtype=np.int8), "ten distinct logits")
    relu = np.where(_logits(1, 4096) < 0, -128, _logits(1, 4096)).astype(np.int8)
    assert_alive(relu, "half on the ReLU floor")


def test_few_distinct_values_fail():
    collapsed = np.clip(_logits(), -2, 2)  # 5 values: the old guard (> 4) let this through
    with pytest.raises(AssertionError, match="5 distinct values in 1000"):
        assert_alive(collapsed, "collapsed logits")


def test_one_value_holding_most_fails():
    e = _logits()
    e[:800] = -128  # still ~200 distinct values, but 80% on one
    with pytest.raises(AssertionError, match="holds 80%"):
        assert_alive(e, "mostly -128")


def test_no_outputs_fail():
    with pytest.raises(AssertionError, match="no outputs"):
        output_pairs([], [], "empty model")
    with pytest.raises(AssertionError, match="1 outputs, TFLite has 2"):
        output_pairs([_logits()], [_logits(), _logits()], "missing output")


def test_output_pairs_gives_the_differences():
    e = _logits()
    g = e.copy()
    g[3] += 2
    ((got, expected, diff),) = output_pairs([g], [e], "one output")
    assert got is g and expected is e and diff.dtype == np.int32
    assert diff.max() == 2 and int((diff > 0).sum()) == 1


def test_float_tolerance_is_relative_to_the_largest_magnitude():
    """``assert_within_float_tolerance``: a difference at the bound passes, one past it
    fails, and a dead output fails however close."""
    from tvm_armq.report import FLOAT_RELATIVE_TOLERANCE

    e = np.random.default_rng(0).uniform(-3, 3, 1000).astype(np.float32)
    bound = FLOAT_RELATIVE_TOLERANCE * float(np.abs(e).max())
    g = e.copy()
    g[7] = np.float32(float(e[7]) + bound / 2)
    assert_within_float_tolerance([g], [e], "half the bound off")
    g[7] = np.float32(float(e[7]) + 4 * bound)
    with pytest.raises(AssertionError, match="output 0: .* > "):
        assert_within_float_tolerance([g], [e], "four times the bound off")
    with pytest.raises(AssertionError):
        assert_within_float_tolerance([np.zeros_like(e)], [np.zeros_like(e)], "dead")


def _run_report(*outputs, worst=0):
    """``tvm-armq run``'s stdout for outputs given as their distinct-value counts."""
    lines = ["52 of 52 quantized layers on tvm_armq kernels: 52 x gemm"]
    lines += [f"output {i}: shape (1, 1000) int8, {n} distinct values, max abs diff vs "
              f"TFLite {worst}, 0/1000 elements differ" for i, n in enumerate(outputs)]
    return "\n".join(lines + [f"max abs difference against TFLite: {worst}"]) + "\n"


def test_run_verdict_needs_every_output_alive_and_equal():
    assert_run_exact(_run_report(153, 40), 2, "two live outputs")
    with pytest.raises(AssertionError, match=r"reported outputs \[0\], the model has 2"):
        assert_run_exact(_run_report(153), 2, "an output missing")
    with pytest.raises(AssertionError, match=r"outputs \[1\] take fewer than 3"):
        assert_run_exact(_run_report(153, 2), 2, "a two-valued output")
    with pytest.raises(AssertionError, match="difference against TFLite: 1"):
        assert_run_exact(_run_report(153, worst=1), 1, "a difference")
    with pytest.raises(AssertionError, match="checks nothing"):
        assert_run_exact(_run_report(), 0, "no outputs")


# A module of two functions as LLVM prints it: ``good`` runs smull/sadalp/addp in its
# parallel lambda, ``bad`` has a float faddp and no addp of its own.
ASM = """\t.text
\t.globl\t__tvm_ffi_good
\t.type\t__tvm_ffi_good,@function
__tvm_ffi_good:
\tbl\tgood_compute_
\tret
\t.globl\t__tvm_ffi_bad
\t.type\tgood_compute_,@function
good_compute_:
\tadrp\tx0, .L__tvm_parallel_lambda
\tadd\tx0, x0, :lo12:.L__tvm_parallel_lambda
\tret
\t.type\t.L__tvm_parallel_lambda,@function
.L__tvm_parallel_lambda:
\tsmull\tv0.8h, v1.8b, v2.8b
\tsadalp\tv3.4s, v0.8h
\taddp\tv4.4s, v3.4s, v3.4s
\tret
\t.type\t__tvm_ffi_bad,@function
__tvm_ffi_bad:
\tsmull\tv0.8h, v1.8b, v2.8b
\tsadalp\tv3.4s, v0.8h
\tfaddp\tv4.4s, v3.4s, v3.4s
\tret
"""
NEON = ("smull", "sadalp", "addp")


def test_function_asm_follows_the_parallel_lambda_only():
    good = function_asm(ASM, "good")
    assert "addp\tv4" in good and "faddp" not in good  # not the next function's text
    assert mnemonics(good) >= set(NEON)
    assert function_asm(ASM, "goo") == ""  # a prefix names no function
    assert_functions_use(ASM, ["good"], NEON, "good")


def test_mnemonic_inside_another_fails():
    assert "addp" in function_asm(ASM, "bad")  # the substring test the guard replaced
    with pytest.raises(AssertionError, match="bad has no addp"):
        assert_functions_use(ASM, ["bad"], NEON, "faddp")


def test_one_function_without_the_instruction_fails():
    assert all(ins in ASM for ins in NEON)  # the module-wide test the guard replaced
    with pytest.raises(AssertionError, match="bad has no addp"):
        assert_functions_use(ASM, ["good", "bad"], NEON, "per function")


def test_checking_nothing_fails():
    with pytest.raises(AssertionError, match="no instruction to look for"):
        assert_functions_use(ASM, ["good"], (), "reference kernel")
    with pytest.raises(AssertionError, match="no function to check"):
        assert_functions_use(ASM, [], NEON, "no functions")
    with pytest.raises(AssertionError, match="no function missing"):
        assert_functions_use(ASM, ["missing"], NEON, "unknown name")


def test_folded_pairwise_add_counts():
    """saddlp + add compiled as sadalp is still the 8-byte kernel's saddlp."""
    assert_functions_use(ASM, ["good"], ("smull", "saddlp", "addp"), "folded")


def test_workspace_per_parallel_task_fails():
    assert_no_workspace_per_task(ASM, "stack only")
    pooled = ASM.replace("\tsadalp\tv3.4s, v0.8h\n",
                         "\tadrp\tx8, :got:__TVMBackendAllocWorkspace\n"
                         "\tsadalp\tv3.4s, v0.8h\n", 1)
    assert pooled != ASM
    with pytest.raises(AssertionError, match="1 of 1 parallel tasks allocate"):
        assert_no_workspace_per_task(pooled, "pooled")
    with pytest.raises(AssertionError, match="no parallel task"):
        assert_no_workspace_per_task(ASM.replace("__tvm_parallel_lambda", "helper"), "none")
