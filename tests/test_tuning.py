"""Autotuning on the emulated device: a small run writes a database whose best schedule is
bit-exact against TFLite; bad databases and a device that dies are reported, not hung on.

The tuning runs are kept small (a single conv2d model, at most 16 trials): under qemu a
trial takes seconds, and the times measured rank candidates only by qemu's work.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tvm_armq import build, export, targets, tuning
from tvm_armq.intrinsics import kernels, requant
from tvm_armq.schedules import gemm_compute, gemm_plan, gemm_schedule
from tvm_armq.schedules.gemm_layout import Conv2DShape, fold_bias, pack_weights
from tvm_armq.frontend.layers import read_layer
from tvm_armq.frontend.model import TFLiteModel

MODEL = "conv2d_3x3"  # 1x16x16x8 -> 16 channels, 3x3 SAME: M = 256, K = 72, N = 16
OTHER_MODEL = "conv2d_1x1"  # a layer the database has not seen
LEVEL = "i8mm"
TRIALS = tuning.BATCH // 2  # half of one round: random draws of the design space


def tvm_armq(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tvm_armq", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, zoo_model):
    """One run of the command, which starts (and stops) a tracker and the emulated device."""
    work = tmp_path_factory.mktemp("tuning")
    res = tvm_armq("tune", zoo_model(MODEL), "--isa", LEVEL, "--trials", str(TRIALS),
                   "--work-dir", str(work))
    assert res.returncode == 0, res.stderr[-3000:]
    return work, res


@pytest.mark.device
def test_tune_writes_database_and_summary(tuned):
    work, res = tuned
    summary = tuning.read_summary(work)
    (task,) = summary.tasks
    assert (task.trials, task.failed) == (TRIALS, 0), task.errors
    assert task.kernel == kernels.select(targets.resolve(LEVEL), "int8", "int8").name
    assert task.best_us > 0 and set(task.best_tiles) == set(gemm_schedule.SAMPLE_MAX_INNER)
    assert "emulated" in summary.device
    assert task.name in res.stdout and f"{TRIALS} trials (0 failed)" in res.stdout
    assert "tuning" in res.stderr  # the progress bar
    database = tuning.load_database(work)
    assert len(database) == TRIALS


@pytest.mark.device
def test_tuned_schedules_are_bit_exact_against_tflite(tuned, devices, zoo_model, tmp_path,
                                                     report):
    """The database's best schedule, and every other candidate measured, built into one
    module: each still runs the level's micro-kernel and is TFLite's conv to the bit. A
    layer the database lacks gets None (the caller keeps its default schedule)."""
    import tvm
    from tvm import s_tir

    work, _ = tuned
    target = targets.resolve(LEVEL)
    database = tuning.load_database(work)
    path = zoo_model(MODEL)
    (task,) = tuning.tasks_of_model(path, target)
    (other,) = tuning.tasks_of_model(zoo_model(OTHER_MODEL), target)
    assert tuning.schedule_from_database(database, other.func, target) is None

    funcs = {"best": tuning.schedule_from_database(database, task.func, target)}
    assert funcs["best"] is not None
    for i, record in enumerate(database.get_all_tuning_records()):
        sch = s_tir.Schedule(tuning._workload(task.func))
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        funcs[f"candidate{i}"] = sch.mod["main"]
    for name, func in funcs.items():  # tensorized: the instruction's LLVM intrinsic is in
        assert task.kernel.instructions[0] in func.script(), f"{name} is not tensorized"
    ex = tvm.compile(tvm.IRModule({n: f.with_attr("global_symbol", n)
                                   for n, f in funcs.items()}), target=target)
    lib = export.export_aarch64(ex, tmp_path / "tuned_conv.so")

    layer = read_layer(path)
    kernel, groups = task.kernel, layer.groups
    tile = (kernel.mr, kernel.nr, kernel.kr)
    w = layer.weight_hwio()
    mult, shift = requant.quantize_multipliers(layer.real_scales())
    params = [pack_weights(w, tile, groups), fold_bias(w, layer.bias, layer.in_zp),
              mult.astype(np.int32), shift.astype(np.int32)]

    model = TFLiteModel.load(path)
    sess = devices.session(LEVEL)
    sess.upload(str(lib))
    rlib = sess.load_module(lib.name)
    dev = sess.cpu(0)
    for seed in range(2):
        x = model.random_inputs(seed=seed)
        (y,) = model.reference_outputs(x)
        assert len(np.unique(y)) > 4, "degenerate reference output"
        args = [tvm.runtime.tensor(a, dev) for a in [x[0]] + params]
        # the kernel's output is NHWC viewed as [pixels, groups, channels per group]
        out_shape = (y.size // y.shape[-1], groups, y.shape[-1] // groups)
        for name in funcs:
            out = tvm.runtime.tensor(np.zeros(out_shape, np.int8), dev)
            rlib[name](*args, out)
            np.testing.assert_array_equal(out.numpy().reshape(y.shape), y,
                                          err_msg=f"{name} of tuned {MODEL}, seed {seed}")
    report(f"tuned conv2d_gemm {kernel.name:28s} {LEVEL:8s} {MODEL}: best and "
           f"{len(funcs) - 1} candidates bit-exact")


@pytest.mark.device
def test_compile_tflite_applies_the_database(tuned, devices, zoo_model, tmp_path):
    """``compile_tflite(..., tuning_database=DIR)``: the tuned layer says so and the model
    equals TFLite; a model whose layer the database lacks keeps the default schedule."""
    import tvm_armq

    work, _ = tuned
    path = zoo_model(MODEL)
    layers: list = []
    ex = tvm_armq.compile_tflite(path, LEVEL, tuning_database=work, report=layers)
    assert [getattr(r, "tuned", None) for r in layers] == [True], layers
    other = tvm_armq.inspect(zoo_model(OTHER_MODEL), LEVEL, tuning_database=work)
    assert [getattr(r, "tuned", None) for r in other] == [False], other

    lib = export.export_aarch64(ex, tmp_path / "tuned_model.so")
    model = TFLiteModel.load(path)
    x = model.random_inputs(seed=5)
    (got,) = build.run_on_device(devices.session(LEVEL), lib, x)
    np.testing.assert_array_equal(got, model.reference_outputs(x)[0])


# ------------------------------------------------------------------ bad databases
def _foreign_database(work):
    """A valid MetaSchedule database of a plain (non tvm_armq) PrimFunc."""
    import tvm
    from tvm import s_tir, te
    from tvm.s_tir import meta_schedule as ms

    a = te.placeholder((16,), "float32", "A")
    b = te.compute((16,), lambda i: a[i] * 2.0, name="B")
    func = te.create_prim_func([a, b])
    mod = tvm.IRModule({"main": func})
    db = ms.database.JSONDatabase(work_dir=str(work))
    workload = db.commit_workload(mod)
    db.commit_tuning_record(ms.database.TuningRecord(
        s_tir.Schedule(mod).trace, workload, [1e-6], tvm.target.Target("llvm"),
        ms.arg_info.ArgInfo.from_prim_func(func)))


def _replace_line(path, text):
    path.write_text(text + "\n")


BAD = {
    "missing": (lambda d: shutil.rmtree(d), "no such directory"),
    "not ours": (lambda d: (d / tuning.SUMMARY_FILE).unlink(),
                 "not a database written by `python -m tvm_armq tune`"),
    "summary": (lambda d: (d / tuning.SUMMARY_FILE).write_text("[1, 2]"),
                "not a tvm_armq tuning summary"),
    "truncated": (lambda d: (d / tuning.DATABASE_FILES[1]).write_text(
        (d / tuning.DATABASE_FILES[1]).read_text()[:500]),
        "database_tuning_record.json, line 1: not JSON"),
    "dangling": (lambda d: _replace_line(d / tuning.DATABASE_FILES[1], "[3, [[], [], {}, []]]"),
                 "workload index 3 is not in the workload table"),
    "garbled": (lambda d: _replace_line(d / tuning.DATABASE_FILES[0], '["1", "garbage"]'),
                "MetaSchedule cannot read its tables"),
    "incomplete": (lambda d: (d / tuning.DATABASE_FILES[0]).unlink(),
                   "database_workload.json: missing"),
    "foreign": (lambda d: ([(d / f).unlink() for f in tuning.DATABASE_FILES],
                           _foreign_database(d)), "not a tvm_armq kernel"),
}


@pytest.mark.device
@pytest.mark.parametrize("case", list(BAD))
def test_bad_database_is_a_clear_error(tuned, tmp_path, case):
    work, _ = tuned
    broken = tmp_path / "db"
    shutil.copytree(work, broken)
    spoil, says = BAD[case]
    spoil(broken)
    with pytest.raises(tuning.TuningDatabaseError) as err:
        tuning.load_database(broken)
    assert says in str(err.value)
    assert str(broken) in str(err.value)  # names the directory or the file at fault


@pytest.mark.device
def test_cli_rejects_a_foreign_work_dir_in_one_line(tuned, tmp_path, zoo_model):
    work, _ = tuned
    broken = tmp_path / "db"
    shutil.copytree(work, broken)
    (broken / tuning.SUMMARY_FILE).unlink()
    res = tvm_armq("tune", zoo_model(MODEL), "--trials", "1", "--work-dir", str(broken))
    assert res.returncode == 7  # a tuning database problem (cli.EXIT_CODES)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a database written by" in lines[0], res.stderr


@pytest.mark.parametrize("args, says, code", [
    (["/no/such/model.tflite"], "no such file", 3),
    (["--trials", "0"], "--trials must be at least 1", 2),
    (["--key", "board"], "give --rpc-tracker too", 2),
    (["--rpc-tracker", "192.0.2.7:9190"], "--rpc-tracker needs --key", 2),
])
def test_tune_bad_input_is_one_line_and_its_exit_code(args, says, code, tmp_path):
    from tvm_armq import cli

    model = [] if args[0].endswith(".tflite") else [str(cli.BUNDLED_MODEL)]
    res = tvm_armq("tune", *model, *args, "--work-dir", str(tmp_path))
    assert res.returncode == code
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr


# ------------------------------------------------------------------ a device that dies
@pytest.mark.device
@pytest.mark.exhaustive
def test_device_dying_mid_tuning_fails_its_trials_and_the_run_ends(tmp_path, zoo_model):
    """A board registered at a tracker stops after the first round: the second round's
    trials fail at once (reported), and the run ends with the first round's best.

    Exhaustive tier: a minute alone and up to three in CI (a tracker, a board started and
    stopped, two rounds of builds); the fast tier's tuning tests keep a failing board
    (``test_tuning_failures_mismatched_database_and_per_trial_progress``: every trial
    SIGILL) and a failing candidate (``test_cycle_runner_fails_only_the_candidate_that_
    crashes``)."""
    key = "armq-tuning-test"
    batch = 2  # rounds of two candidates: the device stops after the first
    trials = 2 * batch
    work = tmp_path / "work"
    work.mkdir()
    records = work / tuning.DATABASE_FILES[1]
    (task,) = tuning.tasks_of_model(zoo_model(MODEL), LEVEL)
    with tuning._local_tracker(work) as (host, port):
        dev = tuning._start_emulated(LEVEL, f"{host}:{port}", key)
        stopped = threading.Event()

        def stop_after_first_round():
            while not stopped.is_set():
                if records.exists() and len(records.read_text().splitlines()) >= batch:
                    dev.stop()
                    stopped.set()
                time.sleep(0.2)

        watcher = threading.Thread(target=stop_after_first_round, daemon=True)
        watcher.start()
        try:
            summary = tuning.tune([task], LEVEL, work_dir=work, trials=trials, batch=batch,
                                  tracker=f"{host}:{port}:{key}", progress=False, seed=0)
        finally:
            was_stopped = stopped.is_set()
            stopped.set()
            watcher.join()
            dev.stop()
    assert was_stopped, "the device should have been stopped after the first round"
    (result,) = summary.tasks
    assert result.trials == trials
    assert 1 <= result.failed <= trials - batch, result.errors
    assert any("no device is registered under key" in e for e in result.errors), result.errors
    assert result.best_us is not None  # the first round's measurements stand
    saved = json.loads((work / tuning.SUMMARY_FILE).read_text())
    assert saved["tasks"][0]["failed"] == result.failed


# A fresh process (`compile --tuning DIR` on another day) must replay traces that tensorize
# with intrinsics registered on demand: the dotprod direct-read form of a 3x3 layer and
# neon's whole-K form, and a 7x7 pointwise layer whose row tail runs the one-row twin (its
# outputs merged into one). The database is written here as tune writes it; the child
# process only loads it and schedules.
_REPLAY_CHILD = """
import sys, tvm
from tvm_armq import tuning
from tvm_armq.intrinsics import indirect, kernels
db = tuning.load_database(sys.argv[1])
for path, level in zip(sys.argv[2::2], sys.argv[3::2]):
    func = tvm.ir.load_json(open(path).read())["main"]
    scheduled = tuning.schedule_from_database(db, func, level)
    assert scheduled is not None, level
    # a by-pixel layer's block is marked, and lowered to the same instructions when built
    text = indirect.lower_func(scheduled).script()
    assert "llvm.aarch64.neon" in text, (level, "not tensorized")
    names = [p.name for p in scheduled.params]
    assert names[-1] == "output" and "output_tail" not in names, names
