"""The C library (``compile --emit c``, ``tvm_armq/clib``): built for a level, linked into
the C example (``examples/c``, with its Makefile), run under ``qemu-aarch64`` directly (no
guest Python, no TVM runtime) on a CPU of each level, and compared with TFLite's reference
kernels, bit-exact; a portable library at each level's CPU chooses that level; the shared
library needs libc alone; bad calls return their error codes.

The fast tier builds MobileNetV1 0.25 at every level and portable, and the model of two
inputs and two outputs at one level; the exhaustive tier every small zoo net at every
level and portable, and MobileNetV2 1.0 (a big one) at every level.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from armq_checks import assert_exact, tier
from test_models import BIG_NETS, EXHAUSTIVE_ONLY_NETS, NETS

from tvm_armq import build, clib, device, zoo
from tvm_armq.frontend.model import TFLiteModel
from tvm_armq.targets import LEVELS, PORTABLE

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "c"
BAD_CALLS = Path(__file__).with_name("clib_bad_calls.c")
BUILDS = (*LEVELS, PORTABLE)
SMALL_NETS = [n for n in NETS if n not in BIG_NETS and n not in EXHAUSTIVE_ONLY_NETS]
BIG_NET = "mobilenet_v2_1.0"
FAST = {("mobilenet_v1_0.25", b) for b in BUILDS} | {("two_in_two_out", "dotprod")}
CASES = ([(n, b) for n in SMALL_NETS for b in BUILDS]
         + [(BIG_NET, level) for level in LEVELS])
SEEDS = (0, 1)


def qemu(program: Path, *args, cpu_level: str, env: dict | None = None):
    """``program`` run under qemu-aarch64 on a CPU of ``cpu_level``, the sysroot's libc."""
    run_env = {k: v for k, v in os.environ.items() if k != "TVM_ARMQ_ISA"}
    run_env.update(env or {})
    return subprocess.run([device._qemu_static(), "-L", str(device.sysroot()), "-cpu",
                           LEVELS[cpu_level].qemu_cpu, str(program), *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=run_env)


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """``libraries(name, build)`` -> the written library's directory, with the example
    built in it (``run_model``), made once per module."""
    made: dict = {}

    def get(name: str, level: str) -> Path:
        if (name, level) not in made:
            out = tmp_path_factory.mktemp(f"clib-{name}-{level}")
            model = TFLiteModel.load(zoo.build(name))
            clib.write(build.compile_tflite(model, level, emit="c"), out)
            res = subprocess.run(["make", "-s", "-C", str(EXAMPLE), f"MODEL_DIR={out}"],
                                 capture_output=True, text=True)
            assert res.returncode == 0, res.stdout + res.stderr
            made[name, level] = out
        return made[name, level]

    return get


def run_example(lib: Path, model: TFLiteModel, inputs: list, cpu_level: str,
                env: dict | None = None) -> tuple[list, str]:
    """The example's outputs on ``inputs`` (as arrays of TFLite's outputs' shapes) and the
    level it reports."""
    src, dst = lib / "in.bin", lib / "out.bin"
    src.write_bytes(b"".join(np.ascontiguousarray(x).tobytes() for x in inputs))
    dst.unlink(missing_ok=True)
    res = qemu(lib / "run_model", src, dst, cpu_level=cpu_level, env=env)
    assert res.returncode == 0, res.stderr
    raw, at, outs = dst.read_bytes(), 0, []
    for t in model.signature()[1]:
        outs.append(np.frombuffer(raw[at:at + t.nbytes], t.dtype).reshape(t.shape))
        at += t.nbytes
    assert at == len(raw), f"{len(raw)} bytes written, the outputs take {at}"
    (level,) = re.findall(r"ran at level (\w+)", res.stderr)
    return outs, level


@pytest.mark.device
@pytest.mark.parametrize("name, build_for", [
    tier(n, b, id=f"{b}-{n}", fast=(n, b) in FAST) for n, b in CASES])
def test_example_runs_the_c_library_bit_exact(libraries, name, build_for):
    """The example linked with the model's static library, at the level's CPU (a portable
    build at each level's: it must choose that level), bit-exact on two inputs."""
    lib = libraries(name, build_for)
    model = TFLiteModel.load(zoo.build(name))
    cpus = LEVELS if build_for == PORTABLE else (build_for,)
    for cpu in cpus:
        for seed in SEEDS:
            inputs = model.random_inputs(seed)
            got, level = run_example(lib, model, inputs, cpu)
            assert level == cpu, f"{name} ({build_for}) ran at {level} on a {cpu} CPU"
            assert_exact(got, model.reference_outputs(inputs),
                         f"{name} ({build_for} C library) on {cpu}, seed {seed}")


GLIBC_SYMBOL = re.compile(r"^\s+U (\w+)@GLIBC_[\d.]+$")


@pytest.mark.device
def test_shared_library_needs_libc_alone(libraries):
    """``nm -D --undefined-only``: every symbol the .so needs is libc's (versioned
    GLIBC_*), none weak or unversioned; its one NEEDED library is libc; it exports the API
    and nothing else. The static library needs no other symbol than those."""
    lib = libraries("mobilenet_v1_0.25", PORTABLE)
    nm = "aarch64-linux-gnu-nm"
    lines = subprocess.run([nm, "-D", "--undefined-only", lib / "libmodel.so"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines and all(GLIBC_SYMBOL.match(ln) for ln in lines), lines
    libc = {GLIBC_SYMBOL.match(ln).group(1) for ln in lines}
    dynamic = subprocess.run(["aarch64-linux-gnu-readelf", "-d", lib / "libmodel.so"],
                             capture_output=True, text=True, check=True).stdout
    assert re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic) == ["libc.so.6"]
    defined = subprocess.run([nm, "-D", "--defined-only", lib / "libmodel.so"],
                             capture_output=True, text=True, check=True).stdout.split()[2::3]
    assert sorted(defined) == sorted(f"model_{f}" for f in clib.API)
    static = subprocess.run([nm, "--undefined-only", lib / "libmodel.a"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert {s for s in static if s != "U" and not s.endswith(":")} <= libc


@pytest.mark.device
def test_bad_calls_return_their_error_codes(libraries, tmp_path):
    """Null pointers, a small or misaligned arena, misaligned tensors, a context never set
    up or released: each call returns its error code, never crashes; a good run after them,
    on the caller's arena and on the library's, gives the same outputs."""
    lib = libraries("mobilenet_v1_0.25", "dotprod")
    program = tmp_path / "bad_calls"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-Wall", "-Werror", "-std=c11",
                    f"-I{lib}", "-o", program, BAD_CALLS, lib / "libmodel.a"], check=True)
    res = qemu(program, cpu_level="dotprod")
    assert res.returncode == 0, res.stdout + res.stderr
    said = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    code = {name: str(i) for i, name in enumerate(clib.ERRORS)}
    want = {"init_null_ctx": code["ERROR_NULL_ARGUMENT"],
            "init_null_arena_with_bytes": code["ERROR_NULL_ARGUMENT"],
            "init_small_arena": code["ERROR_ARENA_TOO_SMALL"],
            "init_misaligned_arena": code["ERROR_ALIGNMENT"],
            "last_error_after_failed_init": "the arena is not aligned",
            "run_uninitialized": code["ERROR_NOT_INITIALIZED"],
            "run_null_ctx": code["ERROR_NULL_ARGUMENT"],
            "init_caller_arena": code["OK"],
            "run_null_input": code["ERROR_NULL_ARGUMENT"],
            "run_null_output": code["ERROR_NULL_ARGUMENT"],
            "run_misaligned_input": code["ERROR_ALIGNMENT"],
            "run_misaligned_output": code["ERROR_ALIGNMENT"],
            "run_arrays_null": code["ERROR_NULL_ARGUMENT"],
            "run_caller_arena": code["OK"], "run_caller_arena_again": code["OK"],
            "same_output": "1", "run_after_release": code["ERROR_NOT_INITIALIZED"],
            "init_library_arena": code["OK"], "run_library_arena": code["OK"],
            "same_output_library_arena": "1", "error_name_unknown": "unknown error code",
            "last_error_null": "no context", "input_out_of_range": "1",
            "output_negative": "1", "done": "0"}
    assert said == want


@pytest.mark.device
def test_a_cpu_without_the_level_is_refused_not_run(libraries):
    """A dotprod library on a neon CPU: init says so (no SIGILL); a portable one capped by
    TVM_ARMQ_ISA runs at the cap, and a cap above the CPU is refused."""
    model = TFLiteModel.load(zoo.build("mobilenet_v1_0.25"))
    inputs = model.random_inputs(0)
    lib = libraries("mobilenet_v1_0.25", "dotprod")
    (lib / "in.bin").write_bytes(b"".join(x.tobytes() for x in inputs))
    res = qemu(lib / "run_model", lib / "in.bin", lib / "out.bin", cpu_level="neon")
    assert res.returncode == 1 and "built for dotprod" in res.stderr and \
        "runs neon at most" in res.stderr, res.stderr
    portable = libraries("mobilenet_v1_0.25", PORTABLE)
    got, level = run_example(portable, model, inputs, "i8mm", env={"TVM_ARMQ_ISA": "neon"})
    assert level == "neon"
    assert_exact(got, model.reference_outputs(inputs), "portable capped at neon")
    (portable / "in.bin").write_bytes(b"".join(x.tobytes() for x in inputs))
    res = qemu(portable / "run_model", portable / "in.bin", portable / "out.bin",
               cpu_level="neon", env={"TVM_ARMQ_ISA": "i8mm"})
    assert res.returncode == 1 and "TVM_ARMQ_ISA" in res.stderr, res.stderr


@pytest.mark.device
def test_header_describes_the_tensors_and_the_arena(libraries):
    """The header's constants are the model's: each tensor's bytes, shape, scale and zero
    point as TFLite declares them; the arena the one the library was built with."""
    lib = libraries("two_in_two_out", "dotprod")
    header = (lib / "model.h").read_text()
    model = TFLiteModel.load(zoo.build("two_in_two_out"))
    details = model._interpreter(reference_kernels=True)
    for kind, tensors in (("INPUT", details.get_input_details()),
                          ("OUTPUT", details.get_output_details())):
        assert f"#define MODEL_NUM_{kind}S {len(tensors)}" in header
        for i, d in enumerate(tensors):
            shape = ", ".join(str(int(s)) for s in d["shape"])
            assert f"#define MODEL_{kind}{i}_SHAPE {{{shape}}}" in header
            assert f"#define MODEL_{kind}{i}_BYTES {int(np.prod(d['shape']))}u" in header
            assert f"#define MODEL_{kind}{i}_ZERO_POINT ({d['quantization'][1]})" in header
            assert f"#define MODEL_{kind}{i}_SCALE {float(d['quantization'][0])!r}f" in header
    arena = int(re.search(r"#define MODEL_ARENA_BYTES (\d+)u", header).group(1))
    assert arena > 0 and '#define MODEL_ISA "dotprod"' in header


def test_what_a_c_library_cannot_be_is_refused():
    """More than one thread, or a target of stock TVM's, is a clear error before anything
    is built."""
    model = zoo.build("two_in_two_out")
    with pytest.raises(build.UnsupportedTarget, match="single-threaded"):
        build.compile_tflite(model, "dotprod", emit="c", threads=2)
    with pytest.raises(build.UnsupportedTarget, match="not an aarch64 LLVM target"):
        build.compile_tflite(model, "llvm", emit="c")
    with pytest.raises(ValueError, match="emit 'wasm'"):
        build.compile_tflite(model, "dotprod", emit="wasm")


def test_cli_emit_c_writes_the_library_and_names_what_it_cannot_do(tmp_path):
    """``compile --emit c -o DIR --name NAME`` writes NAME.h, libNAME.a and libNAME.so and
    says so in one line; an -o that is a file, --name without --emit c and more than one
    thread are one error line each, with their exit status."""
    import sys

    def tvm_armq(*args):
        return subprocess.run([sys.executable, "-m", "tvm_armq", *map(str, args)],
                              capture_output=True, text=True, timeout=900)

    model = zoo.build("two_in_two_out")
    res = tvm_armq("compile", model, "--isa", "neon", "--emit", "c", "-o", tmp_path / "out",
                   "--name", "net")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert res.stdout.startswith(f"wrote {tmp_path / 'out' / 'net.h'}, libnet.a ("), res.stdout
    assert "ISA level neon, one thread; arena " in res.stdout
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"net.h", "libnet.a", "libnet.so"}
    assert "int net_run(net_ctx *ctx," in (tmp_path / "out" / "net.h").read_text()
    (tmp_path / "file").write_text("not a directory")
    for args, code, says in (
            (["-o", tmp_path / "file"], 8, "--emit c writes a directory"),
            (["--threads", "2"], 5, "single-threaded"),
            (["--name", "9lives"], 8, "a C identifier is needed")):
        res = tvm_armq("compile", model, "--isa", "neon", "--emit", "c", *args)
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("tvm-armq: error: ")]
        assert res.returncode == code and len(errors) == 1 and says in errors[0], res.stderr
        assert "Traceback" not in res.stderr
    res = tvm_armq("compile", model, "--isa", "neon", "--name", "net", "-o", tmp_path / "x.so")
    assert res.returncode == 2 and "goes with --emit c" in res.stderr, res.stderr
