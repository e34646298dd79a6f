"""Every way a user's command can fail ends in one ``tvm-armq: error:`` line, the exit status
of its class (``cli.EXIT_CODES``) and no traceback; the files it was given are unchanged.

Each case runs the real command line in a subprocess (and, where there is one, the Python
API call behind it). Models are written here with ``frontend.writer`` (one FULLY_CONNECTED
layer in int8, int16x8 and float32), so no case needs TensorFlow. Cases that need a device
(a crash from the wrong ISA level, outputs that differ, tuning) are marked ``device``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tvm_armq import cli, device, tuning
from tvm_armq.frontend import importer

# Exit statuses, as cli.EXIT_CODES assigns them.
USAGE, MODEL, UNSUPPORTED, TARGET, DEVICE, DATABASE, OUTPUT, DIFFER, TRIALS_FAILED = range(2, 11)
# A hung endpoint's test waits --timeout HUNG_TIMEOUT; the command may take this much longer
# to start Python, import TVM and report (the CI machine is slow and busy).
HUNG_TIMEOUT = 3
STARTUP_SLACK = 45


def tvm_armq(*args, cwd=None, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "tvm_armq", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def error_of(res, code: int, *says: str) -> str:
    """The command failed with ``code``, one error line that contains every ``says``, and
    no traceback; returns that line."""
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("tvm-armq: error: ")]
    assert len(errors) == 1, res.stderr[-3000:]
    for text in says:
        assert text in errors[0], errors[0]
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    return errors[0]


def digest(*paths) -> list[str]:
    """Content hashes of files (recursively for directories), to prove they did not change."""
    out = []
    for p in map(Path, paths):
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        out += [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    return out


# ------------------------------------------------------------------ models
def fully_connected(act: str, k: int = 16, n: int = 8, rows: int = 1) -> bytes:
    """A one-layer model: FULLY_CONNECTED of a rows x k input to n outputs, in ``act``
    (int8 or int16 activations with int8 weights, or float32 throughout)."""
    import tflite

    from tvm_armq.frontend.writer import single_op_model

    rng = np.random.default_rng(0)
    quantized = act != "float32"
    if quantized:
        w = rng.integers(-127, 127, (n, k), endpoint=True).astype(np.int8)
        b = np.zeros(n, np.int64 if act == "int16" else np.int32)
    else:
        w = rng.standard_normal((n, k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
    q = (lambda scale: (scale, 0)) if quantized else (lambda scale: None)
    tensors = [dict(shape=(rows, k), dtype=act, q=q(0.05)),
               dict(shape=(n, k), dtype=w.dtype.name, q=q(0.01), data=w),
               dict(shape=(n,), dtype=b.dtype.name, q=q(0.0005), data=b),
               dict(shape=(rows, n), dtype=act, q=q(0.1))]

    def options(builder):
        tflite.FullyConnectedOptionsStart(builder)
        return tflite.FullyConnectedOptionsEnd(builder)

    return single_op_model(tflite.BuiltinOperator.FULLY_CONNECTED, tensors, [0, 1, 2], [3],
                           (tflite.BuiltinOptions.FullyConnectedOptions, options))


def dynamic_range_rnn(units: int = 4, size: int = 8) -> bytes:
    """An RNN of TFLite's dynamic-range quantization (float32 input, state and output;
    int8 input and recurrent weights with their scales): an op tvm_armq has no hybrid
    kernel for."""
    import tflite

    from tvm_armq.frontend.writer import options, single_op_model

    rng = np.random.default_rng(0)
    tensors = [dict(shape=(1, size), dtype="float32"),
               dict(shape=(units, size), dtype="int8", q=(0.01, 0),
                    data=rng.integers(-127, 127, (units, size), endpoint=True).astype(np.int8)),
               dict(shape=(units, units), dtype="int8", q=(0.01, 0),
                    data=rng.integers(-127, 127, (units, units), endpoint=True).astype(np.int8)),
               dict(shape=(units,), dtype="float32", data=np.zeros(units, np.float32)),
               dict(shape=(1, units), dtype="float32"),
               dict(shape=(1, units), dtype="float32")]
    return single_op_model(tflite.BuiltinOperator.RNN, tensors, [0, 1, 2, 3, 4], [5],
                           options("RNNOptions", FusedActivationFunction=0))


def float_tanh(n: int = 1024) -> bytes:
    """A float32 TANH of n values. TVM computes tanh with its own formula, TFLite's
    reference kernel with std::tanh: on a full vector some results differ in the last bit."""
    import tflite

    from tvm_armq.frontend.writer import single_op_model

    tensors = [dict(shape=(1, n), dtype="float32"), dict(shape=(1, n), dtype="float32")]
    return single_op_model(tflite.BuiltinOperator.TANH, tensors, [0], [1], None, version=1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> path: int8, int16 (16x8), float, truncated and flipped (the bundled model
    cut short, the int8 model with its root table offset flipped), a float tanh."""
    folder = tmp_path_factory.mktemp("models")
    int8 = fully_connected("int8")
    files = {"int8": int8, "int16": fully_connected("int16"),
             # four rows: a GEMM that runs smmla at i8mm (one row runs sdot there)
             "int8_rows": fully_connected("int8", rows=4),
             "float": fully_connected("float32"),
             "dynamic_range": dynamic_range_rnn(),
             "tanh": float_tanh(),
             "truncated": cli.BUNDLED_MODEL.read_bytes()[:480184],
             "flipped": bytes([int8[0] ^ 0xFF]) + int8[1:]}
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.tflite"
        paths[name].write_bytes(data)
    return paths


