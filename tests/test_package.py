"""Packaging: one name in site-packages, a cheap import, other targets untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import tvm_armq


def test_import_loads_no_tensorflow_and_installs_the_hook():
    code = ("import sys, tvm_armq; heavy = [m for m in ('tensorflow', 'tflite', "
            "'ai_edge_litert') if m in sys.modules]; print(heavy); "
            "from tvm.relax import pipeline; "
            "print(hasattr(pipeline.PIPELINE_MAP['default'], '_tvm_armq_wrapped'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]


def test_schedules_and_intrinsics_install_inside_tvm_armq():
    root = Path(__file__).resolve().parents[1]
    assert Path(tvm_armq.schedules.__file__).resolve().parent == root / "schedules"
    assert Path(tvm_armq.intrinsics.__file__).resolve().parent == root / "intrinsics"


def test_target_presets():
    import tvm

    feats = {name: tvm.target.Target(tvm_armq.target(name)).features
             for name in ("neon", "dotprod", "i8mm", "cortex-a76")}
    assert [feats["neon"].has_dotprod, feats["neon"].has_matmul_i8] == [False, False]
    assert [feats["dotprod"].has_dotprod, feats["dotprod"].has_matmul_i8] == [True, False]
    assert [feats["i8mm"].has_dotprod, feats["i8mm"].has_matmul_i8] == [True, True]
    assert not feats["i8mm"].has_sve  # the emulated i8mm CPU has SVE off
    assert feats["cortex-a76"].has_dotprod


def test_other_targets_compile_as_without_the_import():
    """x86 compiles and runs a model on the host after ``import tvm_armq``."""
    import tvm
    from tvm import relax

    from tvm_armq import zoo
    from tvm_armq.frontend import importer
    from tvm_armq.frontend.model import TFLiteModel

    model = TFLiteModel.load(zoo.build("conv2d_3x3"))
    x = model.random_inputs(seed=3)
    mod = importer.import_tflite(model)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x[0])).numpy()
    assert np.abs(got.astype(int) - model.reference_outputs(x)[0]).max() <= 1
