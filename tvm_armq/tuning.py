"""Autotuning: MetaSchedule searches tvm_armq's GEMM schedules, timed on an aarch64 device.

Read this first. A tuning *task* is one unscheduled ``conv2d_gemm`` PrimFunc of a model (one
per distinct conv2d / dense layer) and the plan it was built from (``schedules.gemm_plan``;
the func is tagged with its micro-kernel, ``schedules.gemm_compute.annotate``). Its design
space is ``schedules.gemm_schedule.sample_conv2d_gemm``: the schedule tvm_armq compiles by
default, with
the macro tile (m_tiles x n_tiles micro-tiles) and the K unrolling drawn by
``sample_perfect_tile``, so every candidate keeps the micro-kernel tensorized.

A run repeats, per task, rounds of ``batch`` candidates (``BATCH`` unless told):

    EvolutionarySearch + XGBModel   pick candidates: random draws of the space first, then
                                    mutations the cost model (xgboost) ranks best
    LocalBuilder                    compiles each for the aarch64 target and links it with
                                    aarch64-linux-gnu-g++ into a .so a board can load
    RPCRunner                       measure="time": asks the RPC tracker for a device under
                                    KEY, uploads the .so, times it (TVM's time_evaluator)
    CycleRunner                     measure="cycles": runs the .so on the level's emulated
                                    CPU under the block-counting plugin and records its
                                    estimated cycles on a core's model (device/cycles.py)
    measure callbacks               record it in the JSON database, train the cost model,
                                    advance the progress bar, report failed trials

Everything goes to WORK_DIR: MetaSchedule's JSON database (``database_workload.json``,
``database_tuning_record.json``), ``tuning_summary.json`` (per task: trials, failed trials,
best time and its tiles; it also marks the directory as a tvm_armq database) and
``logs/tuning.log``. ``load_database`` reads a WORK_DIR back, checking it, and
``schedule_from_database`` replays the best record of a func, or says None so the caller
keeps the default schedule.

Failures do not stop a run. A candidate that does not build, crashes the device's worker or
overruns ``TRIAL_TIMEOUT_S`` is a failed trial (reported, recorded without a time); when no
device is registered under KEY any more, every further trial fails at once instead of
waiting for one.

Times measured on the emulated device are qemu's, not an Arm core's: they rank candidates
by how much work qemu does, not by how fast a CPU runs them. Without a board, tune with
``measure="cycles"``; with one, time it (``tracker="host:port:key"``). The summary records
which (``TuningSummary.measured``) and a run never mixes the two in one database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import RPCRunner
from tvm.s_tir.meta_schedule.utils import fork_seed
from tvm.support.popen_pool import PopenPoolExecutor

from .device import Endpoint
from . import export, targets, zoo
from .targets import LEVELS

# ------------------------------------------------------------------ settings
SUMMARY_FILE = "tuning_summary.json"
SUMMARY_FORMAT = "tvm_armq-tuning/1"
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
LOG_FILE = Path("logs") / "tuning.log"

BATCH = 8  # candidates built and measured per round of a task (then the cost model learns)
# Evolutionary search over a space of a few dozen tilings per layer: a population well
# above the space's size still finds every distinct candidate; MetaSchedule's default
# (512) would only spend time re-drawing duplicates.
POPULATION = 64
BUILD_TIMEOUT_S = 300.0  # compile + cross-link of one candidate, on a busy host
# One measurement: tracker request, upload, load, argument copy and the timed runs. Under
# qemu this is seconds; past it the device is taken for hung and the trial fails.
TRIAL_TIMEOUT_S = 120.0
# time_evaluator: `repeat` means of `number` runs each, each repeat at least
# `min_repeat_ms` long. Small numbers keep trials short under emulation.
EVALUATOR = dict(number=3, repeat=3, min_repeat_ms=20, enable_cpu_cache_flush=False)
# Ports of a tracker and an emulated device started by `tune`: ranges of their own, so a
# run does not race the test suite's devices (9190.., 9290.., 9390..) for a port.
TRACKER_PORTS = (9490, 9589)
DEVICE_PORT = 9890  # the first one tried
TRACKER_START_S = 60.0
# A device started with a tracker is waited for by asking the tracker for it, which blocks
# if the device died while starting; past this, the run gives up on it.
DEVICE_START_S = 360.0
ERRORS_KEPT = 5  # distinct failure messages per task kept in the summary
FAILED_RUN_SECS = 1e10  # the run time MetaSchedule records for a failed trial

# Function attributes of a tvm_armq kernel func (schedules.gemm_compute.annotate).
ATTR_OP, ATTR_KERNEL = "tvm_armq.op", "tvm_armq.kernel"


class TuningError(RuntimeError):
    """A tuning run cannot start or go on; the message says why."""


class TuningDatabaseError(TuningError):
    """A WORK_DIR is not a readable tvm_armq tuning database; the message names the file."""


class DeviceGone(RuntimeError):
    """No device is registered under the tuning key at the tracker (raised per trial)."""


# ------------------------------------------------------------------ tasks
@dataclasses.dataclass(frozen=True)
class Task:
    """One layer to tune: its name, its unscheduled kernel func and the plan it was built
    from (whose kernel is the micro-kernel record)."""

    name: str
    func: object  # tvm.tirx.PrimFunc, unscheduled (schedules.gemm_compute.conv2d_gemm_func)
    plan: object  # tvm_armq.schedules.gemm_plan.GemmPlan

    @property
    def kernel(self):
        """The micro-kernel record of the task's main GEMM."""
        return self.plan.kernel


