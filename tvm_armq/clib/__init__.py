"""The compiled model as a C library with no runtime: ``compile --emit c``.

Read this first. A model lowered by tvm_armq becomes one function, ``tvm_armq_model``
(``passes/call_sequence.py``): its kernels called directly, the tensors between them in
one arena, the weights one byte array. ``build`` compiles that function (and the kernels it
calls) for the target without the Relax VM around it; ``write`` makes of it, in a
directory:

    <name>.h       the C API: each input and output (shape, dtype, scale, zero point) as
                   constants, the arena's size, an error code per failure
                   (``header``), ``<name>_init`` / ``_run`` / ``_run_arrays`` /
                   ``_release`` / ``_error_name`` / ``_last_error`` / ``_level``
    lib<name>.a    for linking into a program
    lib<name>.so   the same, as a shared library; both need libc alone

Both libraries hold one relocatable object, linked from:

- the model's object file (TVM's LLVM code generator; a portable build adds one object
  per ISA level, ``portable.py``);
- the weights, an assembler ``.incbin`` of their bytes (``WEIGHTS_SYMBOL``);
- ``runtime.c``: what TVM's runtime would give the generated code (the workspace, the
  error sink) and the API, compiled with the model's description (``_description``);
- ``portable.SELECT_SOURCE``: the CPU's level, which ``<name>_init`` checks (and a
  portable build's layers dispatch on).

Every symbol of that object but the API's is made local (``objcopy
--keep-global-symbols``), so two models, or a model and TVM's own runtime, link into one
program.

The library runs on the caller's thread and starts none: it is compiled as
``compile --threads 1`` is (its kernels' parallel loops serial). A thread pool inside an
app's library would decide cores and lifetimes that belong to the app; several contexts
may run at once on threads of the caller's.

The arena: each function of the compiled code asks the workspace for blocks
(``TVMBackendAllocWorkspace``, a call TVM's ``LowerTVMBuiltin`` pass writes for every
buffer too big for the stack) and frees them last-in first-out. ``arena_bound`` reads
those calls in the lowered code: ``tvm_armq_model``'s blocks (the tensors between kernels)
plus the most any one kernel takes (a portable layer's dispatcher and the level function
it calls, both).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .. import portable
from ..passes import call_sequence
from ..targets import LEVELS

CROSS_CC = "aarch64-linux-gnu-gcc"
CROSS_TOOLS = ("ld", "objcopy", "ar", "nm")  # aarch64-linux-gnu-<tool>
RUNTIME_SOURCE = Path(__file__).with_name("runtime.c")
WEIGHTS_SYMBOL = "armq_weights"  # what runtime.c passes to tvm_armq_model as its weights
ENTRY = f"__tvm_ffi_{call_sequence.FUNC_NAME}"  # tvm_armq_model's packed entry
ALIGNMENT = call_sequence.ALIGN  # of the arena, the inputs and outputs, each block
MAX_RANK = 8  # a tensor's dimensions the header's tensor record holds
NESTING = 16  # workspace blocks live at once, at most (the context's stack of them)
# The API, by suffix: the functions the libraries export, as <name>_<suffix>
API = ("init", "release", "run", "run_arrays", "error_name", "last_error", "level", "input",
       "output")
# Error codes, in order from 0 (the header's enum; runtime.c names each)
ERRORS = ("OK", "ERROR_NULL_ARGUMENT", "ERROR_NOT_INITIALIZED", "ERROR_ARENA_TOO_SMALL",
          "ERROR_ALIGNMENT", "ERROR_OUT_OF_MEMORY", "ERROR_CPU", "ERROR_RUN")
# DLPack's (type code, bits) of the dtypes a model's inputs and outputs can have
DLPACK_DTYPE = {"int8": (0, 8), "uint8": (1, 8), "int16": (0, 16), "int32": (0, 32),
                "int64": (0, 64), "float32": (2, 32), "bool": (1, 8)}
C_TYPE = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t",
          "int64": "int64_t", "float32": "float", "bool": "uint8_t"}


class CLibraryError(RuntimeError):
    """The C library cannot be written: a tool is missing or failed, or a name is not a C
    identifier; the message says which."""


class NotOneFunction(ValueError):
    """The model cannot be one C function (a control flow, a symbolic shape, a tensor of
    no C form); the message says why."""


@dataclasses.dataclass
class CModel:
    """A model compiled for a C library (``build``), not yet written (``write``)."""

    label: str                 # the model, as the CLI names it
    level: str                 # the ISA level, or "portable"
    objects: list              # runtime modules of TVM's LLVM code, one per object file
    weights: np.ndarray        # the weights array, bytes
    arena_bytes: int           # what one run takes of the workspace, at most
    inputs: list               # frontend.model.TensorInfo, in the model's order
    outputs: list


@dataclasses.dataclass
class CLibrary:
    """What ``write`` wrote."""

    header: Path
    static: Path
    shared: Path
    model: CModel


# ------------------------------------------------------------------ build
def build(mod, target, variants, model) -> CModel:
    """``mod`` (lowered by ``build.lowered``, its parallel loops serial; ``variants`` its
    portable per-level functions, serial too, or None) compiled as one C-callable function
    for ``target``: the library's objects."""
    from tvm import relax

    from .. import build as build_mod

    try:
        mod = call_sequence.as_one_function(mod, target, required=True)
    except call_sequence.NotASequence as e:
        raise NotOneFunction(f"{model.label} cannot be one C function: {e}") from None
    model_blocks: list = []  # the lowered modules: the model's, each level's (portable)
    level_blocks: list = []
    with _recording(model_blocks):
        executable = relax.build(mod, target, relax_pipeline=build_mod.relax_pipeline(),
                                 exec_mode="bytecode")
    objects = list(executable.mod.imports)
    if variants is not None:
        with _recording(level_blocks):
            objects += [lib.mod for lib in map(variants.compile_level, variants.levels)
                        if lib is not None]
    level = "portable" if variants is not None else level_of(target)
    inputs, outputs = model.signature()
    return CModel(model.label, level, objects, call_sequence.weights_of(mod),
                  arena_bound(model_blocks, level_blocks), inputs, outputs)