# ------------------------------------------------------------------ bad model files
@pytest.mark.parametrize("kind", ["truncated", "flipped"])
@pytest.mark.parametrize("command", ["compile", "inspect", "run", "tune"])

def test_corrupt_model_is_rejected_by_tflites_verifier(models, kind, command, tmp_path):
    before = digest(models[kind])
    extra = {"compile": ["-o", tmp_path / "m.so"], "tune": ["--work-dir", tmp_path / "w"]}
    res = tvm_armq(command, models[kind], *extra.get(command, []), "--isa", "neon")
    error_of(res, MODEL, str(models[kind]), "TFLite's flatbuffer verifier rejects it",
             "not a valid Flatbuffer")
    assert digest(models[kind]) == before and not (tmp_path / "m.so").exists()


def test_corrupt_model_in_python():
    import tvm_armq
    from tvm_armq.frontend.model import ModelError

    with pytest.raises(ModelError, match="flatbuffer verifier rejects it"):
        tvm_armq.compile_tflite(cli.BUNDLED_MODEL.read_bytes()[:1000], "neon")


def test_debug_shows_the_traceback(models, tmp_path):
    res = tvm_armq("compile", models["truncated"], "-o", tmp_path / "m.so", "--debug")
    assert res.returncode == MODEL
    assert "Traceback" in res.stderr and "ModelError" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("tvm-armq: error: ")


# ------------------------------------------------------------------ unsupported models
@pytest.mark.parametrize("command", ["compile", "inspect"])
def test_int16x8_model_names_the_tensor_and_dtype(models, command, tmp_path):
    before = digest(models["int16"])
    res = tvm_armq(command, models["int16"], *(["-o", tmp_path / "m.so"]
                                               if command == "compile" else []))
    error_of(res, UNSUPPORTED, str(models["int16"]), "tensor 0", "int16 (16x8 quantization",
             "int8 quantization")
    assert digest(models["int16"]) == before


@pytest.mark.parametrize("command", ["compile", "inspect"])
def test_dynamic_range_model_names_the_operator(models, command, tmp_path):
    """float32 activations with int8 weights on an op without a hybrid kernel: refused
    before TVM's frontend, naming the operator, the ops that have one and how to convert
    the model instead (never a traceback)."""
    res = tvm_armq(command, models["dynamic_range"], *(["-o", tmp_path / "m.so"]
                                                       if command == "compile" else []))
    error_of(res, UNSUPPORTED, str(models["dynamic_range"]), "operator 0 (RNN)",
             "dynamic-range quantized",
             "FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D and BATCH_MATMUL",
             "representative dataset")
    assert not (tmp_path / "m.so").exists()


