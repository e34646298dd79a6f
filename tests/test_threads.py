"""A model's thread pool (``compile_tflite(..., threads=N, cores=...)``, ``tvm_armq/threads.py``).

A net compiled with ``threads=2`` runs on the emulated device in a process whose runtime
could have more threads (``TVM_NUM_THREADS=4``): it must set its pool to 2 and give
TFLite's reference outputs bit for bit, at every level (and on 3 threads and on 1 at one:
compiled for one thread, its parallel loops are serial). The GEMMs of few channels split
their rows there too (``GemmPlan.row_chunks``): MobileNetV1 0.25's 8- and 16-channel
layers. A dynamic-range net's float kernels run in parallel too, with the same values as on one
thread. The pieces are checked apart: the call ``main`` makes first, the once-per-thread
guard (compiled for the host and called), the refusals.
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import textwrap

import numpy as np
import pytest
from armq_checks import assert_exact, llvm_source, tier

from tvm_armq import build, cli, device, export, threads, zoo
from tvm_armq.passes import call_sequence
from tvm_armq.schedules import gemm_plan
from tvm_armq.frontend.importer import import_tflite
from tvm_armq.frontend.model import TFLiteModel

NET = "mobilenet_v1_0.25"
SEEDS = (0, 1)

GUEST_RUN = """
import json, sys
import numpy as np, tvm
from tvm.runtime.vm import VirtualMachine
spec = json.load(open(sys.argv[1]))
vm = VirtualMachine(tvm.runtime.load_module(spec["lib"]), tvm.cpu())
ran = []
for p, pool in enumerate(spec["pools"]):  # None: the pool the runtime (or main) sets
    if pool is not None:
        tvm.get_global_func("runtime.config_threadpool")(1, pool)
    for i, names in enumerate(spec["inputs"]):
        out = vm["main"](*[tvm.runtime.tensor(np.load(n)) for n in names])
        outs = [out] if hasattr(out, "numpy") else list(out)  # one tensor, or a tuple
        for j, o in enumerate(outs):
            np.save(f"{spec['out']}_{p}_{i}_{j}.npy", o.numpy())
    ran.append({"pool": tvm.get_global_func("runtime.NumThreads")(), "outputs": len(outs)})