def level_of(target) -> str:
    """The richest ISA level whose instructions ``target`` has (a core's level)."""
    from ..intrinsics.kernels import target_has

    if target_has(target, "has_matmul_i8"):
        return "i8mm"
    return "dotprod" if target_has(target, "has_dotprod") else "neon"


@contextlib.contextmanager
def _recording(into: list):
    """Within: every module as TVM's ``LowerTVMBuiltin`` leaves it, appended to ``into``
    (where the workspace calls are written, which ``arena_bound`` reads)."""
    import tvm

    @tvm.instrument.pass_instrument
    class Record:
        def run_after_pass(self, mod, info):
            if info.name.endswith("LowerTVMBuiltin"):
                into.append(mod)

    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(opt_level=current.opt_level, config=current.config,
                                   instruments=[Record()]):
        yield


def arena_bound(model_modules, level_modules=()) -> int:
    """The workspace one run takes at most: ``tvm_armq_model``'s blocks, plus the most any
    kernel's take, plus the most a portable level function's take (a dispatcher calls one),
    each block rounded up to ``ALIGNMENT`` as the allocator places them."""
    model, kernels = 0, [0]
    for name, nbytes in _workspace_bytes(model_modules):
        if name == call_sequence.FUNC_NAME:
            model += nbytes
        else:
            kernels.append(nbytes)
    levels = [0] + [nbytes for _, nbytes in _workspace_bytes(level_modules)]
    return model + max(kernels) + max(levels)


def _workspace_bytes(modules) -> list[tuple[str, int]]:
    """(name, the bytes its workspace blocks take) of every PrimFunc of ``modules``."""
    from tvm import tirx

    return [(gv.name_hint, sum(call_sequence.aligned(n)
                               for n in _workspace_blocks(gv.name_hint, func)))
            for mod in modules for gv, func in mod.functions.items()
            if isinstance(func, tirx.PrimFunc)]


def _workspace_blocks(name: str, func) -> list:
    """The byte counts of ``func``'s workspace calls; a size not known at compile time has
    no bound, which a C library cannot take."""
    import tvm_ffi
    from tvm import ir, tirx

    sizes: list = []

    def visit(node):
        if isinstance(node.op, ir.Op) and node.op.name == "tirx.TVMBackendAllocWorkspace":
            size = node.args[2]
            if not isinstance(size, tirx.IntImm):
                raise NotOneFunction(f"{name} asks the workspace for {size} bytes, a size only "
                                    "known at run time: a C library needs a bound")
            sizes.append(int(size.value))

    tvm_ffi.structural_walk(func.body, [(ir.Call, visit)])
    return sizes


