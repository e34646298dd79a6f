"""The README's examples run as written.

Every fenced ```python and ```sh block of README.md is executed, in a fresh folder that
holds the bundled model as ``model.tflite`` (the name the examples use): the Python block
in a new interpreter, each line of a shell block as a command. The two set-up commands
(indented, not fenced) are what CI runs itself; the tuning commands take a board.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from armq_checks import assert_run_exact

from tvm_armq import cli

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


@pytest.fixture
def folder(tmp_path):
    shutil.copy(cli.BUNDLED_MODEL, tmp_path / "model.tflite")
    return tmp_path


def test_the_readme_has_examples():
    assert len(blocks("python")) == 1 and len(blocks("sh")) == 1


@pytest.mark.device
def test_python_example(folder):
    (code,) = blocks("python")
    res = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True,
                         text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "0", lines[-5:]  # bit-exact against TFLite, as the comment says
    assert any("gemm_s8s8s32" in ln for ln in lines[:-1])  # inspect's per-layer lines
    assert (folder / "model.so").read_bytes()[:4] == b"\x7fELF"


@pytest.mark.device
def test_command_line_example(folder):
    (script,) = blocks("sh")
    model = (folder / "model.tflite").read_bytes()
    outputs = []
    # `run` reuses a running i8mm device or starts one for itself and stops it after
    for line in filter(None, map(str.strip, script.splitlines())):
        argv = line.split()
        assert argv[:3] == ["python", "-m", "tvm_armq"], line
        res = subprocess.run([sys.executable, *argv[1:]], cwd=folder, capture_output=True,
                             text=True, timeout=1800)
        assert res.returncode == 0, (line, res.stderr[-3000:])
        assert "Traceback" not in res.stderr
        outputs.append(res.stdout)
    compiled, inspected, ran, status = outputs
    assert compiled.startswith("wrote model.so (aarch64, ISA level i8mm)")
    assert "quantized layers on tvm_armq kernels" in inspected
    assert_run_exact(ran, 1, "the README's run")
    assert "i8mm:" in status
    assert (folder / "model.tflite").read_bytes() == model


def _declarations(text: str) -> set[str]:
    """The ``#define`` lines and function prototypes of C text, comments dropped and
    whitespace made single spaces."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    found = {" ".join(ln.split()) for ln in text.splitlines() if ln.startswith("#define")}
    for proto in re.findall(r"^[a-z][\w \*]*\w+\([^;{]*\);", text, re.M | re.S):
        found.add(" ".join(proto.split()).replace("( ", "(").replace(" )", ")"))
    return found


def test_c_header_excerpt_is_the_bundled_models(tmp_path):
    """The README's excerpt of ``model.h`` is what ``compile --emit c`` writes for the
    bundled model at dotprod, as its command says: each constant and prototype it shows."""
    from tvm_armq import build, clib

    (excerpt,) = blocks("c")
    lib = clib.write(build.compile_tflite(cli.BUNDLED_MODEL, "dotprod", emit="c"), tmp_path)
    shown, header = _declarations(excerpt), _declarations(lib.header.read_text())
    assert len(shown) >= 10 and shown <= header, sorted(shown - header)
