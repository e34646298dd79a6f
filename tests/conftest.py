"""Shared test fixtures: the aarch64 devices and the test models.

Devices are started lazily, once per test session and per ISA level, the first
time a test asks for one, and always stopped at the end. A device that cannot
start fails the tests that need it with the reason (never a skip, never a hang:
``device.start`` gives up after ``START_TIMEOUT``).

To run the same tests on real boards, point a level at one:
``TVM_ARMQ_DEVICE_I8MM=host:port`` (or ``tracker_host:port:key``).

The suite runs on two pytest-xdist workers (``-n 2`` in setup.cfg: the machine's two
cores), each test file whole on one worker (``--dist loadgroup``, one group per file) so
that a file's module fixtures are built once. Each worker starts its own devices, on ports
of its own (``PORT_STEP`` apart) and recorded in a run directory of its own, so that the
command-line tests of a worker find their worker's devices; the files that start tuning
devices (one fixed port) share a group (``SHARED_GROUPS``). The heaviest files are handed
out first (``HEAVY_FIRST``), so that the two workers end together; the files of whole models
are a group per level (``SPLIT_BY_LEVEL``).
"""

from __future__ import annotations

import gc
import os

import pytest

from tvm_armq import device as dev_mod
from tvm_armq import targets
from tvm_armq.targets import LEVELS

# xdist's worker name ("gw0", "gw1", ...), or None when the suite runs in one process
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
WORKER_INDEX = int(WORKER[2:]) if WORKER else 0
PORT_STEP = 20  # a worker's level devices start at the level's default port + PORT_STEP * index
if WORKER:  # the CLI's device records, which `run` looks up: this worker's own
    os.environ["TVM_ARMQ_RUN_DIR"] = str(dev_mod.home() / "run" / WORKER)


class Devices:
    """One device per ISA level, started on first use, stopped at the end of the session."""

    def __init__(self):
        self._started: dict[str, dev_mod.Device] = {}
        self._endpoints: dict[str, dev_mod.Endpoint] = {}
        self._failed: dict[str, str] = {}

    def endpoint(self, level: str) -> dev_mod.Endpoint:
        """The level's device, started if need be, with no session of an earlier test open.

        A TVM RPC server serves one session at a time: a new client waits until the
        previous session is closed. Sessions (and the remote modules, functions and
        tensors that keep them open) often sit in reference cycles, so the end of a test
        does not close them; collecting the cycles here does, instead of a deadlock.
        """
        gc.collect()
        if level in self._failed:
            pytest.fail(self._failed[level], pytrace=False)
        if level not in self._endpoints:
            override = os.environ.get(f"TVM_ARMQ_DEVICE_{level.upper()}")
            try:
                if override:
                    self._endpoints[level] = dev_mod.Endpoint.parse(override)
                else:
                    d = dev_mod.start(level, port=dev_mod.DEFAULT_PORTS[level]
                                      + PORT_STEP * WORKER_INDEX)
                    self._started[level] = d
                    self._endpoints[level] = d.endpoint
            except Exception as e:  # noqa: BLE001 - reported as the tests' failure
                self._failed[level] = f"the {level} device could not start: {e}"
                pytest.fail(self._failed[level], pytrace=False)
        return self._endpoints[level]

    def session(self, level: str):
        """A new RPC session (its own worker process) on the level's device."""
        return self.endpoint(level).connect()

    def log(self, level: str):
        """The emulated device's log file, or None for a real board."""
        d = self._started.get(level)
        return d.log if d else None

    def stop_all(self):
        for d in self._started.values():
            d.stop()
        self._started.clear()


@pytest.fixture(scope="session", autouse=True)
def provisioned():
    """The machine set up once, before the first test: qemu, the aarch64 cross toolchain
    every export links with, the guest's Python. On a fresh machine the first test that
    exports a library would otherwise fail (a device start provisions, an export does
    not); where everything is in place this only checks it."""
    if not dev_mod.provisioned():
        dev_mod.provision()


@pytest.fixture(scope="session")
def devices():
    ds = Devices()
    yield ds
    ds.stop_all()


@pytest.fixture(scope="session")
def run_funcs(devices):
    """``run_funcs(level, funcs, calls, path)``: compile ``funcs`` (name -> PrimFunc) as one
    module for the level, upload it once to the level's device and run every
    (name, args, out_shape, out_dtype) of ``calls`` (the output is the last parameter);
    returns (the module's asm, [outputs])."""
    import numpy as np
    import tvm

    from tvm_armq import export

    def run(level, funcs, calls, path):
        named = {name: f.with_attr("global_symbol", name) for name, f in funcs.items()}
        ex = tvm.compile(tvm.IRModule(named), target=targets.resolve(level))
        # the device first: starting it provisions the cross toolchain the export links with
        sess = devices.session(level)
        lib = export.export_aarch64(ex, path)
        sess.upload(str(lib))
        rlib, dev = sess.load_module(lib.name), sess.cpu(0)
        outs = []
        for name, args, shape, dtype in calls:
            out = tvm.runtime.tensor(np.zeros(shape, dtype), dev)
            rlib[name](*[tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in args], out)
            outs.append(out.numpy())
        return ex.mod.inspect_source("asm"), outs

    return run


