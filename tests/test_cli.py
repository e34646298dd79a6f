"""``python -m tvm_armq``: one clear line and exit 2 for bad input; compile and run work."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from armq_checks import assert_run_exact

from tvm_armq import cli


def tvm_armq(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tvm_armq", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, says, code", [
    (["compile", "/no/such/model.tflite"], "no such file", 3),
    (["run", "/no/such/model.tflite", "--isa", "neon"], "no such file", 3),
    (["compile", __file__], "not a TFLite model", 3),
    (["compile", str(cli.BUNDLED_MODEL), "--isa", "sve2"], "unknown ISA level 'sve2'", 2),
    (["run", "--device", "nohost"], "HOST:PORT", 2),
    (["frobnicate"], "invalid choice", 2),
])
def test_bad_input_is_one_line_and_its_exit_code(args, says, code):
    """Bad arguments exit 2, a bad model file 3 (cli.EXIT_CODES; tests/test_cli_errors.py
    drives every other class)."""
    res = tvm_armq(*args)
    assert res.returncode == code
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tvm-armq: error: ") and says in lines[0], \
        res.stderr


def test_compile_writes_an_aarch64_library(tmp_path):
    out = tmp_path / "mobilenet.so"
    res = tvm_armq("compile", str(cli.BUNDLED_MODEL), "--isa", "neon", "-o", str(out))
    assert res.returncode == 0, res.stderr
    head = out.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 0xB7  # EM_AARCH64


@pytest.mark.device
def test_run_compares_with_tflite_on_the_device(devices):
    """The README's main command: the bundled MobileNetV1 0.25 compiled by tvm_armq's
    integer path (``compile_tflite``: every layer on a tvm_armq kernel) for i8mm, run on
    the emulated device, equals TFLite's reference kernels bit for bit, as the same model
    does in test_models (stock TVM's float path, test_baseline, is up to 24 steps off)."""
    devices.endpoint("i8mm")  # started and recorded: `run` finds and reuses it
    res = tvm_armq("run", "--isa", "i8mm")
    assert res.returncode == 0, res.stderr
    # what ran: no quantized layer left in float
    layers = re.search(r"^(\d+) of (\d+) quantized layers on tvm_armq kernels", res.stdout,
                       re.M)
    assert layers and int(layers[1]) == int(layers[2]) > 0, res.stdout
    assert_run_exact(res.stdout, 1, "run --isa i8mm of the bundled model")
