"""The emulated device is a real aarch64 CPU of its ISA level.

An sdot kernel (Armv8.2 dot product) runs and is exact on the dotprod and i8mm
devices, and dies with SIGILL on the neon device (a Cortex-A72, Armv8.0): the
levels differ in the instructions they execute, not only in their names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tvm_armq import device, export
from tvm_armq.targets import LEVELS

pytestmark = pytest.mark.device


def _sdot_library(tmp_path):
    """A one-instruction PrimFunc: C[i] = sum_j A[4i+j] * B[4i+j], by ``sdot`` (int8 -> int32)."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def sdot_kernel(A: T.Buffer((16,), "int8"), B: T.Buffer((16,), "int8"),
                    C: T.Buffer((4,), "int32")):
        T.func_attr({"global_symbol": "sdot_kernel", "tir.noalias": True})
        C[T.ramp(0, 1, 4)] = T.call_llvm_pure_intrin(
            "int32x4", "llvm.aarch64.neon.sdot.v4i32.v16i8", T.Broadcast(T.int32(0), 4),
            A[T.ramp(0, 1, 16)], B[T.ramp(0, 1, 16)])

    # Compiled for dotprod: the instruction is legal for the compiler, not for every CPU.
    lib = tvm.compile(sdot_kernel, target=LEVELS["dotprod"].target())
    asm = lib.mod.inspect_source("asm")
    assert "sdot\tv" in asm, "the kernel must really contain an sdot instruction"
    return export.export_aarch64(lib, tmp_path / "sdot.so")


def _operands():
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 127, 16, endpoint=True, dtype=np.int8)
    b = rng.integers(-128, 127, 16, endpoint=True, dtype=np.int8)
    expected = (a.astype(np.int32) * b.astype(np.int32)).reshape(4, 4).sum(axis=1)
    return a, b, expected


@pytest.mark.parametrize("lvl", ["dotprod", "i8mm"])
def test_sdot_runs_where_the_level_has_it(devices, tmp_path, lvl):
    import tvm

    lib = _sdot_library(tmp_path)
    sess = devices.session(lvl)
    sess.upload(str(lib))
    f = sess.load_module(lib.name)["sdot_kernel"]
    dev = sess.cpu(0)
    a, b, expected = _operands()
    c = tvm.runtime.tensor(np.zeros(4, np.int32), dev)
    f(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    np.testing.assert_array_equal(c.numpy(), expected)


def test_sdot_is_an_illegal_instruction_on_neon(devices, tmp_path):
    """Over RPC: the neon device's worker dies and the call fails; the device itself lives on."""
    import tvm

    lib = _sdot_library(tmp_path)
    sess = devices.session("neon")
    sess.upload(str(lib))
    f = sess.load_module(lib.name)["sdot_kernel"]
    dev = sess.cpu(0)
    a, b, _ = _operands()
    args = [tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev),
            tvm.runtime.tensor(np.zeros(4, np.int32), dev)]
    with pytest.raises(Exception):
        f(*args)
    log = devices.log("neon")
    if log is not None:  # emulated: qemu reports the signal that killed the worker
        assert "Illegal instruction" in log.read_text(errors="replace")
    # The server survived its worker: a new session works.
    assert devices.session("neon").cpu(0).exist


@pytest.mark.parametrize("lvl", list(LEVELS))
def test_sdot_signal_in_a_plain_process(tmp_path, lvl):
    """Without RPC: the aarch64 Python on the level's CPU exits by SIGILL exactly where it must."""
    device.provision()
    lib = _sdot_library(tmp_path)
    a, b, expected = _operands()
    script = textwrap.dedent(f"""
        import numpy as np, tvm
        f = tvm.runtime.load_module({str(lib)!r})["sdot_kernel"]
        a = np.array({a.tolist()}, np.int8); b = np.array({b.tolist()}, np.int8)
        c = tvm.runtime.tensor(np.zeros(4, np.int32))
        f(tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        print(c.numpy().tolist())
    """)
    res = subprocess.run(device.guest_command(lvl, "-c", script), env=device.guest_env(lvl),
                         capture_output=True, text=True, timeout=300)
    if lvl == "neon":
        assert res.returncode == -signal.SIGILL, (res.returncode, res.stderr[-2000:])
    else:
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.strip() == str(expected.tolist())


def test_endpoint_parsing():
    assert device.Endpoint.parse("10.0.0.5:9090") == device.Endpoint("10.0.0.5", 9090)
    assert device.Endpoint.parse("tracker:9190:rk3588") == device.Endpoint(
        "tracker", 9190, "rk3588")
    for bad in ("host", "host:port", "a:1:b:c"):
        with pytest.raises(ValueError):
            device.Endpoint.parse(bad)


def test_started_device_is_recorded_and_stops():
    """``start`` records the device for the CLI; ``Device.stop`` ends it and its record."""
    d = device.start("neon", port=9590)
    try:
        assert d.pid in [x.pid for x in device.instances("neon")]
        assert d.connect().cpu(0).exist
    finally:
        d.stop()
    assert not d.alive()
    assert d.pid not in [x.pid for x in device.instances("neon")]


def test_cli_device_lifecycle(tmp_path):
    """``device start/status/stop`` from the command line, in a run directory of its own."""
    env = dict(os.environ, TVM_ARMQ_RUN_DIR=str(tmp_path))

    def cli(*args):
        res = subprocess.run([sys.executable, "-m", "tvm_armq", "device", *args], env=env,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr
        return res.stdout

    try:
        cli("start", "--isa", "neon")
        status = json.loads(cli("status", "--json"))
        assert len(status["neon"]) == 1 and status["dotprod"] == status["i8mm"] == []
        port = status["neon"][0]["port"]
        assert device.Endpoint("127.0.0.1", port).connect().cpu(0).exist
        assert "neon: stopped" in cli("stop", "--isa", "neon")
        assert json.loads(cli("status", "--json"))["neon"] == []
    finally:
        cli("stop")


def test_device_registers_with_a_tracker(tmp_path):
    """A device started with a tracker is reachable as HOST:PORT:KEY, as a tuning farm needs."""
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host",
                                "127.0.0.1", "--port", "9690", "--port-end", "9700"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line, seen = "", []
        while "bind to" not in line:  # the tracker logs the port it bound
            line = tracker.stdout.readline()
            seen.append(line)
            assert line or tracker.poll() is None, "the RPC tracker did not start:\n" + "".join(
                seen[-20:])
        port = int(line.rsplit(":", 1)[1])
        d = device.start("neon", port=9790, tracker=f"127.0.0.1:{port}", key="armq-test")
        try:
            sess = device.Endpoint.parse(f"127.0.0.1:{port}:armq-test").connect()
            assert sess.cpu(0).exist
        finally:
            d.stop()
    finally:
        tracker.kill()


def test_unprovisioned_device_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_ARMQ_HOME", str(tmp_path))
    with pytest.raises(device.DeviceError, match="not provisioned.*device provision"):
        device.start("neon", provision_first=False)
