"""The differential fuzzer (scripts/fuzz.py): a fixed-seed slice at every ISA level, every
reproducer it ever found, and the host-side promises its reproducers rest on.

A slice is one batch of random cases (single layers and chains of every op the fuzzer
draws) compiled as one module, run on the level's emulated device and compared with
TFLite's reference kernels bit for bit. ``tests/fuzz_cases/`` holds each failing case the
fuzzer found, written alone (``<level>-s<seed>-<index>.tflite`` with its ``.json``); each
runs here at the level it failed on, against TFLite, on several inputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import fuzz  # noqa: E402

from armq_checks import tier  # noqa: E402
from tvm_armq.targets import LEVELS  # noqa: E402

CASES_DIR = Path(__file__).with_name("fuzz_cases")
SLICE_SEED = 20261124
# The seed's first SLICE_N cases: the fast tier runs the first FAST_N of them at each level
# (one batch, one compiled module), the exhaustive tier the other 24 (one batch), so that
# the two tiers together run the whole slice and neither repeats the other. Each part has
# at least 70% of its cases alive (outputs of 3 values and more): 8 of the first 8 (GELU,
# a FULLY_CONNECTED, a BATCH_MATMUL among them), 20 of the other 24.
SLICE_N = 32
FAST_N = 8
SLICES = [tier(level, cases, id=f"{level}-{part}", fast=part == "fast")
          for part, cases in (("fast", range(FAST_N)), ("rest", range(FAST_N, SLICE_N)))
          for level in LEVELS]


# The dynamic-range mode (``--dynamic``): its own seed's first DYNAMIC_N cases, hybrid
# FULLY_CONNECTED and CONV_2D layers, bit-exact at every level (the fast tier: one level).
DYNAMIC_N = 12
DYNAMIC_SLICES = [tier(level, id=level, fast=level == "i8mm") for level in LEVELS]


@pytest.mark.device
@pytest.mark.parametrize("level", DYNAMIC_SLICES)
def test_dynamic_range_slice(level, devices):
    cases = list(range(DYNAMIC_N))
    outcomes = fuzz.fuzz(level, DYNAMIC_N, SLICE_SEED, list(fuzz.HYBRID), batch=DYNAMIC_N,
                         session=devices.session(level), log=lambda *_: None, cases=cases)
    assert [o.case.index for o in outcomes] == cases, fuzz.summary(outcomes)
    bad = [f"{o.kind}: {o.case.name} {o.case.describe()}: {o.detail}"
           for o in outcomes if o.kind != "ok"]
    assert not bad, "\n".join(bad)
    assert sum(o.alive for o in outcomes) >= 0.7 * len(outcomes), fuzz.summary(outcomes)


def _reproducers() -> list[Path]:
    return sorted(CASES_DIR.glob("*.tflite"))


@pytest.mark.device
@pytest.mark.parametrize("level, cases", SLICES)
def test_fixed_seed_slice(level, cases, devices):
    cases = list(cases)
    outcomes = fuzz.fuzz(level, len(cases), SLICE_SEED, fuzz.INT8_LAYERS, batch=len(cases),
                         session=devices.session(level), log=lambda *_: None, cases=cases)
    # every case drawn has its outcome: a batch that lost an output must not lose a case
    assert [o.case.index for o in outcomes] == cases, fuzz.summary(outcomes)
    bad = [f"{o.kind}: {o.case.name} {o.case.describe()}: {o.detail}"
           for o in outcomes if o.kind != "ok"]
    assert not bad, "\n".join(bad)
    # the comparison means something only where TFLite's outputs vary
    alive = sum(o.alive for o in outcomes)
    assert alive >= 0.7 * len(outcomes), fuzz.summary(outcomes)


@pytest.mark.device
def test_reproducers_are_exact(devices, tmp_path):
    """Every case the fuzzer ever found failing, at its level, on four inputs: it compiles
    with every layer integer, gives as many outputs as TFLite, each equal to TFLite's. A
    case found for its numbers ("differs") proves its fix by the comparison, so its outputs
    must be alive; one found failing to compile ("error") or falling back to float
    ("float") proves its fix by compiling integer, and the layers some of them drew (a
    RELU_N1_TO_1 on one channel) leave TFLite's output one or two values on any input."""
    from armq_checks import output_pairs

    from tvm_armq import build, export
    from tvm_armq.frontend.model import TFLiteModel
    from tvm_armq.report import Fallback

    paths = _reproducers()
    assert paths, f"{CASES_DIR} holds no reproducer"
    sessions = {}  # one per level: a device serves one session at a time
    for path in paths:
        meta = json.loads(path.with_suffix(".json").read_text())
        model, report = TFLiteModel.load(path), []
        lib = export.export_aarch64(build.compile_tflite(model, meta["level"], report=report),
                                    tmp_path / f"{path.stem}.so")
        assert not [r for r in report if isinstance(r, Fallback)], path.name
        level = meta["level"]
        if level not in sessions:
            sessions[level] = devices.session(level)
        run = build.DeviceModel(sessions[level], lib)  # one upload per library
        for seed in range(4):
            inputs = model.random_inputs(seed)
            got, expected = run(inputs), model.reference_outputs(inputs)
            what = f"{path.name} (seed {seed}): {meta['layers']}"
            if meta["kind"] == "differs":
                pairs = output_pairs(got, expected, what)
            else:
                assert len(got) == len(expected) > 0, f"{what}: {len(got)} outputs, " \
                                                      f"TFLite has {len(expected)}"
                pairs = [(g, e, None) for g, e in zip(got, expected)]
            for g, e, _ in pairs:
                assert g.shape == e.shape and np.array_equal(g, e), what


def test_a_case_is_the_same_alone_and_in_a_batch():
    """Case i of a seed draws from its own generator: the reproducer written alone is the
    layer that failed in the batch, and a run is repeatable."""
    ops = fuzz.INT8_LAYERS
    alone = [fuzz.batch_model(7, [i], ops, 0.5)[1][0].layers for i in range(6)]
    together = [c.layers for c in fuzz.batch_model(7, range(6), ops, 0.5)[1]]
    assert repr(alone) == repr(together)
    first, again = (fuzz.batch_model(7, [3], ops, 0.5)[0].data for _ in range(2))
    assert first == again


@pytest.mark.parametrize("op", list(fuzz.LAYERS))
def test_every_op_draws_models_tflite_runs(op):
    """Each generator writes models TFLite's reference kernels accept, mostly with live
    outputs: a generator that TFLite rejects would only ever report errors."""
    alive = 0
    for i in range(6):
        model, cases = fuzz.batch_model(11, [i], [op], 0.0)
        assert [name for name, _ in cases[0].layers] == [op]
        out = model.reference_outputs(model.random_inputs(0))
        alive += len(np.unique(out[0])) > 1
    assert alive >= 3, f"{op}: {alive} of 6 random layers have a varying output"