def tasks_of_model(model, target) -> list[Task]:
    """The tuning tasks of a TFLite model for ``target``: one per distinct conv2d / dense
    layer (a func and its plan, as ``tvm_armq.passes`` build them when it compiles the
    model), in model order. The pass runs unscheduled; its ``tuned_schedule`` hook sees
    every GEMM layer and records it."""
    import tvm_ffi

    from .frontend.importer import import_tflite
    from .passes.integer import quantized_to_integer

    target = targets.resolve(target)
    tasks, seen = [], set()

    def record(func, plan):
        key = tvm_ffi.structural_hash(func)
        if key not in seen:
            seen.add(key)
            tasks.append(Task(f"conv2d_gemm_{len(tasks)}", func, plan))
        return None  # no tuned schedule: the pass goes on as it would

    with target:
        quantized_to_integer(target, tuned_schedule=record, schedule=False)(
            import_tflite(model))
    return tasks


def database_schedule(database, target):
    """The ``tuned_schedule`` hook of ``passes.integer.quantized_to_integer`` that replays
    ``database``: a GEMM func's best record for ``target`` (``schedule_from_database``), or
    None where the database has none."""
    def tuned(func, _plan):
        return schedule_from_database(database, func, target)

    return tuned


def _workload(func):
    """The IRModule a func is tuned and looked up as: one ``main``, whatever the caller
    named it (the same layer must find its records under any symbol name).

    A deep copy: ``with_attr`` makes a new func that shares the caller's body, and a
    ``Schedule`` of it was seen to rewrite loops of that shared body in place (TVM 0.27),
    turning the caller's unscheduled func into a scheduled one.
    """
    import tvm

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return tvm.ir.load_json(tvm.ir.save_json(mod))


def design_space(plan, target, *, parallel: bool = True):
    """The MetaSchedule space generator of a conv2d_gemm task built from ``plan``:
    ``sample_conv2d_gemm``, run with ``parallel`` (how the kernels will run).

    No schedule rules (the function is the whole space), no postprocessors (it emits the
    final loop nest itself) and one mutator, for the sampled tiles.
    """
    from .schedules import gemm_schedule

    plan = dataclasses.replace(plan, parallel=parallel)

    def schedule(sch):
        gemm_schedule.sample_conv2d_gemm(sch, plan, target)

    return ms.space_generator.ScheduleFn(schedule, sch_rules=[], postprocs=[],
                                         mutator_probs={ms.mutator.MutateTileSize(): 1.0})


