"""The C library (``compile --emit c``) beside the VM library and TFLite: sizes, arena and
armperf's estimated cycles.

    python scripts/bench_clib.py [--models M ...] [--isa L ...] [--json FILE]

Per model and ISA level:

- the C library's ``lib<name>.so`` and ``lib<name>.a`` bytes, its arena (``ARENA_BYTES``)
  and the weights it embeds;
- TFLite's side: the model file's bytes and TFLite's tensor arena (the span of the
  activation tensors as its memory planner places them, reference kernels: XNNPACK keeps
  its own buffers on top of it), and the runtime library LiteRT's aarch64 wheel loads for
  its interpreter (``RUNTIME_LIBRARY``, measured in armperf's guest site);
- armperf's estimated cycles per run of the C library (called through ctypes from
  armperf's ``script`` mode) and of the VM library ``compile --threads 1`` writes (armperf's
  ``tvm`` mode): the same kernels, with and without the VM's call around them.

The rows go to ``--json`` (default scripts/results/clib.json); ``render_results.py``
renders them into the README.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import armperf_tool  # noqa: E402
import bench_layers  # noqa: E402
import results_data as rd  # noqa: E402

MODELS = ["mobilenet_v1_0.25", "ds_cnn", "two_in_two_out", "resnet_block", "mobilenet_v3_small",
          "bert_encoder", "mobilenet_v2_1.0"]
ARMPERF_SITE = Path(os.environ.get("ARMPERF_HOME", Path.home() / ".cache" / "armperf")) / "site"
# What LiteRT's aarch64 wheel (the TFLite armperf runs) loads for its interpreter: its
# kernels, XNNPACK and the interpreter, with the Python bindings' common code
RUNTIME_LIBRARY = ARMPERF_SITE / "ai_edge_litert" / "libpywrap_litert_common.so"
RUNS = 2

# The guest side of armperf's script mode: the C library through ctypes, on random inputs
GUEST = r'''
import ctypes
import numpy as np

ALIGN = 64


def aligned(nbytes):
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw, raw[start:start + nbytes]


def setup(args):
    lib = ctypes.CDLL(args[0])
    ins, outs = [int(b) for b in args[1].split(",")], [int(b) for b in args[2].split(",")]
    keep, in_ptrs, out_ptrs = [], [], []
    rng = np.random.default_rng(0)
    for n in ins:
        raw, view = aligned(n)
        view[:] = rng.integers(0, 256, n, dtype=np.uint8)
        keep.append(raw)
        in_ptrs.append(view.ctypes.data)
    for n in outs:
        raw, view = aligned(n)
        keep.append(raw)
        out_ptrs.append(view.ctypes.data)
    ctx = ctypes.create_string_buffer(int(args[3]))
    assert lib.model_init(ctx, None, ctypes.c_size_t(0)) == 0
    inputs = (ctypes.c_void_p * len(in_ptrs))(*in_ptrs)
    outputs = (ctypes.c_void_p * len(out_ptrs))(*out_ptrs)
    run = lib.model_run_arrays

    def call():
        assert run(ctx, inputs, outputs) == 0
        keep  # the buffers live as long as the callable
    return call
'''
CTX_BYTES = 1024  # at least sizeof(model_ctx) (the header's struct: 552 bytes)


def tflite_arena(model) -> int:
    """TFLite's tensor arena for ``model``: the span of the addresses of its non-constant
    tensors once the interpreter (reference kernels, no delegate) has allocated them."""
    import tflite

    root = tflite.Model.GetRootAsModel(model.data, 0)
    graph = root.Subgraphs(0)
    constant = {i for i in range(graph.TensorsLength())
                if root.Buffers(graph.Tensors(i).Buffer()).DataLength() > 0}
    it = model._interpreter(reference_kernels=True)
    lo, hi = None, None
    for d in it.get_tensor_details():
        if d["index"] in constant:
            continue
        a = it.tensor(d["index"])()
        if a.nbytes == 0:
            continue
        lo = a.ctypes.data if lo is None else min(lo, a.ctypes.data)
        hi = a.ctypes.data + a.nbytes if hi is None else max(hi, a.ctypes.data + a.nbytes)
    return 0 if lo is None else hi - lo


def main(argv=None) -> int:
    from tvm_armq import build, clib, export, zoo
    from tvm_armq.frontend.model import TFLiteModel
    from tvm_armq.targets import LEVELS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--isa", nargs="+", default=list(LEVELS))
    ap.add_argument("--json", type=Path, default=rd.RESULTS / rd.CLIB)
    a = armperf_tool.parse(ap, argv)
    rows = []
    print(f"{'model':20s} {'isa':8s} {'.so':>9s} {'.a':>9s} {'arena':>9s} {'tfl arena':>9s} "
          f"{'C est.':>10s} {'VM est.':>10s} {'VM/C':>6s}", flush=True)
    with armperf_tool.guest_script("bench_clib-", GUEST) as (work, guest):
        for name in a.models:
            model = TFLiteModel.load(zoo.build(name))
            arena_tfl = tflite_arena(model)
            for level in a.isa:
                out = work / f"{name}-{level}"
                lib = clib.write(build.compile_tflite(model, level, emit="c"), out)
                vm = export.export_aarch64(build.compile_tflite(model, level, threads=1),
                                           out / "model-vm.so")
                cm = lib.model
                sizes = ",".join
                c = bench_layers.armperf(a.armperf, "script", guest, level, RUNS, 3, args=(
                    lib.shared, sizes(str(t.nbytes) for t in cm.inputs),
                    sizes(str(t.nbytes) for t in cm.outputs), CTX_BYTES))
                v, version = armperf_tool.tvm_cycles(a.armperf, vm, model, level, RUNS)
                row = {"model": name, "isa": level, "armperf": c.get("armperf", 1),
                       "so_bytes": lib.shared.stat().st_size,
                       "a_bytes": lib.static.stat().st_size, "arena": cm.arena_bytes,
                       "weights": int(cm.weights.size), "model_bytes": len(model.data),
                       "tflite_arena": arena_tfl,
                       "tflite_runtime_bytes": RUNTIME_LIBRARY.stat().st_size,
                       "c_cycles": c["cycles_per_run"], "vm_cycles": v}
                assert version == row["armperf"], (version, row["armperf"])
                rows.append(row)
                print(f"{name:20s} {level:8s} {row['so_bytes']:9d} {row['a_bytes']:9d} "
                      f"{row['arena']:9d} {arena_tfl:9d} {row['c_cycles']:10.4g} "
                      f"{v:10.4g} {v / row['c_cycles']:6.3f}", flush=True)
    old = rd.load(a.json) or []
    keyed = {(r["model"], r["isa"]): r for r in old}
    keyed.update({(r["model"], r["isa"]): r for r in rows})
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(sorted(keyed.values(), key=lambda r: (
        a.models.index(r["model"]) if r["model"] in a.models else len(a.models), r["model"],
        list(LEVELS).index(r["isa"]))), indent=1) + "\n")
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