# ------------------------------------------------------------------ write
def write(cmodel: CModel, out_dir, name: str = "model") -> CLibrary:
    """Write ``cmodel`` as ``<name>.h``, ``lib<name>.a`` and ``lib<name>.so`` in
    ``out_dir`` (made if need be), each replaced only when complete."""
    check_name(name)
    for t in cmodel.inputs + cmodel.outputs:
        if t.dtype not in DLPACK_DTYPE or len(t.shape) > MAX_RANK:
            raise NotOneFunction(f"{cmodel.label}: tensor {t.name!r} ({t.dtype}, rank "
                                f"{len(t.shape)}) has no C form here")
    tools = _tools()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tvm_armq_clib_") as tmp:
        work = Path(tmp)
        objects = []
        for i, lib in enumerate(cmodel.objects):
            path = work / f"model{i}.o"
            lib.write_to_file(str(path))
            objects.append(path)
        (work / "weights.bin").write_bytes(cmodel.weights.tobytes())
        (work / "weights.S").write_text(_weights_asm())
        header = header_text(cmodel, name)
        (work / f"{name}.h").write_text(header)
        (work / "desc.h").write_text(_description(cmodel, name))
        (work / "select.c").write_text(portable.SELECT_SOURCE)
        cc = [tools["gcc"], "-O2", "-fPIC", "-std=gnu11", "-Wall", "-Werror", "-c"]
        _run([*cc, "-o", work / "weights.o", work / "weights.S"], work)
        _run([*cc, "-o", work / "select.o", work / "select.c"], work)
        _run([*cc, f"-I{work}", "-DARMQ_DESC=\"desc.h\"", "-o", work / "runtime.o",
              RUNTIME_SOURCE], work)
        whole = work / f"{name}.o"
        _run([tools["ld"], "-r", "-o", whole, *objects, work / "weights.o",
              work / "select.o", work / "runtime.o"], work)
        keep = work / "api.txt"
        keep.write_text("".join(f"{name}_{f}\n" for f in API))
        _run([tools["objcopy"], f"--keep-global-symbols={keep}", whole], work)
        static, shared = work / f"lib{name}.a", work / f"lib{name}.so"
        _run([tools["ar"], "rcs", static, whole], work)
        # no start files: nothing runs at load, and no weak references to libitm / gmon
        _run([tools["gcc"], "-shared", "-nostartfiles", "-Wl,--no-undefined",
              "-Wl,-z,noexecstack", "-o", shared, whole], work)
        results = []
        for f in (work / f"{name}.h", static, shared):
            target = out / f.name
            tmp_target = out / f".{f.name}.tmp"
            shutil.copyfile(f, tmp_target)
            os.replace(tmp_target, target)
            results.append(target)
    return CLibrary(*results, cmodel)


def check_name(name: str) -> None:
    """Refuse a prefix that is not a C identifier (the API's functions start with it)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise CLibraryError(f"--name {name!r}: a C identifier is needed (the API's prefix)")


def _tools() -> dict:
    """The aarch64 cross tools, or a ``CLibraryError`` naming the one missing."""
    tools = {"gcc": CROSS_CC, **{t: f"aarch64-linux-gnu-{t}" for t in CROSS_TOOLS}}
    for tool in tools.values():
        if shutil.which(tool) is None:
            raise CLibraryError(f"{tool} not found: install Debian's gcc-aarch64-linux-gnu "
                                "(or run `python -m tvm_armq device provision`)")
    return tools


def _run(cmd, cwd) -> None:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise CLibraryError(f"{Path(str(cmd[0])).name} failed building the C library:\n"
                            f"{(res.stderr or res.stdout)[-3000:]}")


def _weights_asm() -> str:
    return (f'\t.section .rodata.{WEIGHTS_SYMBOL},"a",%progbits\n'
            f"\t.balign {ALIGNMENT}\n"
            f"\t.globl {WEIGHTS_SYMBOL}\n"
            f"{WEIGHTS_SYMBOL}:\n"
            '\t.incbin "weights.bin"\n'
            '\t.section .note.GNU-stack,"",%progbits\n')


# ------------------------------------------------------------------ the header
def _c_name(text: str, taken: set) -> str:
    """A C identifier for a tensor's name, unique among ``taken``."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_").lower() or "tensor"
    if base[0].isdigit():
        base = "t_" + base
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def _params(cmodel: CModel) -> list[str]:
    """The positional run function's parameters: each input (const) then each output."""
    taken: set = {"ctx"}
    params = []
    for t in cmodel.inputs:
        params.append(f"const {C_TYPE[t.dtype]} *{_c_name(t.name, taken)}")
    for t in cmodel.outputs:
        params.append(f"{C_TYPE[t.dtype]} *{_c_name(t.name, taken)}")
    return params


