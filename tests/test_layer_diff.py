"""``tvm-armq diff``: every layer's output against TFLite's, in graph order.

On a net whose every layer runs a tvm_armq kernel (the inception-style block: convolutions,
an average pool, a concatenation, a mean, a dense layer) every layer equals TFLite's and
the command exits 0. Compiled with stock TVM's float path (``--stock``) the same net
drifts: the command names the first operator that differs, its op and by how much, with
the exit status of differing outputs, and the layers before it are listed as equal.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tvm_armq import cli

pytestmark = pytest.mark.device

DIFFER = next(code for code, names in cli.EXIT_CODES if "tvm_armq.cli:OutputsDiffer" in names)
LINE = re.compile(r"^op +(\d+) (\w+) +\(.*\) +(\S+.*?) +(equal|DIFFERS by up to (\d+) in "
                  r"(\d+)/(\d+))$")


def diff(*args):
    res = subprocess.run([sys.executable, "-m", "tvm_armq", "diff", *map(str, args)],
                         capture_output=True, text=True, timeout=900)
    layers = [LINE.match(line) for line in res.stdout.splitlines() if line.startswith("op ")]
    assert layers and all(layers), res.stdout
    return res, layers


def test_every_layer_of_an_integer_net_equals_tflite(devices, zoo_model):
    devices.endpoint("neon")  # started and recorded: the command finds and reuses it
    res, layers = diff(zoo_model("inception_block"), "--isa", "neon")
    assert res.returncode == 0, res.stderr
    assert [int(m.group(1)) for m in layers] == sorted(int(m.group(1)) for m in layers)
    assert {m.group(4) for m in layers} == {"equal"}
    kernels = {m.group(3) for m in layers}
    assert "gemm_s8s8s32_4x4x16_neon" in kernels and "concat_s8_neon" in kernels, kernels
    assert f"every one of the {len(layers)} layers equals" in res.stdout


def test_the_first_layer_that_drifts_is_named(devices, zoo_model):
    devices.endpoint("neon")
    res, layers = diff(zoo_model("inception_block"), "--isa", "neon", "--stock")
    assert res.returncode == DIFFER, res.stderr
    first = next(m for m in layers if m.group(4) != "equal")
    assert all(m.group(4) == "equal" for m in layers[:layers.index(first)])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert (f"the first layer that differs from TFLite is operator {first.group(1)} "
            f"{first.group(2)} (stock TVM): by up to {first.group(5)} in {first.group(6)} "
            f"of {first.group(7)}") in lines[0]