print("replayed")
"""


def test_stored_traces_replay_in_a_fresh_process(tmp_path):
    import tvm
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    work = tmp_path / "db"
    work.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(work), module_equality="structural")
    conv = Conv2DShape(1, 8, 8, 16, 16, 3, 3, padding=(1, 1, 1, 1))
    pointwise = Conv2DShape(1, 7, 7, 64, 40, 1, 1)
    by_pixel = Conv2DShape(1, 7, 7, 16, 16, 3, 3, padding=(1, 1, 1, 1))  # INDIRECT form
    args = []
    for shape, level in [(conv, "dotprod"), (conv, "neon"), (pointwise, "dotprod"),
                         (pointwise, "neon"), (by_pixel, "dotprod")]:
        target = targets.resolve(level)
        kernel = kernels.select(target, "int8", "int8")
        plan = gemm_plan.plan(shape, kernel)
        func = gemm_compute.conv2d_gemm_func(plan, in_zp=0, out_zp=0, act_range=(-128, 127))
        workload = tuning._workload(func)
        sch = s_tir.Schedule(workload, seed=2)
        gemm_schedule.sample_conv2d_gemm(sch, plan, target)
        entry = db.commit_workload(workload)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, entry, [1e-3], tvm.target.Target(target),
            ms.arg_info.ArgInfo.from_prim_func(workload["main"])))
        path = tmp_path / f"{level}_{len(args)}.json"
        path.write_text(tvm.ir.save_json(tvm.IRModule({"main": func})))
        args += [str(path), level]
    tuning._write_summary(tuning.TuningSummary(
        "", "", str(work), 0.0, [tuning.TaskSummary("conv", "gemm")]))
    res = subprocess.run([sys.executable, "-c", _REPLAY_CHILD, str(work), *args],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "replayed" in res.stdout, res.stderr[-3000:]


@pytest.mark.device
def test_tuning_a_layer_with_a_row_tail(tmp_path, devices, report):
    """A 7x7 pointwise layer at dotprod (M = 49: a row tail through the one-row twin) tunes
    with every trial measured, and its best schedule, outputs merged, is bit-exact on the
    device against the NumPy reference."""
    import tvm

    from tvm_armq.schedules import reference as ref

    level = "dotprod"
    target = targets.resolve(level)
    shape = Conv2DShape(1, 7, 7, 32, 24, 1, 1)
    kernel = kernels.select(target, "int8", "int8", rows=shape.gemm_m, depth=shape.gemm_k)
    plan = gemm_plan.plan(shape, kernel)
    assert plan.tail is not None
    in_zp, out_zp = -5, 3
    func = gemm_compute.conv2d_gemm_func(plan, in_zp=in_zp, out_zp=out_zp,
                                         act_range=(-128, 127))
    trials = 2
    summary = tuning.tune([tuning.Task("pointwise_7x7", func, plan)], level,
                          work_dir=tmp_path, trials=trials, batch=trials, progress=False,
                          seed=0)
    (result,) = summary.tasks
    assert (result.trials, result.failed) == (trials, 0), result.errors
    best = tuning.schedule_from_database(tuning.load_database(tmp_path), func, target)
    assert [p.name for p in best.params][-1] == "output"

    rng = np.random.default_rng(4)
    x = rng.integers(-128, 127, (1, 7, 7, 32), endpoint=True, dtype=np.int8)
    w = rng.integers(-127, 127, (1, 1, 32, 24), endpoint=True, dtype=np.int8)
    bias = rng.integers(-5000, 5000, 24).astype(np.int32)
    acc = ref.conv2d_nhwc(x, w, bias, in_zp=in_zp)
    mult, shift = requant.quantize_multipliers(rng.uniform(60, 160, 24) / np.abs(acc).max())
    expected = ref.requantize(acc, mult, shift, out_zp, -128, 127, "int8")
    lib = export.export_aarch64(tvm.compile(tvm.IRModule({"best": best.with_attr(
        "global_symbol", "best")}), target=target), tmp_path / "tail_tuned.so")
    sess = devices.session(level)
    sess.upload(str(lib))
    dev = sess.cpu(0)
    args = [x, pack_weights(w, (kernel.mr, kernel.nr, kernel.kr)),
            fold_bias(w, bias, in_zp), mult.astype(np.int32), shift.astype(np.int32),
            np.zeros((49, 1, 24), np.int8)]
    args = [tvm.runtime.tensor(a, dev) for a in args]
    sess.load_module(lib.name)["best"](*args)
    got = args[-1].numpy().reshape(expected.shape)
    assert len(np.unique(expected)) > 8
    np.testing.assert_array_equal(got, expected)
    report(f"tuned conv2d_gemm {kernel.name:28s} {level:8s} 7x7 pointwise with a row tail: "
           f"{trials} trials, best bit-exact")


# ------------------------------------------------------------------ measured in cycles
CYCLES_LEVEL = "dotprod"


@pytest.mark.device
def test_tuning_in_cycles_records_them_and_stays_exact(tmp_path, zoo_model, devices):
    """``measure="cycles"``: every trial is a cycle estimate on the level's core model (no
    device, no tracker), the summary says so, a resumed run that would mix in times is
    refused, and the model compiled with the database equals TFLite on the device."""
    path = zoo_model(MODEL)
    work = tmp_path / "cycles"
    (task,) = tuning.tasks_of_model(path, CYCLES_LEVEL)
    summary = tuning.tune([task], CYCLES_LEVEL, work_dir=work, trials=2, batch=2,
                          progress=False, seed=0, measure="cycles")
    (result,) = summary.tasks
    assert (result.trials, result.failed) == (2, 0), result.errors
    assert summary.measured == tuning.read_summary(work).measured == "cycles:neoverse-n1"
    costs = [float(r.run_secs[0]) * 1e6 * tuning.CYCLES_PER_US
             for r in tuning.load_database(work).get_all_tuning_records()]
    assert len(costs) == 2 and all(1e3 < c < 1e7 for c in costs), costs  # cycles, a layer
    assert "best cycles" in summary.table()
    with pytest.raises(tuning.TuningError, match="measured as cycles:neoverse-n1"):
        tuning.tune([task], CYCLES_LEVEL, work_dir=work, trials=1, progress=False)

    model = TFLiteModel.load(path)
    report: list = []
    lib = export.export_aarch64(
        build.compile_tflite(model, CYCLES_LEVEL, tuning_database=work, report=report),
        tmp_path / "tuned.so")
    assert any(getattr(r, "tuned", False) for r in report), report
    dm = build.DeviceModel(devices.session(CYCLES_LEVEL), lib)
    x = model.random_inputs(seed=3)
    (want,) = model.reference_outputs(x)
    assert len(np.unique(want)) > 4
    np.testing.assert_array_equal(dm(x)[0], want)


def test_cli_tune_cycles_takes_no_tracker(tmp_path, zoo_model):
    res = tvm_armq("tune", zoo_model(MODEL), "--isa", "neon", "--measure", "cycles",
                   "--rpc-tracker", "127.0.0.1:9", "--key", "k", "--work-dir", str(tmp_path))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--measure cycles estimates cycles on the emulated CPU" in res.stderr
    res = tvm_armq("tune", zoo_model(MODEL), "--isa", "i8mm", "--measure", "cycles",
                   "--core", "cortex-a76", "--work-dir", str(tmp_path))
    assert res.returncode == 2 and "cortex-a76 runs ISA level dotprod at most" in res.stderr


def test_cycle_runner_fails_only_the_candidate_that_crashes(tmp_path, zoo_model):
    """A round measured in one emulator run: a candidate with instructions the level lacks
    (an i8mm GEMM on the neon CPU: SIGILL) fails alone; the others still get cycles."""
    from tvm.s_tir import meta_schedule as ms

    def candidate(level):
        (task,) = tuning.tasks_of_model(zoo_model(OTHER_MODEL), level)
        tgt = targets.resolve(level)
        ctx = ms.TuneContext(mod=tuning._workload(task.func), target=tgt, task_name=level,
                             space_generator=tuning.design_space(task.plan, tgt))
        (sch,) = ctx.generate_design_space()
        built = tuning._build_candidate(sch.mod, tgt, None)
        args = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
        return ms.runner.RunnerInput(tuning._export_aarch64_so(built), "cpu", args)

    good, bad = candidate("neon"), candidate("i8mm")
    runner = tuning.CycleRunner("neon", "cortex-a72")
    assert runner.run([]) == []  # a task whose design space is used up sends none
    runner.workers = 1  # one job for the round: its run crashes, then each is redone
    results = [f.result() for f in runner.run([good, bad, good])]
    assert [r.error_msg is None for r in results] == [True, False, True], results
    assert "on neon failed" in results[1].error_msg
    # the same candidate twice: the same cycles, up to how qemu happened to cut the blocks
    assert float(results[0].run_secs[0]) == pytest.approx(float(results[2].run_secs[0]),
                                                          rel=1e-3)