print(json.dumps(ran))
"""


def guest_runs(model, lib, lvl, tmp_path, pools=(None,)) -> tuple[list, list, list]:
    """``lib`` run by the VM on ``lvl``'s emulated CPU, in a process whose runtime could have
    4 threads (``TVM_NUM_THREADS=4``), on each seed's inputs once per entry of ``pools``
    (None: the pool as the runtime or ``main`` sets it; N: ``runtime.config_threadpool``
    to N first). Returns (the pool each ran on, [per pool, per seed: the outputs],
    [per seed: TFLite's reference outputs])."""
    inputs, expected = [], []
    for seed in SEEDS:
        x = model.random_inputs(seed=seed)
        names = []
        for k, a in enumerate(x):
            np.save(tmp_path / f"in_{seed}_{k}.npy", a)
            names.append(str(tmp_path / f"in_{seed}_{k}.npy"))
        inputs.append(names)
        expected.append(model.reference_outputs(x))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"lib": str(lib), "inputs": inputs, "pools": list(pools),
                                "out": str(tmp_path / "out")}))
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(GUEST_RUN))
    device.provision()
    env = {**device.guest_env(lvl), "TVM_NUM_THREADS": "4"}  # room for more than asked
    res = subprocess.run(device.guest_command(lvl, str(script), str(spec)), env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    ran = json.loads(res.stdout.strip().splitlines()[-1])
    outputs = [[[np.load(tmp_path / f"out_{p}_{i}_{j}.npy") for j in range(run["outputs"])]
                for i in range(len(SEEDS))] for p, run in enumerate(ran)]
    return [run["pool"] for run in ran], outputs, expected


def run_on_guest(model, lib, lvl, tmp_path, pools=(None,)) -> list:
    """``guest_runs``, each run checked bit-exact with TFLite. Returns the pool each ran
    on."""
    ran, outputs, expected = guest_runs(model, lib, lvl, tmp_path, pools)
    for pool, runs in zip(ran, outputs):
        for got, want, seed in zip(runs, expected, SEEDS):
            assert_exact(got, want, f"{NET} at {lvl} on {pool} threads, seed {seed}")
    return ran


# (level, threads): the fast tier runs two threads at dotprod (call_sequence's test runs one
# and two at i8mm); the exhaustive tier every other combination.
THREAD_CASES = [tier(lvl, pool, id=f"{lvl}-{pool}", fast=(lvl, pool) == ("dotprod", 2))
                for lvl, pool in [(lvl, 2) for lvl in device.LEVELS]
                + [("dotprod", 3), ("dotprod", 1)]]


@pytest.mark.device
@pytest.mark.parametrize("lvl,pool", THREAD_CASES)
def test_net_on_threads_is_bit_exact(lvl, pool, tmp_path):
    """2 threads at every level; 3 at one, which is not what the runtime would choose by
    itself here (TVM_NUM_THREADS=4, and on this machine's two cores it would take 2); 1,
    whose loops are compiled serial (``threads.run_serially``)."""
    model = TFLiteModel.load(zoo.build(NET))
    lib = export.export_aarch64(build.compile_tflite(model, lvl, threads=pool),
                                tmp_path / "m.so")
    ran = run_on_guest(model, lib, lvl, tmp_path)
    assert ran == [pool], f"{NET} compiled with threads={pool} ran on {ran}"


@pytest.mark.device
def test_a_pool_left_to_the_runtime_runs_serial_twins_on_one_thread(tmp_path):
    """Compiled without ``threads`` (what ``tvm.compile`` after ``import tvm_armq`` gives),
    the library asks the runtime how many threads its pool has, once a run: on one it runs
    each parallel kernel's serial twin (``call_sequence.as_one_function``'s
    ``serial_twins``), on two the parallel kernels. Both bit-exact, in one process."""
    model = TFLiteModel.load(zoo.build(NET))
    exe = build.compile_tflite(model, "dotprod")
    source = llvm_source(exe)
    assert source.count(f'c"{call_sequence.NUM_THREADS}\\00"') == 1  # the name, once
    assert re.search(rf"tvm_armq_conv2d\d*{call_sequence.TWIN_SUFFIX}_compute_", source), \
        "no serial twin of a conv2d kernel"
    lib = export.export_aarch64(exe, tmp_path / "m.so")
    assert run_on_guest(model, lib, "dotprod", tmp_path, pools=(1, 2)) == [1, 2]


DYNAMIC_NET = "bert_encoder_dynamic"  # every float kernel family: matmul, softmax, GELU,
# LayerNorm's mean and elementwise trees, the hybrid layers' parameters and quantization


@pytest.mark.device
@pytest.mark.parametrize("lvl", [tier(lvl, id=lvl, fast=lvl == "neon") for lvl in device.LEVELS])
def test_dynamic_range_net_on_two_threads_equals_one(lvl, tmp_path):
    """A dynamic-range net's float kernels split their rows (or their vector steps) among
    the threads, and no value depends on the split: left to the runtime, the library gives
    on a pool of two exactly what its serial twins give on one, within the stated float
    tolerance of TFLite (``test_hybrid.test_dynamic_range_net`` says why a tolerance), every
    output alive."""
    from armq_checks import assert_within_float_tolerance

    model = TFLiteModel.load(zoo.build(DYNAMIC_NET))
    exe = build.compile_tflite(model, lvl)
    source = llvm_source(exe)
    for kernel in ("float_softmax", "float_gelu_tanh", "float_matmul", "float_mean",
                   "float_elementwise", "hybrid_params"):
        assert f"tvm_armq_{kernel}{call_sequence.TWIN_SUFFIX}_compute_" in source, \
            f"{kernel}: no parallel loop (no serial twin)"
    lib = export.export_aarch64(exe, tmp_path / "m.so")
    ran, (one, two), expected = guest_runs(model, lib, lvl, tmp_path, pools=(1, 2))
    assert ran == [1, 2]
    for seed, a, b, want in zip(SEEDS, one, two, expected):
        what = f"{DYNAMIC_NET} at {lvl}, seed {seed}"
        assert_exact(b, a, f"{what}: two threads against one")
        assert_within_float_tolerance(a, want, what)


def test_few_channel_layers_split_rows_as_well():
    """The net above reaches the row split: its 8- and 16-channel GEMMs cut their rows into
    equal chunks (a multiple of 4 where one divides), wider layers split columns only."""
    from tvm_armq import targets
    from tvm_armq.intrinsics import kernels
    from tvm_armq.schedules.gemm_layout import Conv2DShape

    k = kernels.select(targets.resolve("dotprod"), "int8", "int8")
    few = gemm_plan.plan(Conv2DShape(1, 112, 112, 8, 16, 1, 1), k)
    assert few.row_chunks == gemm_plan.ROW_CHUNKS_MAX
    assert ((112 * 112) // k.mr) % few.row_chunks == 0
    wide = gemm_plan.plan(Conv2DShape(1, 14, 14, 128, 128, 1, 1), k)
    assert wide.row_chunks == 1
    # 7 x 7 = 49 pixels in 12 row blocks of 4 (and a tail): at least 4 blocks per chunk
    # leaves 1, 2 or 3 chunks, of which 2 splits evenly
    small = gemm_plan.plan(Conv2DShape(1, 7, 7, 8, 16, 1, 1), k)
    assert small.row_chunks == 2
    serial = gemm_plan.plan(Conv2DShape(1, 112, 112, 8, 16, 1, 1), k, parallel=False)
    assert serial.row_chunks == 1


def test_one_thread_compiles_no_parallel_loop():
    """threads=1: no kernel enters the runtime's thread pool (``threads.run_serially``);
    left to the runtime (None) or on 2 threads, the same net's kernels do."""
    model = TFLiteModel.load(zoo.build(NET))

    def launches(pool):
        exe = build.compile_tflite(model, "dotprod", threads=pool)
        return llvm_source(exe).count("@__TVMBackendParallelLaunch, align")

    assert launches(1) == 0
    assert launches(None) > 0 and launches(2) == launches(None)


def test_main_configures_the_pool_first():
    mod = import_tflite(TFLiteModel.load(zoo.build("conv2d_1x1")))
    mod = threads.configure_pool(mod, 3, "little")
    main = mod["main"]
    assert not main.is_pure
    first = main.body.blocks[0].bindings[0].value
    assert threads.POOL_FUNC in str(first.op)
    script = mod[threads.POOL_FUNC].script()
    assert '"runtime.config_threadpool", -1, 3' in script  # kLittle, 3 threads
    assert f'"{threads.GUARD}", -1, 3' in script


def test_guard_serves_each_thread_once_per_request(tmp_path):
    """GUARD_SOURCE compiled for the host: 1 on a thread's first request, 0 while it asks
    the same, 1 again for another request, and 1 on a new thread."""
    src = tmp_path / "guard.cc"
    src.write_text(threads.GUARD_SOURCE)
    so = tmp_path / "guard.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    guard = getattr(ctypes.CDLL(str(so)), threads.GUARD)
    assert [guard(1, 2), guard(1, 2), guard(1, 2)] == [1, 0, 0]
    assert [guard(-1, 2), guard(1, 4), guard(1, 4)] == [1, 1, 0]
    import threading

    seen = []
    t = threading.Thread(target=lambda: seen.append(guard(1, 4)))
    t.start()
    t.join()
    assert seen == [1]


def test_refusals(capsys):
    with pytest.raises(ValueError, match="threads must be a whole number of at least 1"):
        build.compile_tflite(zoo.build("conv2d_1x1"), "dotprod", threads=0)
    with pytest.raises(ValueError, match="cores 'medium'"):
        build.compile_tflite(zoo.build("conv2d_1x1"), "dotprod", threads=2, cores="medium")
    with pytest.raises(build.UnsupportedTarget, match="threads"):
        build.compile_tflite(zoo.build("conv2d_1x1"), "llvm", threads=2)
    assert cli.main(["compile", str(zoo.build("conv2d_1x1")), "--threads", "0"]) == \
        cli.EXIT_USAGE
    assert "--threads must be at least 1, got 0" in capsys.readouterr().err
