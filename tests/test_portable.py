"""One library for every Arm CPU (tvm_armq/portable.py): the same portable .so of zoo nets
runs on the emulated neon, dotprod and i8mm devices, bit-exact with TFLite's reference
kernels on each, and reports the level its layers chose there; ``TVM_ARMQ_ISA`` caps the
level (the i8mm device then runs the neon kernels, bit-exact) and a cap above the CPU is
refused with a message before any kernel runs.
"""

from __future__ import annotations

import pytest
from armq_checks import assert_exact, assert_run_exact

from tvm_armq import build, device, export, portable, targets, zoo
from tvm_armq.frontend.model import TFLiteModel
from tvm_armq.targets import LEVELS

NETS = ["mobilenet_v1_0.25", "inception_block"]
CAP_PORT = 9480  # the capped devices' ports: away from the suite's level devices


@pytest.fixture(scope="module")
def portable_libs(tmp_path_factory):
    """name -> (model, portable .so, report) for each net, built once."""
    out = {}
    for name in NETS:
        model, report = TFLiteModel.load(zoo.build(name)), []
        ex = build.compile_tflite(model, targets.PORTABLE, report=report)
        lib = export.export_aarch64(ex, tmp_path_factory.mktemp("portable") / f"{name}.so")
        out[name] = (model, lib, report)
    return out


def _exact(dm: build.DeviceModel, model: TFLiteModel, what: str) -> None:
    """As many outputs as TFLite's, each alive and equal to it."""
    inputs = model.random_inputs(1)
    assert_exact(dm(inputs), model.reference_outputs(inputs), what)


@pytest.mark.device
@pytest.mark.parametrize("level", list(LEVELS))
def test_one_library_runs_exact_on_every_level(portable_libs, devices, level):
    session = devices.session(level)  # one at a time: a device serves one session
    for name, (model, lib, report) in portable_libs.items():
        dm = build.DeviceModel(session, lib)
        assert dm.selected_level() == level, name
        _exact(dm, model, f"{name} portable on {level}")


def test_every_gemm_layer_carries_a_kernel_per_level(portable_libs):
    for name, (_, _, report) in portable_libs.items():
        gemms = [r for r in report if r.op in ("conv2d", "dense")]
        assert gemms, name
        order = list(LEVELS)
        for r in gemms:
            # one kernel per level, each of that level or below (a one-row GEMM takes the
            # dotprod one-row kernel at i8mm too), the richest level's above neon's
            isas = [k.rsplit("_", 1)[-1] for k in r.variants]
            assert len(isas) == len(order), r.line()
            assert all(order.index(k) <= i for i, k in enumerate(isas)), r.line()
            assert isas[-1] != isas[0], r.line()


def test_every_depthwise_layer_carries_a_kernel_per_level(portable_libs):
    """MobileNetV1 0.25's depthwise layers: NEON widening multiply-accumulates at neon,
    taps through sdot at dotprod and i8mm (each run bit-exact above)."""
    model, _, report = portable_libs["mobilenet_v1_0.25"]
    layers = [r for r in report if r.op == "depthwise_conv2d"]
    assert len(layers) == 13
    for r in layers:
        assert r.variants == ("depthwise_s8s8s32_3x3_neon_pairs16",
                              "depthwise_s8s8s32_3x3_dotprod",
                              "depthwise_s8s8s32_3x3_dotprod"), r.line()


def test_kernels_compile_in_the_library_as_they_do_alone():
    """A level's library holds its GEMMs as each compiles on its own. TVM's LLVM code
    generator can spread one function's missing ``tirx.noalias`` to the others of a module;
    a GEMM that loses it keeps its accumulators in memory, which shows as more vector
    stores (a one-layer model: its GEMM shares the neon library with the level selector)."""
    import re

    import tvm

    vector_stores = re.compile(r"\tst(r|p|ur|1)\t(q|\{v)")

    def stores(lib):
        return len(vector_stores.findall(lib.mod.inspect_source("asm")))

    model = TFLiteModel.load(zoo.build("conv2d_3x3"))
    tgt = targets.resolve(targets.PORTABLE)
    variants = portable.Variants(targets.portable_levels(tgt))
    build.lower(build.import_tflite(model), tgt, variants=variants)
    for level in variants.levels:
        alone = sum(stores(tvm.compile(tvm.IRModule({v.symbol: v.func}),
                                       target=targets.resolve(level)))
                    for v in variants.items if v.level == level)
        assert alone > 0, level
        assert stores(variants.compile_level(level)) == alone, level


@pytest.mark.device
def test_cap_runs_the_neon_kernels_on_an_i8mm_cpu(portable_libs):
    model, lib, _ = portable_libs[NETS[0]]
    dev = device.start("i8mm", port=CAP_PORT, env={portable.ENV_CAP: "neon"})
    try:
        dm = build.DeviceModel(dev.endpoint.connect(), lib)
        assert dm.selected_level() == "neon"
        _exact(dm, model, "portable on i8mm capped at neon")
    finally:
        dev.stop()


@pytest.mark.device
def test_cap_above_the_cpu_is_refused_not_a_sigill(portable_libs):
    model, lib, _ = portable_libs[NETS[0]]
    dev = device.start("neon", port=CAP_PORT, env={portable.ENV_CAP: "i8mm"})
    try:
        dm = build.DeviceModel(dev.endpoint.connect(), lib)
        with pytest.raises(RuntimeError, match="TVM_ARMQ_ISA asks for an ISA level"):
            dm.selected_level()
        with pytest.raises(Exception, match="TVM_ARMQ_ISA asks for an ISA level this CPU lacks"):
            dm(model.random_inputs(0))
    finally:
        dev.stop()


def test_portable_target_names_its_levels():
    t = targets.resolve(targets.target(targets.PORTABLE, levels=("i8mm", "neon")))
    assert targets.portable_levels(t) == ("neon", "i8mm")
    assert targets.portable_levels(targets.resolve("i8mm")) is None
    with pytest.raises(targets.UnknownIsaError, match="sve2"):
        targets.portable(("neon", "sve2"))
    with pytest.raises(ValueError, match="portable"):
        targets.target("neon", levels=("neon",))


def test_plain_tvm_compile_of_a_portable_target_says_what_to_do():
    import tvm

    from tvm_armq.frontend import importer

    mod = importer.import_tflite(TFLiteModel.load(zoo.build("conv2d_1x1")))
    with pytest.raises(Exception, match="compile_tflite"):
        tvm.compile(mod, target=targets.resolve(targets.PORTABLE))


@pytest.mark.device
def test_cli_runs_a_portable_library_and_names_the_level_chosen(devices):
    """``run --isa portable --on dotprod``: built once, run on the dotprod device, exact,
    and says which level the library chose there."""
    import subprocess
    import sys

    from tvm_armq import cli

    devices.endpoint("dotprod")  # started and recorded: `run` finds and reuses it
    res = subprocess.run([sys.executable, "-m", "tvm_armq", "run", str(cli.BUNDLED_MODEL),
                          "--isa", "portable", "--on", "dotprod"], capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    assert "the portable library chose dotprod" in res.stdout, res.stdout
    assert_run_exact(res.stdout, 1, "run --isa portable --on dotprod")
    inspect = subprocess.run([sys.executable, "-m", "tvm_armq", "inspect",
                              str(cli.BUNDLED_MODEL), "--isa", "portable"],
                             capture_output=True, text=True, timeout=900)
    assert inspect.returncode == 0 and "(chosen at run time)" in inspect.stdout, inspect.stderr