# ------------------------------------------------------------------ summary
@dataclasses.dataclass
class TaskSummary:
    """One task's outcome: trials measured in this run, how many failed, and the best
    record of the database (its mean time and the tile sizes it chose)."""

    name: str
    kernel: str
    trials: int = 0
    failed: int = 0
    best_us: float | None = None
    best_tiles: dict | None = None
    errors: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TuningSummary:
    """The outcome of ``tune``; written to WORK_DIR/tuning_summary.json."""

    target: str
    device: str
    work_dir: str
    seconds: float
    tasks: list
    # what the trials were measured with: "qemu-time" (wall time on the emulated device,
    # which ranks qemu's work), "board-time" (a real board's time_evaluator) or
    # "cycles:<core>" (estimated cycles on that core's model, tvm_armq/device/cycles.py)
    measured: str = "qemu-time"

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def failed(self) -> int:
        return sum(t.failed for t in self.tasks)

    def to_json(self) -> dict:
        return {"format": SUMMARY_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> "TuningSummary":
        fields = {f.name for f in dataclasses.fields(cls)}
        out = cls(**{k: v for k, v in d.items() if k in fields})
        out.tasks = [TaskSummary(**t) for t in out.tasks]
        return out

    def table(self) -> str:
        """Per task: trials, failures, best time and tiles (the CLI prints this)."""
        cyc = self.measured.startswith("cycles:")
        unit = "best cycles" if cyc else "best us"
        rows = [f"{'task':40s} {'trials':>6s} {'failed':>6s} {unit:>11s}  best tiles"]
        for t in self.tasks:
            best = (f"{t.best_us * CYCLES_PER_US if cyc else t.best_us:11.0f}"
                    if t.best_us is not None else f"{'-':>11s}")
            tiles = ", ".join(f"{k}={v}" for k, v in (t.best_tiles or {}).items()) or "-"
            rows.append(f"{t.name:40s} {t.trials:6d} {t.failed:6d} {best}  {tiles}")
            rows += [f"    failed: {e}" for e in t.errors]
        rows.append(f"{self.trials} trials ({self.failed} failed) in {self.seconds:.0f} s on "
                    f"{self.device}, measured as {self.measured}; database in "
                    f"{self.work_dir}")
        return "\n".join(rows)


def _best_record(database, func, target):
    """The fastest measured record of ``func`` for ``target`` in ``database``, or None."""
    mod = _workload(func)
    if not database.has_workload(mod):
        return None
    workload = database.commit_workload(mod)  # already there: a lookup, nothing written
    want = _target_key(target)
    for record in database.get_top_k(workload, max(1, len(database))):  # fastest first
        secs = [float(x) for x in (record.run_secs or [])]
        if not secs or min(secs) >= FAILED_RUN_SECS:
            continue
        if record.target is None or _target_key(record.target) == want:
            return record
    return None


def target_key(target) -> tuple:
    """What makes two targets the same for a schedule: kind, triple, cpu and attributes."""
    a = target.attrs
    return (target.kind.name, str(a.get("mtriple", "")), str(a.get("mcpu", "")),
            tuple(sorted(str(m) for m in a.get("mattr", []))))


_target_key = target_key


def _tiles(trace) -> dict:
    """The sampled tile decisions of a trace as {knob: inner factor}. ``sample_conv2d_gemm``
    draws them in the order of ``SAMPLE_MAX_INNER`` (m_tiles, n_tiles, k_unroll); a trace
    with another count of draws is shown as the raw [outer, inner] pairs."""
    from .schedules import gemm_schedule

    decisions = [[int(v) for v in trace.decisions[inst]] for inst in trace.insts
                 if inst.kind.name == "SamplePerfectTile" and inst in trace.decisions]
    knobs = list(gemm_schedule.SAMPLE_MAX_INNER)
    if len(knobs) == len(decisions):
        return {k: d[-1] for k, d in zip(knobs, decisions)}
    return {f"tile{i}": d for i, d in enumerate(decisions)}


# ------------------------------------------------------------------ builder / runner
def _init_worker() -> None:
    """Builder and runner worker processes: register tvm_armq's TIR operators (qmuls),
    without which the candidate modules they receive cannot even be deserialized."""
    from .intrinsics import qmuls  # noqa: F401 - registers on import


def _build_candidate(mod, target, _params):
    """LocalBuilder's build step: stock ``default_build`` without its ``import
    tvm.s_tir.tensor_intrin``, which registers every TensorIntrin TVM ships (CUDA, x86,
    Hexagon, ...) and took 14 s in each fresh worker, i.e. most of a candidate's build time.
    A candidate arrives tensorized already: nothing here looks an intrinsic up."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.compile(mod, target=target)


def _export_aarch64_so(rt_mod) -> str:
    """LocalBuilder's export step: the built module as an aarch64 shared library."""
    from tvm.support import cc

    folder = Path(tempfile.mkdtemp(prefix="tvm_armq_trial_"))
    path = folder / f"{folder.name}.so"  # unique: the device dlopens it by name
    rt_mod.export_library(str(path), fcompile=cc.cross_compiler(export.CROSS_CXX))
    return str(path)


def _create_session(rpc_config):
    """RPCRunner's session step: a device under the key, or DeviceGone at once if none is
    registered any more (stock ``request`` would queue for it forever)."""
    from tvm import rpc

    host, port, key = rpc_config.tracker_host, rpc_config.tracker_port, rpc_config.tracker_key
    tracker = rpc.connect_tracker(host, port)
    servers = {s.get("key") for s in tracker.summary().get("server_info", [])}
    if f"server:{key}" not in servers:  # a server registers as "server:<key>"
        raise DeviceGone(f"no device is registered under key {key!r} at the RPC tracker "
                         f"{host}:{port} (it stopped, or never started): not measured")
    return tracker.request(key, priority=rpc_config.session_priority,
                           session_timeout=rpc_config.session_timeout_sec, max_retry=1)


def _alloc_arguments(session, device, args_info, alloc_repeat):
    """RPCRunner's argument step: random tensors made on the host and copied over (the TVM
    runtime wheel of a device has no random-fill function). The values do not change how
    long a kernel takes; the integer range stays that of int8 data."""
    import tvm

    rng = np.random.default_rng(0)

    def tensor(dtype, shape):
        dt = np.dtype(dtype) if dtype != "bfloat16" else None
        if dt is not None and np.issubdtype(dt, np.integer):
            host = rng.integers(-128, 127, size=shape, endpoint=True).astype(dt)
        elif dt is not None and np.issubdtype(dt, np.floating):
            host = rng.uniform(-1.0, 1.0, size=shape).astype(dt)
        else:  # a dtype NumPy lacks: uninitialized memory times the same
            return tvm.runtime.empty(shape, dtype, device)
        return tvm.runtime.tensor(host, device)

    return [[tensor(dtype, shape) for _, dtype, shape in args_info]
            for _ in range(alloc_repeat)]


@derived_object
class BoundedRPCRunner(RPCRunner._cls):
    """TVM's RPCRunner whose every trial ends within ``trial_timeout`` seconds.

    Stock RPCRunner runs trials in a process pool without a timeout: a device that stops
    answering mid-trial would block the whole run. Here the pool kills a trial's worker
    at the timeout and the trial fails (TVM reports it as an RPCRunner timeout).
    """

    def __init__(self, *, trial_timeout: float, on_trial_done=None, **kwargs):
        super().__init__(**kwargs)
        self.pool.shutdown()
        self.pool = PopenPoolExecutor(max_workers=1, timeout=trial_timeout,
                                      initializer=_init_worker)
        self.on_trial_done = on_trial_done

    def run(self, runner_inputs):
        """Stock ``run``, and ``on_trial_done()`` as each trial's measurement ends: MetaSchedule
        reports results only when it joins a task, which with several tasks queued on one
        device can be many minutes after the trials ran."""
        futures = super().run(runner_inputs)
        if self.on_trial_done is not None:
            for f in futures:
                f.future.add_done_callback(lambda _: self.on_trial_done())
        return futures


# A cycle-measured trial is recorded as a time, as MetaSchedule's database wants one: its
# estimated cycles at this clock (1 GHz: one cycle a nanosecond).
CYCLES_PER_US = 1000.0


@derived_object
class _CycleFuture(ms.runner.PyRunnerFuture):
    """Candidate ``index`` of a job that measures several (``CycleRunner._measure``)."""

    def __init__(self, job, index: int):
        super().__init__()
        self.job, self.index = job, index

    def done(self) -> bool:
        return self.job.done()

    def result(self):
        try:
            cycles_per_call = self.job.result()[self.index]
            if isinstance(cycles_per_call, Exception):
                raise cycles_per_call
        except Exception as e:  # noqa: BLE001 - a failed trial, reported as such
            return ms.runner.RunnerResult(None, _short(str(e)))
        return ms.runner.RunnerResult([cycles_per_call / CYCLES_PER_US / 1e6], None)


@derived_object
class CycleRunner(ms.runner.PyRunner):
    """Measures each candidate as its estimated cycles per call on ``core``'s model: the
    candidates' libraries run on ``level``'s emulated CPU under the block-counting plugin
    and llvm-mca prices what ran (``device/cycles.py``). No RPC device is involved. A round's
    candidates are measured in one emulator run per host core (starting the emulated
    Python costs more than running a candidate); a run that crashes is redone one
    candidate at a time, so that only the crashing one fails."""

    def __init__(self, level: str, core: str, on_trial_done=None, runs: int = 1):
        super().__init__()
        import concurrent.futures

        from .device import cycles

        self.level, self.runs, self.on_trial_done = level, runs, on_trial_done
        self.pricer = cycles.Pricer(core)
        self.workers = os.cpu_count() or 1
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.workers)

    def _measure(self, runner_inputs) -> list:
        """Cycles per call of each input, or the exception that stopped its run."""
        from .device import cycles

        items = [(r.artifact_path, "main",
                  [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in r.args_info])
                 for r in runner_inputs]
        try:
            try:
                return self._cycles(items)
            except cycles.CycleModelError:
                if len(items) == 1:
                    raise
                return [self._one(item) for item in items]
        except Exception as e:  # noqa: BLE001 - every candidate of the job failed with it
            return [e] * len(items)
        finally:
            if self.on_trial_done is not None:
                for _ in items:
                    self.on_trial_done()

    def _cycles(self, items) -> list:
        """Cycles per call of each (library, entry, args), all in one emulator run."""
        from .device import cycles

        prof = cycles.profile_items(items, self.level, runs=self.runs,
                                    timeout=TRIAL_TIMEOUT_S * len(items))
        per = prof.cycles(self.pricer)
        return [per[cycles.MEASURED + i] for i in range(len(items))]

    def _one(self, item):
        try:
            return self._cycles([item])[0]
        except Exception as e:  # noqa: BLE001 - this candidate's failure
            return e

    def run(self, runner_inputs):
        if not runner_inputs:  # a task whose design space is used up sends none
            return []
        chunk = -(-len(runner_inputs) // self.workers)  # ceil: one job per host core
        futures = []
        for start in range(0, len(runner_inputs), chunk):
            part = runner_inputs[start:start + chunk]
            job = self.pool.submit(self._measure, part)
            futures += [_CycleFuture(job, i) for i in range(len(part))]
        return futures


def _runner(endpoint: Endpoint, on_trial_done=None):
    config = ms.runner.RPCConfig(tracker_host=endpoint.host, tracker_port=endpoint.port,
                                 tracker_key=endpoint.key, session_timeout_sec=TRIAL_TIMEOUT_S)
    return BoundedRPCRunner(rpc_config=config,
                            evaluator_config=ms.runner.EvaluatorConfig(**EVALUATOR),
                            f_create_session=_create_session,
                            f_alloc_argument=_alloc_arguments, initializer=_init_worker,
                            trial_timeout=TRIAL_TIMEOUT_S, on_trial_done=on_trial_done)


def _builder():
    return ms.builder.LocalBuilder(max_workers=os.cpu_count() or 1,
                                   timeout_sec=BUILD_TIMEOUT_S, f_build=_build_candidate,
                                   f_export=_export_aarch64_so, initializer=_init_worker)


# ------------------------------------------------------------------ progress
def _short(error: str) -> str:
    """The line of a MetaSchedule error message that says what went wrong."""
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    head = lines[0] if lines else "unknown error"
    last = lines[-1] if lines else ""
    text = head if last == head else f"{head.rstrip(':')}: {last}"
    return text if len(text) <= 240 else text[:237] + "..."


class TrialBar:
    """The progress bar, advanced once per trial: by the runner as each measurement ends
    (from its pool's thread), by ``ProgressCallback`` for a candidate that failed to build
    (never measured). tqdm shows the count, the elapsed time and an estimate of the rest."""

    def __init__(self, bar):
        import threading

        self.bar, self.lock = bar, threading.Lock()

    def advance(self, n: int = 1) -> None:
        with self.lock:
            self.bar.update(n)

    def __getattr__(self, name):  # write, set_postfix_str, ...: the bar's own
        return getattr(self.bar, name)


@derived_object
class ProgressCallback(PyMeasureCallback):
    """Counts trials and failures per task, advances the progress bar for candidates that
    failed to build and reports each failed trial (one line; the whole message is in
    logs/tuning.log)."""

    def __init__(self, names: list[str], bar: TrialBar, logger: logging.Logger):
        super().__init__()
        self.names, self.bar, self.logger = names, bar, logger
        self.stats: dict[str, TaskSummary] = {}

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results):
        name = self.names[task_id]
        stats = self.stats.setdefault(name, TaskSummary(name, ""))
        for build_res, run_res in zip(builder_results, runner_results):
            stats.trials += 1
            error = build_res.error_msg or (run_res.error_msg if run_res is not None else None)
            if error is None:
                continue
            stats.failed += 1
            short = _short(error)
            if short not in stats.errors and len(stats.errors) < ERRORS_KEPT:
                stats.errors.append(short)
            self.logger.warning("%s: trial %d failed:\n%s", name, stats.trials, error)
            self.bar.write(f"{name}: trial {stats.trials} failed: {short}", file=sys.stderr)
        # measured trials advanced the bar as they ended (BoundedRPCRunner.on_trial_done)
        self.bar.advance(sum(1 for b in builder_results if b.error_msg))
        failed = sum(s.failed for s in self.stats.values())
        self.bar.set_postfix_str(f"{failed} failed" if failed else "")


