"""The fast tier keeps what it promises: every kernel family at every ISA level on the
device. The suite is collected twice (host only, nothing runs): the fast tier's selection
(``-m "not exhaustive"``, what ``.ci/run`` runs) and the whole suite. A kernel family's
device test that loses a level in the fast tier, or a kernel of the selection table whose
device test leaves the fast tier, fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tvm_armq.targets import LEVELS

TESTS = Path(__file__).resolve().parent
# The kernel families' device tests, parametrized by level: the fast tier runs each at every
# level the whole suite runs it at, which is all three but where ``TWO_LEVELS`` says.
AT_EVERY_LEVEL = [
    "test_conv2d_gemm.py::test_table_sweep_on_device",
    "test_conv2d_gemm.py::test_conv2d_matches_tflite",
    "test_conv2d_gemm.py::test_bounded_shift_epilogue_on_device",
    "test_conv2d_u8.py::test_conv2d_u8_on_device",
    "test_depthwise.py::test_depthwise_on_device",
    "test_depthwise.py::test_depthwise_matches_tflite",
    "test_int8_ops.py::test_int8_ops_on_device",
    "test_qmuls.py::test_qmuls_on_device",
    "test_requantize_narrow.py::test_on_device",
    "test_lut.py::test_table_kernel_looks_up_every_value_on_the_device",
    "test_portable.py::test_one_library_runs_exact_on_every_level",
    "test_fuzz.py::test_fixed_seed_slice",
    "test_models.py::test_model_is_bit_exact",
    "test_op_coverage.py::test_op_is_integer_and_bit_exact",
]
# int8 ops and the int8 output step: _neon code at every level, run at neon and i8mm
TWO_LEVELS = {"test_int8_ops.py::test_int8_ops_on_device": {"neon", "i8mm"},
              "test_requantize_narrow.py::test_on_device": {"neon", "i8mm"}}
# Device tests parametrized by kernel (each on its lowest level) or by nothing: the fast
# tier runs every one of their cases.
WHOLE = [
    "test_intrinsics.py::test_kernel_is_exact_on_its_lowest_level",
    "test_intrinsics.py::test_assembly_has_the_instruction",
    "test_conv2d_bf16.py::test_conv2d_bf16_on_device",
    "test_bf16_models.py::test_single_layer_is_bit_exact",
    "test_widen.py::test_smull_on_device",
    "test_call_sequence.py::test_one_function_runs_bit_exact_run_after_run",
    "test_fuzz.py::test_reproducers_are_exact",
]


def _collected(files: list[str], marks: str) -> list[str]:
    """Node ids (file::test[params]) that ``-m marks`` selects in ``files``."""
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                          "-p", "no:cacheprovider", "-m", marks, *files],
                         cwd=TESTS.parent, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [ln.split("@")[0].removeprefix("tests/") for ln in res.stdout.splitlines()
            if ln.startswith("tests/") and "::" in ln]


@pytest.fixture(scope="module")
def tiers():
    files = sorted({"tests/" + name.split("::")[0] for name in AT_EVERY_LEVEL + WHOLE})
    return _collected(files, "not exhaustive"), _collected(files, "")


def _levels(ids: list[str], test: str) -> set[str]:
    """The ISA levels named in the parameters of ``test``'s cases."""
    found = set()
    for nodeid in ids:
        m = re.fullmatch(rf"{re.escape(test)}\[(.*)\]", nodeid)
        if m:
            found |= set(re.split(r"[-_]", m[1])) & set(LEVELS)
    return found


@pytest.mark.parametrize("test", AT_EVERY_LEVEL)
def test_fast_tier_runs_the_family_at_every_level(tiers, test):
    fast, everything = tiers
    assert _levels(fast, test) == _levels(everything, test) == TWO_LEVELS.get(test, set(LEVELS))


@pytest.mark.parametrize("test", WHOLE)
def test_fast_tier_runs_every_case(tiers, test):
    fast, everything = tiers
    cases = [n for n in everything if n == test or n.startswith(test + "[")]
    assert cases, f"{test}: not collected"
    assert [n for n in fast if n == test or n.startswith(test + "[")] == cases, test