def test_model_tflite_itself_cannot_load(tmp_path):
    """A CUSTOM operator (no custom code): well-formed, but TFLite has no kernel for it."""
    import tflite

    from tvm_armq.frontend.writer import single_op_model

    model = tmp_path / "custom.tflite"
    model.write_bytes(single_op_model(
        tflite.BuiltinOperator.CUSTOM, [dict(shape=(1, 4), dtype="float32")] * 2, [0], [1]))
    res = tvm_armq("compile", model, "-o", tmp_path / "m.so")
    error_of(res, UNSUPPORTED, str(model), "TFLite cannot load it", "CUSTOM")


def test_int16x8_model_in_python(models):
    import tvm_armq

    with pytest.raises(importer.UnsupportedModel, match="is int16"):
        tvm_armq.compile_tflite(models["int16"], "i8mm")


def test_strict_refuses_a_model_with_no_quantized_layer(models, tmp_path):
    res = tvm_armq("compile", models["float"], "--strict", "-o", tmp_path / "m.so")
    error_of(res, UNSUPPORTED, "strict", str(models["float"]), "has no quantized layer")
    assert not (tmp_path / "m.so").exists()
    # without --strict the float model compiles (stock TVM float code)
    res = tvm_armq("compile", models["float"], "-o", tmp_path / "m.so")
    assert res.returncode == 0, res.stderr
    assert "0 of 0 quantized layers" in res.stdout


def test_strict_refuses_a_target_tvm_armq_does_not_compile_for(models):
    import tvm
    import tvm_armq
    from tvm_armq import build

    with pytest.raises(build.UnsupportedTarget, match="strict: llvm .* not a target tvm_armq"):
        tvm_armq.compile_tflite(models["int8"], "llvm", strict=True)
    with pytest.raises(tvm.error.OpNotImplemented, match="no quantized layer"):
        tvm_armq.compile_tflite(models["float"], "i8mm", strict=True)


def test_bf16_on_neon_says_which_feature_and_level(models, tmp_path):
    res = tvm_armq("compile", models["float"], "--precision", "bf16", "--isa", "neon",
                   "-o", tmp_path / "m.so")
    line = error_of(res, TARGET, "bf16 extension (+bf16)", "cortex-a72", "--isa i8mm")
    assert "{" not in line  # no JSON dump of the target