# ------------------------------------------------------------------ the device
MEASURES = ("time", "cycles")


@contextlib.contextmanager
def _measurer(measure: str, tracker, level, target, work: Path):
    """What measures the trials: (endpoint or None, a description for the summary)."""
    if measure == "cycles":
        yield None, f"the emulated {_level_of(target, level)} CPU, cycles estimated"
        return
    with _device(tracker, level, target, work) as found:
        yield found


@contextlib.contextmanager
def _device(tracker, level: str | None, target, work: Path):
    """The endpoint (tracker host, port, key) trials are measured on; with no ``tracker``,
    a tracker and the emulated device of ``level`` started here and stopped after."""
    if tracker is not None:
        try:
            endpoint = tracker if isinstance(tracker, Endpoint) else Endpoint.parse(tracker)
        except ValueError as e:
            raise TuningError(f"RPC tracker: {e}") from None
        if not endpoint.key:
            raise TuningError(f"RPC tracker {endpoint}: a device key is needed "
                              "(HOST:PORT:KEY, the key the board registered under)")
        yield endpoint, f"{endpoint.key} at the RPC tracker {endpoint.host}:{endpoint.port}"
        return
    level = _level_of(target, level)
    with _local_tracker(work) as (host, port):
        dev = _start_emulated(level, f"{host}:{port}", f"armq-{level}")
        try:
            yield dev.endpoint, f"the emulated {level} device (qemu, not real timings)"
        finally:
            dev.stop()