def header_text(cmodel: CModel, name: str) -> str:
    """``<name>.h``: the model's C API."""
    from .. import __version__

    up = name.upper()
    level_note = ("the ISA level this CPU has, chosen at init (portable build)"
                  if cmodel.level == "portable" else
                  f"built for the {cmodel.level} level: init refuses a CPU without it")

    def tensor_lines(kind: str, tensors: list) -> list[str]:
        lines = []
        for i, t in enumerate(tensors):
            quant = (f", scale {t.scale!r}, zero point {t.zero_point}" if t.scale else
                     ", not quantized")
            pre = f"{up}_{kind}{i}"
            lines += [f"/* {kind.lower()} {i}: \"{t.name}\", {t.dtype} "
                      f"[{', '.join(map(str, t.shape))}]{quant} */",
                      f"#define {pre}_BYTES {t.nbytes}u",
                      f"#define {pre}_RANK {len(t.shape)}",
                      f"#define {pre}_SHAPE {{{', '.join(map(str, t.shape))}}}",
                      f"#define {pre}_SCALE {t.scale!r}f",
                      f"#define {pre}_ZERO_POINT ({t.zero_point})", ""]
        return lines

    errors = ",\n".join(f"  {up}_{e} = {i}" for i, e in enumerate(ERRORS))
    params = ",\n                ".join([f"{name}_ctx *ctx", *_params(cmodel)])
    return "\n".join([
        f"/* {name}.h: {Path(cmodel.label).name}, compiled by tvm_armq {__version__} into a C "
        "library",
        f" * (lib{name}.a, lib{name}.so) that needs libc alone; {level_note}.",
        " *",
        " * Use: a context per thread that runs the model at a time,",
        f" *   {name}_ctx ctx;",
        f" *   int err = {name}_init(&ctx, NULL, 0);   (or an arena of {up}_ARENA_BYTES,",
        f" *                                          {up}_ALIGNMENT-aligned, of yours)",
        f" *   err = {name}_run(&ctx, input..., output...);",
        f" *   if (err) fprintf(stderr, \"%s: %s\\n\", {name}_error_name(err),",
        f" *                    {name}_last_error(&ctx));",
        f" *   {name}_release(&ctx);",
        f" * Every input and output buffer is {up}_ALIGNMENT-byte aligned (aligned_alloc);",
        " * the library only reads the inputs and writes only the outputs and the arena.",
        " * The run starts no thread; contexts on different threads run at once.",
        " */",
        f"#ifndef {up}_H_",
        f"#define {up}_H_",
        "",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f'#define {up}_ISA "{cmodel.level}"',
        f"#define {up}_ALIGNMENT {ALIGNMENT}u",
        "/* the bytes the workspace takes in a run at most (tensors between layers, packing) */",
        f"#define {up}_ARENA_BYTES {cmodel.arena_bytes}u",
        f"#define {up}_WEIGHT_BYTES {cmodel.weights.size}u",
        f"#define {up}_NUM_INPUTS {len(cmodel.inputs)}",
        f"#define {up}_NUM_OUTPUTS {len(cmodel.outputs)}",
        "",
        *tensor_lines("INPUT", cmodel.inputs),
        *tensor_lines("OUTPUT", cmodel.outputs),
        f"/* what each function returns: 0, or the failure ({name}_error_name names it) */",
        "enum {",
        errors,
        "};",
        "",
        "/* an input or output, as the model declares it */",
        "typedef struct {",
        "  const char *name;",
        '  const char *dtype;      /* "int8", "uint8", "float32", ... */',
        "  int32_t rank;",
        f"  int64_t shape[{MAX_RANK}];",
        "  size_t bytes;",
        "  float scale;            /* 0: not quantized */",
        "  int32_t zero_point;",
        "  int32_t reserved;",
        f"}} {name}_tensor;",
        "",
        "/* a run's state: set up by init, private to the library */",
        "typedef struct {",
        "  uint32_t magic;",
        "  int32_t owns_arena;",
        "  unsigned char *arena;",
        "  size_t arena_bytes;",
        "  size_t top;",
        "  int32_t depth;",
        f"  size_t starts[{NESTING}], tops[{NESTING}];",
        "  char message[256];",
        f"}} {name}_ctx;",
        "",
        "/* Set up ctx. arena NULL and arena_bytes 0: the library allocates the arena (once,",
        f"   freed by release); else arena (at least {up}_ARENA_BYTES, {up}_ALIGNMENT-aligned)",
        "   is yours, kept until release. Also checks that this CPU has the library's level. */",
        f"int {name}_init({name}_ctx *ctx, void *arena, size_t arena_bytes);",
        "/* Free what init allocated. */",
        f"void {name}_release({name}_ctx *ctx);",
        "/* Run the model: the inputs in the model's order, then the outputs. */",
        f"int {name}_run({params});",
        "/* The same with arrays of the inputs and of the outputs, in the model's order. */",
        f"int {name}_run_arrays({name}_ctx *ctx, const void *const *inputs, "
        "void *const *outputs);",
        "/* What an error code means, and what the last failure on ctx said. */",
        f"const char *{name}_error_name(int code);",
        f"const char *{name}_last_error(const {name}_ctx *ctx);",
        '/* The ISA level the kernels run at on this CPU: "neon", "dotprod" or "i8mm". */',
        f"const char *{name}_level(void);",
        "/* Input or output i (NULL past the last). */",
        f"const {name}_tensor *{name}_input(int i);",
        f"const {name}_tensor *{name}_output(int i);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        f"#endif /* {up}_H_ */",
        ""])