@pytest.fixture(scope="module")
def compiled_models(devices, tmp_path_factory):
    """``compiled_models(level, name, model, seeds)`` -> (compile report, [(outputs,
    TFLite's outputs) per seed]): ``model`` (a path, bytes or ``TFLiteModel``) compiled for
    the level and one thread the first time a test of the module asks for ``(level, name)``,
    run on the random inputs of each seed (``make_inputs(seed)``'s, if given) in the level's
    one session of the module (a device serves one session at a time; the sessions end with
    the module)."""
    from tvm_armq import build, export
    from tvm_armq.frontend.model import TFLiteModel

    sessions: dict = {}
    cache: dict = {}

    def session(level: str):
        """The module's one session of the level's device (a device serves one at a time:
        a test of the module that runs a library of its own asks for it here)."""
        if level not in sessions:
            sessions[level] = devices.session(level)
        return sessions[level]

    def get(level: str, name: str, model, seeds, make_inputs=None) -> tuple[list, list]:
        if (level, name) not in cache:
            model, report = TFLiteModel.load(model), []
            # threads=1: the serial code a default build runs on the device's one-thread pool
            # (its kernels' serial twins), compiled once instead of beside the parallel
            # kernels; test_threads runs those and the choice between the two
            lib = export.export_aarch64(
                build.compile_tflite(model, level, report=report, threads=1),
                tmp_path_factory.mktemp(f"models-{level}") / f"{name.replace('.', '_')}.so")
            run = build.DeviceModel(session(level), lib)
            inputs = map(make_inputs or model.random_inputs, seeds)
            cache[level, name] = report, [(run(x), model.reference_outputs(x)) for x in inputs]
        return cache[level, name]

    get.session = session
    yield get
    sessions.clear()


@pytest.fixture(params=list(LEVELS))
def level(request) -> str:
    """Each ISA level in turn."""
    return request.param


@pytest.fixture(scope="session")
def zoo_model():
    """``zoo_model(name)`` -> path of the test model, built once and cached."""
    from tvm_armq import zoo

    return zoo.build


# ------------------------------------------------------------ markers and workers
# The fixtures that start an emulated device: a test that asks for one is a device test.
DEVICE_FIXTURES = ("devices", "run_funcs")
# Files that must run on one worker together: both start `tune`'s device on its one port.
SHARED_GROUPS = {"test_tuning": "tuning", "test_cli_errors": "tuning"}
# Files of whole models whose tests at one level need nothing of another level's: a group
# per level, so that the workers share them.
SPLIT_BY_LEVEL = {"test_models", "test_baseline", "test_op_coverage"}
# The files that take longest (``--durations``), handed out first; the rest in file order.
HEAVY_FIRST = ["test_tuning", "test_cli_errors", "test_models", "test_baseline", "test_conv2d_gemm",
               "test_depthwise", "test_qmuls", "test_cycles", "test_portable"]


def _module(item) -> str:
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """A test that asks for a device fixture must say so (``@pytest.mark.device``), so
    ``-m device`` / ``-m "not device"`` select what they say. Each file is one xdist group
    (``SHARED_GROUPS`` join some), the heaviest first."""
    unmarked = [it.nodeid for it in items
                if set(DEVICE_FIXTURES) & set(getattr(it, "fixturenames", ()))
                and it.get_closest_marker("device") is None]
    if unmarked:
        raise pytest.UsageError("tests that start a device without @pytest.mark.device:\n  "
                                + "\n  ".join(unmarked))
    rank = {m: i for i, m in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda it: rank.get(_module(it), len(rank)))  # stable: file order kept
    for it in items:
        group = SHARED_GROUPS.get(_module(it), _module(it))
        level = getattr(it, "callspec", None) and it.callspec.params.get("level")
        if _module(it) in SPLIT_BY_LEVEL and level:
            group += f"-{level}"
        it.add_marker(pytest.mark.xdist_group(group))


# ------------------------------------------------------------ accuracy report
_REPORT: list[str] = []


ACCURACY = "accuracy"  # the user property a test's accuracy lines travel in


@pytest.fixture
def report(request):
    """``report(line)``: a line for the accuracy table printed at the end of the run. It
    travels with the test's report, so that the lines of every xdist worker reach the
    table."""
    return lambda line: request.node.user_properties.append((ACCURACY, line))


def pytest_runtest_logreport(report):
    if report.when == "call":
        _REPORT.extend(line for key, line in report.user_properties if key == ACCURACY)


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("accuracy against TFLite (reference kernels)")
        for line in sorted(_REPORT):
            terminalreporter.write_line(line)