def _start_emulated(level: str, tracker: str, key: str):
    """``device.start`` of an emulated device registered at ``tracker``, within
    ``DEVICE_START_S``: started in a thread, as its wait for the device can block."""
    import threading

    from . import device

    result: dict = {}

    def start():
        try:
            result["device"] = device.start(level, port=DEVICE_PORT, tracker=tracker, key=key)
        except Exception as e:  # noqa: BLE001 - handed to the caller
            result["error"] = e

    thread = threading.Thread(target=start, name=f"start-{level}-device", daemon=True)
    thread.start()
    thread.join(DEVICE_START_S)
    if "error" in result:
        raise result["error"]
    if "device" not in result:  # the device thread ends once the tracker is stopped
        raise TuningError(f"the emulated {level} device did not register at the RPC tracker "
                          f"{tracker} within {DEVICE_START_S:.0f} s (logs: {device.home()}/run)")
    return result["device"]


def _level_of(target, level: str | None) -> str:
    if level is None and isinstance(target, str) and target in LEVELS:
        level = target
    if level not in LEVELS:
        raise TuningError(f"which emulated device should time the trials? Pass an ISA level "
                          f"({', '.join(LEVELS)}) for target {target}, or a tracker of "
                          "real boards")
    return level


@contextlib.contextmanager
def _local_tracker(work: Path):
    """A TVM RPC tracker on loopback for the length of a run; its log is in logs/."""
    log = work / "logs" / "rpc_tracker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    lo, hi = TRACKER_PORTS
    with open(log, "w") as out:  # a session of its own: the tracker forks a worker process
        proc = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host",
                                 "127.0.0.1", "--port", str(lo), "--port-end", str(hi)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + TRACKER_START_S
        while True:  # the tracker logs "bind to HOST:PORT" once it listens
            bound = [ln for ln in log.read_text(errors="replace").splitlines()
                     if "bind to" in ln]
            if bound:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise TuningError(f"the RPC tracker did not start; its log ({log}):\n"
                                  f"{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield "127.0.0.1", int(bound[0].rsplit(":", 1)[1])
    finally:  # the tracker and the worker it forked
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(10)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # the worker may outlive its parent
            os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def _log_to(path: Path):
    """MetaSchedule's loggers write to ``path`` (not the console) for the run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


# ------------------------------------------------------------------ tune
def tune(tasks, target, *, work_dir, trials: int, tracker=None, level: str | None = None,
         progress: bool = True, parallel: bool = True, seed: int | None = None,
         batch: int = BATCH, measure: str = "time", core: str | None = None) -> TuningSummary:
    """Tune ``tasks`` (``Task`` or (name, func, plan) tuples) for ``target``.

    ``trials`` candidates are measured per task. With ``measure="time"``, timed on the
    device under ``tracker`` (``Endpoint`` or "host:port:key"); without one, on the
    emulated device of ``level`` (default: ``target`` when it names a level), started and
    stopped here. With ``measure="cycles"``, as estimated cycles on ``core``'s model
    (default: the level's core) of a run on the level's emulated CPU (``CycleRunner``;
    no device, no tracker). The database
    in ``work_dir`` is created or extended (records of earlier runs seed the search).
    ``parallel`` is how the kernels will run (it follows the deployment, it is not a
    knob); ``batch`` candidates of a task are built and measured per round. Returns the
    summary, also written to ``work_dir/tuning_summary.json``.
    """
    started = time.monotonic()
    tasks = [t if isinstance(t, Task) else Task(*t) for t in tasks]
    if not tasks:
        raise TuningError("nothing to tune: the model has no conv2d / dense layer")
    if trials < 1 or batch < 1:
        raise TuningError(f"trials and batch must be at least 1, got {trials} and {batch}")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise TuningError(f"task names must be unique: {names}")
    if measure not in MEASURES:
        raise TuningError(f"measure {measure!r}: expected one of {', '.join(MEASURES)}")
    if measure == "cycles" and tracker is not None:
        raise TuningError("measure='cycles' estimates cycles on the emulated CPU: it takes "
                          "no RPC tracker (a real board is measured with measure='time')")
    if measure == "cycles":
        from .device import cycles

        level = _level_of(target, level)
        core = cycles.core_for(level, core)
        measured = f"cycles:{core}"
    else:
        measured = "board-time" if tracker is not None else "qemu-time"
    tgt = targets.resolve(target)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if any((work / f).exists() for f in DATABASE_FILES + (SUMMARY_FILE,)):
        database = load_database(work)  # resume: only a database of ours
        earlier = read_summary(work).measured
        if earlier != measured:
            raise TuningError(f"{work} holds trials measured as {earlier}; this run would "
                              f"add trials measured as {measured}, which do not compare: "
                              "use another --work-dir")
    else:
        _register_ops()
        database = ms.database.JSONDatabase(work_dir=str(work), module_equality="structural")
        # the directory is marked as ours from the start, so an interrupted run resumes
        _write_summary(TuningSummary(str(tgt), "", str(work), 0.0,
                                     [TaskSummary(t.name, t.kernel.name) for t in tasks],
                                     measured))

    from tqdm import tqdm

    with _log_to(work / LOG_FILE) as logger, \
            _measurer(measure, tracker, level, target, work) as (endpoint, where), \
            tqdm(total=trials * len(tasks), unit="trial", desc="tuning", file=sys.stderr,
                 disable=not progress, dynamic_ncols=True, miniters=1) as bar:
        seeds = fork_seed(seed, n=len(tasks))
        contexts = [
            ms.TuneContext(mod=_workload(t.func), target=tgt,
                           space_generator=design_space(t.plan, tgt, parallel=parallel),
                           search_strategy=ms.search_strategy.EvolutionarySearch(
                               population_size=POPULATION,
                               init_min_unmeasured=min(POPULATION, 2 * batch)),
                           task_name=t.name, rand_state=s,
                           logger=logger.getChild(f"task.{t.name}"))
            for t, s in zip(tasks, seeds)]
        bar = TrialBar(bar)
        callback = ProgressCallback(names, bar, logger)
        batch = min(batch, trials)
        ms.tune_tasks(
            tasks=contexts, task_weights=[1.0] * len(tasks), work_dir=str(work),
            max_trials_global=trials * len(tasks), max_trials_per_task=trials,
            num_trials_per_iter=batch, builder=_builder(),
            runner=(CycleRunner(level, core, bar.advance) if measure == "cycles"
                    else _runner(endpoint, bar.advance)),
            database=database,
            cost_model=ms.cost_model.XGBModel(num_warmup_samples=batch,
                                              num_tuning_cores=os.cpu_count()),
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"),
                               callback],
            task_scheduler="gradient")

    summaries = []
    for t in tasks:
        s = callback.stats.get(t.name, TaskSummary(t.name, ""))
        s.kernel = t.kernel.name
        record = _best_record(database, t.func, tgt)
        if record is not None:
            s.best_us = float(np.mean([float(x) for x in record.run_secs])) * 1e6
            s.best_tiles = _tiles(record.trace)
        summaries.append(s)
    summary = TuningSummary(str(tgt), where, str(work), time.monotonic() - started, summaries,
                            measured)
    _write_summary(summary)
    return summary


def _write_summary(summary: TuningSummary) -> None:
    # written whole, then renamed: never half a file
    zoo.atomic_write(Path(summary.work_dir) / SUMMARY_FILE,
                     json.dumps(summary.to_json(), indent=1).encode())


# ------------------------------------------------------------------ reading it back
def _register_ops() -> None:
    """What a tuning database's IR refers to must exist before it is read or replayed:
    the qmuls operator (workloads) and the micro-kernels' TensorIntrins (traces)."""
    from .intrinsics import registry

    _init_worker()
    registry.register_all()


# A TensorIntrin name of a whole-K or direct-read form, as a JSON string in a record's trace.
_INTRIN_NAME = re.compile(r'"(gemm_[a-z0-9_]+__(?:k\d+|direct_[a-z0-9_]+))"')


def _check_lines(path: Path, check) -> int:
    """Every line of a MetaSchedule JSON-lines table must parse and have its shape."""
    n = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TuningDatabaseError(f"{path}, line {lineno}: not JSON ({e.msg}): "
                                          "the file is corrupt") from None
            problem = check(row)
            if problem:
                raise TuningDatabaseError(f"{path}, line {lineno}: {problem}: not a "
                                          "MetaSchedule database table")
            n += 1
    return n


def _workload_row(row) -> str | None:
    if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str)):
        return "expected [structural hash, module]"
    return None