def test_an_unexpected_exception_is_an_internal_error(monkeypatch, capsys):
    """A bug (an exception no EXIT_CODES row claims) is exit 1, one line that says to rerun
    with --debug, and --debug prints its traceback."""
    def broken(a):
        raise KeyError("some_internal_table")

    monkeypatch.setattr(cli, "cmd_inspect", broken)
    assert cli.main(["inspect", str(cli.BUNDLED_MODEL)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["tvm-armq: error: internal error (KeyError: "
                                "'some_internal_table'); rerun with --debug for the traceback "
                                "and report it"]
    assert cli.main(["inspect", str(cli.BUNDLED_MODEL), "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_exit_codes_are_distinct_and_documented():
    codes = [code for code, _ in cli.EXIT_CODES]
    assert len(codes) == len(set(codes)) and 0 not in codes and cli.EXIT_INTERNAL not in codes
    for code in codes + [cli.EXIT_INTERNAL, cli.EXIT_INTERRUPTED]:
        assert re.search(rf"^    {code} +\S", cli.__doc__, re.M), code  # the docstring table
        readme = (Path(cli.__file__).resolve().parents[1] / "README.md").read_text()
        assert f"\n| {code} | " in readme, code  # the README's table


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("args, says", [
    (["run", "--seed", "-1"], "--seed: -1 is negative"),
    (["run", "--timeout", "0"], "positive number of seconds"),
    (["run", "--device", "host:port"], "HOST:PORT"),
])
def test_bad_arguments_exit_2(args, says):
    error_of(tvm_armq(*args), USAGE, says)


# ------------------------------------------------------------------ -o
def test_output_never_overwrites_the_model(models, tmp_path):
    model = tmp_path / "m.tflite"
    shutil.copy(models["int8"], model)
    before = digest(model)
    res = tvm_armq("compile", model, "--isa", "neon", "-o", model)
    error_of(res, OUTPUT, "is the input", "choose another -o")
    res = tvm_armq("compile", model, "--isa", "neon", "-o", model, "--force")
    error_of(res, OUTPUT, "is the input")  # --force does not make destroying it right
    assert digest(model) == before


def test_output_refuses_a_directory_and_a_file_that_is_not_a_module(models, tmp_path):
    error_of(tvm_armq("compile", models["int8"], "-o", tmp_path), OUTPUT, "is a directory")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    res = tvm_armq("compile", models["int8"], "--isa", "neon", "-o", notes)
    error_of(res, OUTPUT, "exists and is not a compiled module", "--force")
    assert notes.read_text() == "mine\n"
    program = tmp_path / "python"  # an ELF, but a host program, not a compiled module
    shutil.copy(os.path.realpath(sys.executable), program)
    before = digest(program)
    res = tvm_armq("compile", models["int8"], "--isa", "neon", "-o", program)
    error_of(res, OUTPUT, "exists and is not a compiled module (not an aarch64 shared")
    assert digest(program) == before
    res = tvm_armq("compile", models["int8"], "--isa", "neon", "-o", notes, "--force")
    assert res.returncode == 0, res.stderr
    assert notes.read_bytes()[:4] == b"\x7fELF"
    # a compiled module is replaced without --force: that is what rebuilding means
    res = tvm_armq("compile", models["int8"], "--isa", "dotprod", "-o", notes)
    assert res.returncode == 0, res.stderr


def test_output_that_cannot_be_written(models, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = tvm_armq("compile", models["int8"], "--isa", "neon", "-o", blocker / "m.so")
    error_of(res, OUTPUT, f"cannot write {blocker / 'm.so'}", f"{blocker} is a file")
    assert blocker.read_text() == "x"


def test_tune_work_dir_that_cannot_be_made(models, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = tvm_armq("tune", models["int8"], "--work-dir", blocker / "w")
    error_of(res, OUTPUT, f"--work-dir {blocker / 'w'}: cannot create it")
    assert blocker.read_text() == "x"


def test_default_output_is_the_current_directory(models, tmp_path):
    before = sorted(p.name for p in models["int8"].parent.iterdir())
    res = tvm_armq("compile", models["int8"], "--isa", "neon", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "int8.so").read_bytes()[:4] == b"\x7fELF"
    assert sorted(p.name for p in models["int8"].parent.iterdir()) == before


# ------------------------------------------------------------------ tuning databases
@pytest.mark.parametrize("command", ["compile", "inspect"])
def test_garbage_tuning_directory(models, command, tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    (db / tuning.SUMMARY_FILE).write_text("garbage")
    before = digest(db)
    res = tvm_armq(command, models["int8"], "--tuning", db,
                   *(["-o", tmp_path / "m.so"] if command == "compile" else []))
    error_of(res, DATABASE, str(db / tuning.SUMMARY_FILE), "not a tvm_armq tuning summary")
    assert digest(db) == before and not (tmp_path / "m.so").exists()


# ------------------------------------------------------------------ unreachable endpoints
@pytest.fixture
def closed_port():
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HungPort(int):
    """A port number that also knows the connections its server has taken so far."""

    def __new__(cls, port: int, accepted: list):
        self = super().__new__(cls, port)
        self.accepted = accepted
        return self


@pytest.fixture
def hung_port():
    """A loopback port that accepts connections and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield HungPort(server.getsockname()[1], held)
    stop.set()
    thread.join()
    for c in held:
        c.close()
    server.close()


@pytest.mark.parametrize("form", ["device", "tracker"])
def test_closed_port_names_the_endpoint(models, closed_port, form):
    where = f"127.0.0.1:{closed_port}" + (":board" if form == "tracker" else "")
    res = tvm_armq("run", models["int8"], "--device", where, "--timeout", HUNG_TIMEOUT)
    what = "device" if form == "device" else "RPC tracker"
    error_of(res, DEVICE, f"{what} 127.0.0.1:{closed_port}", "connection refused")


def test_unknown_host(models):
    res = tvm_armq("run", models["int8"], "--device", "no-such-host.invalid:9090")
    error_of(res, DEVICE, "no-such-host.invalid:9090", "unknown host")


def test_dead_tracker_fails_tune_at_once(models, closed_port, tmp_path):
    res = tvm_armq("tune", models["int8"], "--work-dir", tmp_path / "w",
                   "--rpc-tracker", f"127.0.0.1:{closed_port}", "--key", "board")
    error_of(res, DEVICE, f"RPC tracker 127.0.0.1:{closed_port}", "connection refused")


def test_tracker_without_the_key(models, tmp_path):
    with tuning._local_tracker(tmp_path) as (host, port):
        res = tvm_armq("tune", models["int8"], "--work-dir", tmp_path / "w",
                       "--rpc-tracker", f"{host}:{port}", "--key", "no-such-board")
    error_of(res, DEVICE, "no device is registered under key 'no-such-board'",
             f"{host}:{port}")


@pytest.mark.parametrize("args, says", [
    (["run", "--device", "127.0.0.1:{port}"], "did not complete the TVM RPC handshake"),
    (["run", "--device", "127.0.0.1:{port}:board"], "did not answer the tracker handshake"),
    (["tune", "--work-dir", "{tmp}/w", "--rpc-tracker", "127.0.0.1:{port}", "--key", "b"],
     "did not answer the tracker handshake"),
])
def test_hung_endpoint_ends_within_the_timeout(models, hung_port, tmp_path, args, says):
    """A socket that accepts and never answers: the command ends after --timeout."""
    args = [a.format(port=hung_port, tmp=tmp_path) for a in args]
    started = time.monotonic()
    res = tvm_armq(args[0], models["int8"], *args[1:], "--timeout", HUNG_TIMEOUT,
                   timeout=HUNG_TIMEOUT + STARTUP_SLACK)
    took = time.monotonic() - started
    error_of(res, DEVICE, f"127.0.0.1:{hung_port}", says, f"within {HUNG_TIMEOUT} s")
    assert HUNG_TIMEOUT <= took < HUNG_TIMEOUT + STARTUP_SLACK, took


@pytest.mark.parametrize("key", [None, "board"])
def test_hung_endpoint_in_python(hung_port, key):
    endpoint = device.Endpoint("127.0.0.1", int(hung_port), key)
    started = time.monotonic()
    with pytest.raises(device.DeviceUnreachable, match=f"127.0.0.1:{hung_port}.* within 3 s"):
        endpoint.connect(timeout=HUNG_TIMEOUT)
    assert time.monotonic() - started < HUNG_TIMEOUT + STARTUP_SLACK


def _as_in_a_terminal():
    """A terminal's foreground command starts with SIGINT at its default. A test run may
    not (a shell starts a background job with SIGINT ignored, and children inherit that;
    Python then never raises KeyboardInterrupt): give the command the terminal's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_and_130(models, hung_port):
    """Ctrl-C while the command waits for a device: no traceback, exit 130."""
    proc = subprocess.Popen([sys.executable, "-m", "tvm_armq", "run", str(models["int8"]),
                             "--device", f"127.0.0.1:{hung_port}", "--timeout", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_in_a_terminal)
    # the TCP probe, then TVM's handshake connection: the command is now waiting
    deadline = time.monotonic() + STARTUP_SLACK
    while len(hung_port.accepted) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(hung_port.accepted) >= 2, "the command never connected"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=STARTUP_SLACK)
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    error_of(res, 130, "tvm-armq: error: interrupted")


_STUCK_MAIN_THREAD = """
import signal, time
from tvm_armq import cli
cli.CTRL_C_GRACE = 1.0
cli._end_on_ctrl_c_even_if_blocked()
# Python's own Ctrl-C path does nothing here, as when the main thread is stuck in C++
signal.signal(signal.SIGINT, lambda *_: None)
print("ready", flush=True)
time.sleep(600)
"""


def test_ctrl_c_ends_the_command_even_if_its_main_thread_is_stuck():
    proc = subprocess.Popen([sys.executable, "-c", _STUCK_MAIN_THREAD], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=STARTUP_SLACK)
    assert (proc.returncode, err) == (130, "tvm-armq: error: interrupted\n"), (out, err)


# ------------------------------------------------------------------ device stop
def _record(run_dir: Path, proc: subprocess.Popen, started: float) -> Path:
    dev = device.Device("neon", device.Endpoint("127.0.0.1", 1), proc.pid,
                        run_dir / "neon.log", None, started)
    path = run_dir / f"neon-{proc.pid}.json"
    path.write_text(json.dumps(dev.to_json()))
    return path


@pytest.mark.parametrize("case", ["another program", "same script, later start"])
def test_device_stop_never_signals_a_reused_pid(tmp_path, case):
    """The run directory names a pid that is not (or no longer) the device: `device stop`
    leaves that process alone and drops the stale record."""
    import psutil

    argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    if case != "another program":  # looks like the device, but started at another time
        argv.append(f"/nowhere/{device.SERVER_SCRIPT}")
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        started = psutil.Process(proc.pid).create_time()
        record = _record(tmp_path, proc, started - 1000.0 if case != "another program"
                         else started)
        res = tvm_armq("device", "stop", "--isa", "neon",
                       env=dict(os.environ, TVM_ARMQ_RUN_DIR=str(tmp_path)))
        assert res.returncode == 0, res.stderr
        assert "neon: was not running" in res.stdout
        assert f"pid {proc.pid}" in res.stderr and "not signalled" in res.stderr
        assert proc.poll() is None, "the unrelated process must not have been signalled"
        assert not record.exists()
        # the Python API: a Device record of that pid does not signal it either
        device.Device("neon", device.Endpoint("127.0.0.1", 1), proc.pid, tmp_path / "x.log",
                      None, started - 1000.0).stop()
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


# ------------------------------------------------------------------ progress
@pytest.mark.device
def test_provisioning_shows_download_and_unpack_progress(tmp_path):
    """A fresh TVM_ARMQ_HOME: `device provision` fetches the sysroot's Debian packages and
    the aarch64 wheels again, and says so as it goes (apt's Get: lines, pip's progress,
    a count and size of what came, each file it unpacks)."""
    res = tvm_armq("device", "provision", env=dict(os.environ, TVM_ARMQ_HOME=str(tmp_path)))
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stderr
    assert "Get:1 " in log  # apt-get download, per package
    assert re.search(r"downloaded \d+ packages, \d+ MB", log), log[-3000:]
    assert re.search(r"unpacking 1/\d+: \S+\.deb", log)
    assert "Downloading apache_tvm-" in log and " MB" in log  # pip, per wheel
    assert re.search(r"downloaded \d+ wheels, \d+ MB", log)
    assert re.search(r"unpacking 1/\d+: apache_tvm-\S+\.whl \(\d+\.\d MB\)", log)
    assert f"provisioned in {tmp_path}" in res.stdout


# ------------------------------------------------------------------ on a device
@pytest.mark.device
@pytest.mark.parametrize("board, isa, lacks", [
    ("neon", "dotprod", "sdot (Armv8.2 +dotprod), which --isa dotprod"),
    ("neon", "i8mm", "sdot (Armv8.2 +dotprod) and smmla (Armv8.6 +i8mm), which --isa i8mm"),
    ("dotprod", "i8mm", "smmla (Armv8.6 +i8mm), which --isa i8mm"),
])
def test_code_of_a_higher_isa_level_on_a_lower_device(devices, models, board, isa, lacks):
    """Code with an instruction the board's CPU lacks: the session dies with SIGILL; the
    command probes the device and says what it lacks and which --isa to compile with."""
    endpoint = devices.endpoint(board)
    res = tvm_armq("run", models["int8_rows"], "--isa", isa, "--device", endpoint)
    error_of(res, DEVICE, f"the device at {endpoint} lacks {lacks}",
             f"compile with --isa {board}")
    res = tvm_armq("run", models["int8_rows"], "--isa", board, "--device", endpoint)
    assert res.returncode == 0, res.stderr  # the level it names works there, bit-exact


@pytest.mark.device
def test_session_timeout_ends_the_run(devices):
    """The device ends a session at --session-timeout (counted from the connection, so
    here within the bundled model's compile): the command says so and which option."""
    endpoint = devices.endpoint("neon")
    res = tvm_armq("run", "--isa", "neon", "--device", endpoint, "--session-timeout", 1)
    error_of(res, DEVICE, f"the session on {endpoint} reached --session-timeout (1 s",
             "give a longer --session-timeout")


@pytest.mark.device
def test_run_exits_9_when_outputs_differ_and_says_by_how_much(devices, models):
    """A float tanh: TVM's formula and TFLite's std::tanh differ in the last bit of some
    outputs, so the run is close to TFLite but not equal to it."""
    endpoint = devices.endpoint("neon")
    before = digest(models["tanh"])
    res = tvm_armq("run", models["tanh"], "--isa", "neon", "--device", endpoint)
    line = error_of(res, DIFFER, "outputs differ from TFLite's reference kernels by up to",
                    "tolerance 0", "output 0", "elements beyond it")
    worst = float(line.split("by up to ")[1].split()[0])
    assert 0 < worst < 1e-5, line
    assert f"max abs difference against TFLite: {worst:g}" in res.stdout
    res = tvm_armq("run", models["tanh"], "--isa", "neon", "--device", endpoint,
                   "--tolerance", "1e-5")
    assert res.returncode == 0, res.stderr
    assert digest(models["tanh"]) == before


@pytest.mark.device
def test_run_exits_9_when_an_output_is_missing(devices, monkeypatch, capsys):
    """A library that gives fewer outputs than TFLite's model fails ``run`` (exit 9), not
    a comparison of the outputs it has: two_in_two_out's device run, its last output
    dropped on the way back."""
    from tvm_armq import build, zoo

    endpoint = devices.endpoint("neon")
    call = build.DeviceModel.__call__
    monkeypatch.setattr(build.DeviceModel, "__call__", lambda self, x: call(self, x)[:-1])
    code = cli.main(["run", str(zoo.build("two_in_two_out")), "--isa", "neon",
                     "--device", f"{endpoint.host}:{endpoint.port}"])
    err = capsys.readouterr().err
    assert code == DIFFER, err
    assert "the compiled model gave 1 outputs, TFLite's has 2" in err, err


@pytest.mark.device
def test_tuning_failures_mismatched_database_and_per_trial_progress(models, tmp_path):
    """One tracker and one emulated neon board: a neon run measures every trial (and the
    bar advances per trial); a dotprod run on the same board fails every trial (SIGILL)
    and exits 10; the neon database given to a dotprod compile is reported, not ignored."""
    key = "armq-cli-errors"
    with tuning._local_tracker(tmp_path) as (host, port):
        board = tuning._start_emulated("neon", f"{host}:{port}", key)
        try:
            common = ["--rpc-tracker", f"{host}:{port}", "--key", key]
            neon_db = tmp_path / "neon-db"
            res = tvm_armq("tune", models["int8"], "--isa", "neon", "--trials", 2,
                           "--work-dir", neon_db, *common)
            assert res.returncode == 0, res.stderr[-3000:]
            assert "2 trials (0 failed)" in res.stdout
            bar = res.stderr.replace("\r", "\n")
            assert " 1/2 [" in bar and " 2/2 [" in bar, bar  # one step per measured trial
            res = tvm_armq("tune", models["int8"], "--isa", "dotprod", "--trials", 1,
                           "--work-dir", tmp_path / "dotprod-db", *common)
            error_of(res, TRIALS_FAILED, "all 1 trials failed", key,
                     str(tmp_path / "dotprod-db" / tuning.LOG_FILE))
        finally:
            board.stop()
    before = digest(neon_db)
    for command in ("compile", "inspect"):
        res = tvm_armq(command, models["int8"], "--isa", "dotprod", "--tuning", neon_db,
                       *(["-o", tmp_path / "m.so"] if command == "compile" else []))
        error_of(res, DATABASE, f"tuning database {neon_db} was tuned for", "cortex-a72",
                 "neoverse-n1", "compile with --isa neon")
    assert digest(neon_db) == before and not (tmp_path / "m.so").exists()
    from tvm_armq import build  # the Python API says the same

    with pytest.raises(build.TuningTargetMismatch, match="compile with --isa neon"):
        build.compile_tflite(models["int8"], "dotprod", tuning_database=neon_db)
    res = tvm_armq("compile", models["int8"], "--isa", "neon", "--tuning", neon_db,
                   "-o", tmp_path / "m.so")
    assert res.returncode == 0, res.stderr


def test_every_exit_code_names_a_class_that_exists():
    """``cli.EXIT_CODES`` names its exception classes as strings (the CLI imports TVM
    lazily): each must be a class in an importable module, or a moved class would fall
    through to exit status 1 unnoticed."""
    import importlib

    for code, names in cli.EXIT_CODES:
        for name in names:
            module, cls = name.split(":")
            found = getattr(importlib.import_module(module), cls, None)
            assert isinstance(found, type) and issubclass(found, BaseException), (code, name)
