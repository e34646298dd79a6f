"""A model's kernel calls as one library function (``tvm_armq.passes.call_sequence``): the
arena plan on the host, the compiled library's shape, and runs on the device, bit-exact."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tvm_armq  # noqa: F401  (installs the hooks)
from armq_checks import assert_exact, llvm_source
from tvm_armq import build, export, targets
from tvm_armq.passes import call_sequence
from tvm_armq.passes.call_sequence import ALIGN, _Tensor, place


def _overlap(a, b):
    return a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def _check_plan(tensors, arena):
    inner = [t for t in tensors if t.output is None]
    for t in inner:
        assert t.offset % ALIGN == 0 and t.offset + t.nbytes <= arena
    for i, a in enumerate(inner):
        for b in inner[i + 1:]:
            if a.first <= b.last and b.first <= a.last:  # live at the same step
                assert not _overlap(a, b), (a, b)


def test_arena_gives_live_tensors_their_own_bytes_and_reuses_dead_ones():
    # a chain: each step reads the one before, so only neighbours are live together
    chain = [_Tensor(1000, s, s + 1) for s in range(6)]
    arena = place(chain)
    _check_plan(chain, arena)
    assert arena == 2 * 1024  # two slots of 1000 bytes rounded up to 64, reused in turn
    # a tensor read at its own step only (written, never read) still gets bytes of its own
    # apart from the inputs of the step that writes it
    fan = [_Tensor(64, 0, 3), _Tensor(640, 1, 2), _Tensor(100, 2, 2), _Tensor(4096, 3, 4),
           _Tensor(7, 4, 4, output=0)]
    arena = place(fan)
    _check_plan(fan, arena)
    assert fan[-1].offset is None  # an output is written in place, not in the arena
    rng = np.random.RandomState(0)
    for _ in range(50):
        tensors = []
        for s in range(int(rng.randint(1, 30))):
            tensors.append(_Tensor(int(rng.randint(1, 5000)), s, s + int(rng.randint(0, 6))))
        _check_plan(tensors, place(tensors))


def _two_in_two_out(zoo_model):
    from tvm_armq.frontend.model import TFLiteModel

    return TFLiteModel.load(zoo_model("two_in_two_out"))


def test_main_becomes_one_call_of_the_model_function(zoo_model):
    """two_in_two_out (two inputs, two outputs, a reshape between two kernels) lowers to a
    main of one call; the kernels are internal, called directly; the arena the library
    allocates is the planned one (a pointer without its extent once let TVM size it to
    one byte)."""
    import tvm
    from tvm import relax

    model = _two_in_two_out(zoo_model)
    tgt = targets.resolve("dotprod")
    mod = build.lower(build.import_tflite(model), tgt)
    merged = call_sequence.as_one_function(mod, tgt)
    calls = [b.value for blk in merged["main"].body.blocks for b in blk.bindings]
    assert len(calls) == 1 and calls[0].op.name == "relax.call_tir"
    assert calls[0].args[0].name_hint == call_sequence.FUNC_NAME
    kernels = [gv.name_hint for gv, f in merged.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and call_sequence.INTERNAL in (f.attrs or {})]
    assert len(kernels) >= 8 and all(k.startswith("tvm_armq_") for k in kernels)
    # the two inputs, every weight in one array, the two outputs
    assert len(merged[call_sequence.FUNC_NAME].params) == 2 + 1 + 2
    plan = call_sequence._plan(relax.transform.RewriteDataflowReshape()(
        relax.transform.LegalizeOps()(mod)))
    arena = place(plan.tensors)

    ll = llvm_source(build.compile_tflite(model, "dotprod"))
    assert re.search(r"define dllexport [^\n]*@__tvm_ffi_tvm_armq_model\(", ll)
    assert not re.search(r"define dllexport [^\n]*@__tvm_ffi_tvm_armq_conv2d\(", ll)
    # TVMBackendAllocWorkspace(kDLCPU, device, bytes, ...)
    assert re.search(rf"%arena = (tail )?call ptr %\w+\(i32 1, i32 %dev_id, i64 {arena},", ll)


def test_each_kernel_body_is_a_function_llvm_keeps(zoo_model):
    """Compiled for one thread (no parallel task to hold a kernel's loops), each internal
    kernel's body is still a function of its own, ``<kernel>_compute_``, marked noinline
    (``call_sequence.on_cpu``): inlined into ``tvm_armq_model``, TVM's per-buffer alias
    tags let LLVM drop a kernel's write that the next kernel reads (a hybrid layer's int8
    input; ``test_hybrid``'s device tests run that layer on one thread)."""
    model = _two_in_two_out(zoo_model)
    ll = llvm_source(build.compile_tflite(model, "dotprod", threads=1))
    scopes = re.findall(r"define internal [^\n]*@(tvm_armq_\w+)_compute_\([^\n]*#(\d+)", ll)
    assert len(scopes) >= 8, scopes
    noinline = set(re.findall(r"^attributes #(\d+) = \{[^\n]*\bnoinline\b", ll,
                              re.MULTILINE))
    assert all(attr in noinline for _, attr in scopes), scopes


def test_weights_blob_holds_each_constant_at_an_aligned_offset():
    """Every constant's bytes at its offset, each offset a multiple of ALIGN (bf16 too,
    which NumPy holds as ml_dtypes' bfloat16)."""
    import ml_dtypes
    from tvm import relax

    rng = np.random.default_rng(3)
    arrays = [rng.integers(-128, 128, (3, 5)).astype(np.int8),
              rng.integers(-2**31, 2**31, (7,)).astype(np.int32),
              rng.standard_normal((2, 33)).astype(ml_dtypes.bfloat16),
              rng.integers(-128, 128, (64,)).astype(np.int8)]
    consts = [relax.const(a, "bfloat16" if a.dtype == ml_dtypes.bfloat16 else str(a.dtype))
              for a in arrays]
    blob, spans = call_sequence.weights_blob(consts)
    assert blob.dtype == np.uint8 and blob.size % call_sequence.ALIGN == 0
    for a, (off, nbytes) in zip(arrays, spans):
        assert off % call_sequence.ALIGN == 0 and nbytes == a.nbytes
        assert blob[off:off + a.nbytes].tobytes() == a.tobytes()
    offsets = [off for off, _ in spans]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(arrays)


def test_main_that_is_not_a_sequence_is_left_to_the_vm():
    """A main whose output is its input (no kernel makes it) is left as it is."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((1, 4), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(x)
        bb.emit_func_output(y)
    mod = bb.get()
    with pytest.raises(call_sequence.NotASequence):
        call_sequence._plan(mod)
    out = call_sequence.as_one_function(mod, targets.resolve("neon"))
    assert call_sequence.FUNC_NAME not in [gv.name_hint for gv in out.functions]
    assert len(out["main"].params) == 1 and out["main"].body.body.same_as(
        out["main"].body.blocks[0].bindings[0].var)


@pytest.mark.device
@pytest.mark.parametrize("threads", [1, 2])
def test_one_function_runs_bit_exact_run_after_run(devices, zoo_model, tmp_path, threads):
    """The merged library, compiled for one thread (serial loops) and for two (parallel
    loops, entered through the runtime from the internal kernels), loaded once, gives
    TFLite's reference outputs on three runs in a row: what one run leaves behind (the
    arena, a workspace the kernels did not give back, a weight written over) is what the
    next one starts from."""
    model = _two_in_two_out(zoo_model)
    lib = export.export_aarch64(build.compile_tflite(model, "i8mm", threads=threads),
                                tmp_path / "model.so")
    loaded = build.DeviceModel(devices.session("i8mm"), lib)
    for seed in range(3):
        x = model.random_inputs(seed=seed)
        what = f"two_in_two_out on {threads} threads, run {seed + 1} of one load"
        assert_exact(loaded(x), model.reference_outputs(x), what)