def _record_row(n_workloads):
    def check(row) -> str | None:
        if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], int)
                and isinstance(row[1], list)):
            return "expected [workload index, record]"
        if not 0 <= row[0] < n_workloads:
            return f"workload index {row[0]} is not in the workload table ({n_workloads} rows)"
        if len(row[1]) != 4:
            return "expected a record [trace, run times, target, arguments]"
        return None

    return check


def load_database(work_dir):
    """The MetaSchedule database that ``tune`` wrote to ``work_dir``, checked.

    Raises ``TuningDatabaseError`` naming the file and what is wrong when ``work_dir`` is
    missing, is not a tvm_armq tuning directory, or holds corrupt tables or workloads that
    are not tvm_armq kernels (a foreign database).
    """
    work = Path(work_dir)
    if not work.is_dir():
        raise TuningDatabaseError(f"{work}: no such directory (a tuning database is the "
                                  "--work-dir of `python -m tvm_armq tune`)")
    summary = work / SUMMARY_FILE
    if not summary.is_file():
        raise TuningDatabaseError(f"{work}: no {SUMMARY_FILE}, so not a database written by "
                                  "`python -m tvm_armq tune`")
    try:
        fmt = json.loads(summary.read_text(errors="replace")).get("format")
    except (json.JSONDecodeError, AttributeError):
        raise TuningDatabaseError(f"{summary}: not a tvm_armq tuning summary (not a JSON "
                                  "object)") from None
    if fmt != SUMMARY_FORMAT:
        raise TuningDatabaseError(f"{summary}: format {fmt!r}, expected {SUMMARY_FORMAT!r}")
    paths = [work / f for f in DATABASE_FILES]
    for p in paths:
        if not p.is_file():
            raise TuningDatabaseError(f"{p}: missing (the database is incomplete)")
    n_workloads = _check_lines(paths[0], _workload_row)
    _check_lines(paths[1], _record_row(n_workloads))
    _register_ops()
    # MetaSchedule checks every trace's Tensorize against the registered intrinsics as it
    # reads the records. The whole-K and direct-read forms are registered on demand when a
    # schedule is built, so a process that only replays has not built them: register the
    # ones the records name (their names carry their parameters: registry.register_named).
    from .intrinsics import registry

    for name in sorted(set(_INTRIN_NAME.findall(paths[1].read_text(errors="replace")))):
        if "__direct_" in name and registry.parse_direct_name(name)[1].by_pixel:
            continue  # an INDIRECT form's mark: lowered when built, no TensorIntrin
        registry.register_named(name)
    try:
        database = ms.database.JSONDatabase(str(paths[0]), str(paths[1]), allow_missing=False,
                                            module_equality="structural")
    except Exception as e:  # noqa: BLE001 - TVM's parser says what in its last line
        raise TuningDatabaseError(f"{work}: MetaSchedule cannot read its tables "
                                  f"({' / '.join(DATABASE_FILES)}): {_short(e)}") from None
    for record in database.get_all_tuning_records():
        func = record.workload.mod["main"] if "main" in [
            gv.name_hint for gv in record.workload.mod.get_global_vars()] else None
        if func is None or ATTR_OP not in (func.attrs or {}):
            raise TuningDatabaseError(f"{paths[0]}: holds a workload that is not a tvm_armq "
                                      f"kernel (no {ATTR_OP} attribute): a foreign database")
    return database


