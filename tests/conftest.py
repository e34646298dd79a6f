"""Shared test fixtures: the aarch64 devices and the test models.

Devices are started lazily, once per test session and per ISA level, the first
time a test asks for one, and always stopped at the end. A device that cannot
start fails the tests that need it with the reason (never a skip, never a hang:
``device.start`` gives up after ``START_TIMEOUT``).

To run the same tests on real boards, point a level at one:
``TVM_ARMQ_DEVICE_I8MM=host:port`` (or ``tracker_host:port:key``).
"""

from __future__ import annotations

import gc
import os

import pytest

from tvm_armq import device as dev_mod
from tvm_armq import targets
from tvm_armq.targets import LEVELS


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
                    d = dev_mod.start(level)
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


@pytest.fixture(params=list(LEVELS))
def level(request) -> str:
    """Each ISA level in turn."""
    return request.param


@pytest.fixture(scope="session")
def zoo_model():
    """``zoo_model(name)`` -> path of the test model, built once and cached."""
    from tvm_armq import zoo

    return zoo.build


# ------------------------------------------------------------ accuracy report
_REPORT: list[str] = []


@pytest.fixture(scope="session")
def report():
    """``report(line)``: a line for the accuracy table printed at the end of the run."""
    return _REPORT.append


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("accuracy against TFLite (reference kernels)")
        for line in sorted(_REPORT):
            terminalreporter.write_line(line)