def _description(cmodel: CModel, name: str) -> str:
    """``desc.h``, which ``runtime.c`` includes: the header, the API's prefix, the
    tensors' records and DLPack dtypes, and the positional run function."""
    up = name.upper()

    def records(tensors):
        rows = []
        for t in tensors:
            shape = ", ".join(map(str, t.shape)) or "0"
            rows.append(f'  {{"{t.name}", "{t.dtype}", {len(t.shape)}, {{{shape}}}, '
                        f"{t.nbytes}u, {t.scale!r}f, {t.zero_point}, 0}}")
        return ",\n".join(rows)

    def dtypes(tensors):
        return ", ".join("{%d, %d, 1}" % DLPACK_DTYPE[t.dtype] for t in tensors)

    level_code = -1 if cmodel.level == "portable" else list(LEVELS).index(cmodel.level)
    taken: set = {"ctx"}
    ins = [_c_name(t.name, taken) for t in cmodel.inputs]
    outs = [_c_name(t.name, taken) for t in cmodel.outputs]
    params = ", ".join([f"{name}_ctx *ctx", *_params(cmodel)])
    return "\n".join([
        f'#include "{name}.h"',
        f"#define ARMQ_API(x) {name}_##x",
        f"#define ARMQ_UPPER(x) {up}_##x",
        f"#define ARMQ_ALIGNMENT {ALIGNMENT}u",
        f"#define ARMQ_ARENA_BYTES {cmodel.arena_bytes}u",
        f"#define ARMQ_WEIGHT_BYTES {cmodel.weights.size}u",
        f"#define ARMQ_NUM_INPUTS {len(cmodel.inputs)}",
        f"#define ARMQ_NUM_OUTPUTS {len(cmodel.outputs)}",
        f"#define ARMQ_LEVEL_CODE {level_code}",
        f'#define ARMQ_LEVEL_NAME "{cmodel.level}"',
        f"static const {name}_tensor armq_inputs[] = {{\n{records(cmodel.inputs)}\n}};",
        f"static const {name}_tensor armq_outputs[] = {{\n{records(cmodel.outputs)}\n}};",
        f"static const armq_dtype armq_input_dtypes[] = {{{dtypes(cmodel.inputs)}}};",
        f"static const armq_dtype armq_output_dtypes[] = {{{dtypes(cmodel.outputs)}}};",
        f"int {name}_run_arrays({name}_ctx *ctx, const void *const *inputs, "
        "void *const *outputs);",
        f"int {name}_run({params}) {{",
        f"  const void *const inputs[] = {{{', '.join(ins)}}};",
        f"  void *const outputs[] = {{{', '.join(outs)}}};",
        f"  return {name}_run_arrays(ctx, inputs, outputs);",
        "}",
        ""])