def schedule_from_database(database, func, target):
    """The best tuned schedule of ``func`` (an unscheduled tvm_armq kernel PrimFunc) for
    ``target``, or None when ``database`` has no measured record of that workload there.

    The result is ``func`` scheduled by replaying the record's trace, with ``func``'s own
    attributes (symbol name included) and a row tail's outputs merged into one
    (``tir_util.merge_outputs``).
    """
    import tvm
    from tvm import s_tir

    from .schedules import tir_util

    if ATTR_OP not in (func.attrs or {}):
        raise ValueError(f"schedule_from_database: the func has no {ATTR_OP} attribute; "
                         "tuning records exist only for tvm_armq kernel funcs "
                         "(schedules.gemm_compute.annotate)")
    _register_ops()
    tgt = targets.resolve(target)
    record = _best_record(database, func, tgt)
    if record is None:
        return None
    sch = s_tir.Schedule(_workload(func))
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    scheduled = tir_util.merge_outputs(sch.mod["main"])
    own = func.attrs or {}
    for key in ("global_symbol", "tirx.noalias"):
        if key in own:
            scheduled = scheduled.with_attr(key, own[key])
        elif key in (scheduled.attrs or {}):
            scheduled = scheduled.without_attr(key)
    assert isinstance(scheduled, tvm.tirx.PrimFunc)
    return scheduled


def read_summary(work_dir) -> TuningSummary:
    """The summary ``tune`` wrote to ``work_dir``."""
    path = Path(work_dir) / SUMMARY_FILE
    try:
        return TuningSummary.from_json(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise TuningDatabaseError(f"{path}: cannot read the tuning summary: {e}") from None


__all__ = ["Task", "TaskSummary", "TuningSummary", "TuningError", "TuningDatabaseError",
           "DeviceGone", "tasks_of_model", "design_space", "tune", "load_database",
           "schedule_from_database", "database_schedule", "read_summary"]
