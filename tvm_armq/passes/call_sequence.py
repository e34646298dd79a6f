"""A model's kernel calls as one library function (``as_one_function``).

After tvm_armq's pass a model's ``main`` is a straight list of kernel calls (``call_tir``),
with at most a reshape between two of them. The Relax VM runs each call as: allocate a
storage and a tensor object for its output, pack the arguments, enter the kernel's packed
entry, which checks every tensor's rank, shape, dtype and alignment, and free the objects
after the last use. On a small model that is most of a run: two_in_two_out at dotprod
(armperf 3) spent 1.7e4 of its 3.3e4 est. cycles in the runtime, libc and the entries.

``as_one_function`` makes that list one PrimFunc, ``tvm_armq_model``, and ``main`` one
call of it:

- each kernel becomes an internal function taking raw pointers (its buffers declared over
  them), called directly, so its checks run once, at ``tvm_armq_model``'s entry, for the
  model's inputs, weights and outputs;
- the weights (packed GEMM operands, biases, multipliers, tables: every constant) are one
  byte array, each at an aligned offset (``weights_blob``), so that entry checks one
  tensor for them, not one per constant (246 in mobilenet_v3_small);
- the tensors between kernels live at fixed offsets of one arena (allocated once a run from
  the runtime's workspace pool), planned here from their lifetimes: two tensors share bytes
  only where neither is live while the other is, and a kernel's output never shares its
  inputs' bytes;
- a reshape is the same bytes under another shape: the same pointer;
- the model's outputs are written in place by the kernels that make them;
- with ``serial_twins`` (what a build that leaves the pool's size to the runtime asks
  for: plain ``tvm.compile``, ``compile_tflite`` without ``threads``), the steps are there
  twice, the second time through serial twins of the parallel kernels, and each run takes
  that branch on a pool of one thread.

The library exports ``tvm_armq_model`` (and ``main``); each kernel keeps its name
(``tvm_armq_conv2d3``, ...) and its ``tvm_armq.kernel`` attribute, and has no packed entry:
it appears in the LLVM IR as ``_internal_<name>``, whose body is the local function
``<name>_compute_`` (``on_cpu`` says why it must stay a function), so a cycle profile over
the library's symbols names each kernel (the ``estimate`` command's per-layer table builds
the calls apart).

A ``main`` of any other form (a control flow, a call that is not a kernel's, a symbolic
shape, an output that is an input or a weight) is returned as it is: the VM runs it call
by call, which is correct, only slower. The bytecode VM's per-call hook (``estimate``'s
per-layer table) needs the calls apart, so ``compile_tflite`` merges only in compiled mode;
``tvm.compile`` after ``import tvm_armq`` merges too (``hooks``). A portable build links its
per-level kernels by their packed names after the build and is left call by call.

Measured (armperf 3, one thread, est. cycles a run): two_in_two_out at dotprod 3.265e4 ->
2.56e4, mobilenet_v3_small 1.003e6 against TFLite's 1.188e6 (1.110 -> 1.184 of TFLite's
speed), efficientnet_b1 4.385e6 -> 4.225e6. The weights as one array: two_in_two_out at
dotprod 2.565e4 -> 2.502e4.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FUNC_NAME = "tvm_armq_model"
# Offsets in the arena are multiples of this: the kernels are compiled assuming their
# buffers start 64-byte aligned (TVM's kAllocAlignment), as the VM's own storages do.
ALIGN = 64
INTERNAL = "tvm_armq.internal"   # attribute of a kernel called only by tvm_armq_model
_KDLCPU = 1                      # DLPack's kDLCPU
_WRAPPED = "_tvm_armq_on_cpu"
NUM_THREADS = "runtime.NumThreads"  # the runtime's global: how many threads this pool has
TWIN_SUFFIX = "_one_thread"         # a kernel's serial twin (as_one_function's serial_twins)


class NotASequence(Exception):
    """``main`` is not a plain sequence of kernel calls (says why)."""


@dataclass
class _Tensor:
    """A tensor a kernel writes: its bytes, where they live, and when they are live."""
    nbytes: int
    first: int                  # the step that writes it
    last: int                   # the last step that reads it (itself if none does)
    output: int | None = None   # which model output it is
    offset: int | None = None   # its place in the arena (not an output)


@dataclass
class _Plan:
    """What ``tvm_armq_model`` does, in the order main did it."""
    inputs: list = field(default_factory=list)     # main's params: (var, shape, dtype)
    consts: list = field(default_factory=list)     # relax.Constant, in first-use order
    tensors: list = field(default_factory=list)    # _Tensor, by id
    steps: list = field(default_factory=list)      # (kernel GlobalVar, [ref], tensor id)
    out_types: list = field(default_factory=list)  # (shape, dtype) per model output
    tuple_out: bool = False


def _static(ty, what):
    from tvm import relax

    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise NotASequence(f"{what} is not a tensor of known shape")
    try:
        shape = tuple(int(d) for d in ty.shape.values)
    except (TypeError, AttributeError):
        raise NotASequence(f"{what} has a symbolic shape") from None
    return shape, str(ty.dtype)


def _nbytes(shape, dtype):
    import tvm

    bits = tvm.DataType(dtype).bits * tvm.DataType(dtype).lanes
    return int(np.prod(shape, dtype=np.int64)) * bits // 8


def _plan(mod) -> _Plan:
    """Read ``main`` into a plan, or raise ``NotASequence``."""
    from tvm import ir, relax, tirx

    if any(gv.name_hint == FUNC_NAME for gv in mod.functions):
        raise NotASequence(f"{FUNC_NAME} is made already")
    main = next((f for gv, f in mod.functions.items() if gv.name_hint == "main"), None)
    if not isinstance(main, relax.Function):
        raise NotASequence("the module has no Relax main")
    body = main.body
    if len(body.blocks) != 1 or not isinstance(body.blocks[0], relax.DataflowBlock):
        raise NotASequence("main is not one dataflow block")
    plan = _Plan()
    refs = {}  # relax Var -> ("input", i) | ("const", i) | ("tensor", id)
    for i, p in enumerate(main.params):
        shape, dtype = _static(p.ty, f"input {p.name}")
        plan.inputs.append((p, shape, dtype))
        refs[p] = ("input", i)
    const_ids = {}

    def ref_of(arg, step):
        if isinstance(arg, ir.Constant):
            if arg not in const_ids:
                const_ids[arg] = len(plan.consts)
                plan.consts.append(arg)
            return ("const", const_ids[arg])
        if arg not in refs:
            raise NotASequence(f"an argument of step {step} is not a tensor main made")
        ref = refs[arg]
        if ref[0] == "tensor":
            plan.tensors[ref[1]].last = step
        return ref

    tuple_out = None
    for binding in body.blocks[0].bindings:
        if not isinstance(binding, relax.VarBinding):
            raise NotASequence("a binding is a match_cast")
        value = binding.value
        if isinstance(value, relax.Tuple):
            tuple_out = (binding.var, value)
            continue
        if isinstance(value, relax.Var) and value in refs:  # another name of a tensor
            refs[binding.var] = refs[value]
            continue
        if not isinstance(value, relax.Call) or not hasattr(value.op, "name"):
            raise NotASequence(f"{binding.var.name} is not an operator call")
        if value.op.name == "relax.reshape":  # the same bytes under another shape
            src = value.args[0]
            if src not in refs:
                raise NotASequence(f"{binding.var.name} reshapes a tensor main did not make")
            refs[binding.var] = refs[src]
            continue
        if value.op.name != "relax.call_tir" or len(value.args) != 2:
            raise NotASequence(f"{binding.var.name} is {value.op.name}, not a kernel call")
        func = mod[value.args[0]]
        if not isinstance(func, tirx.PrimFunc):
            raise NotASequence(f"{binding.var.name} calls a function that is not TIR")
        step = len(plan.steps)
        args = [ref_of(a, step) for a in value.args[1].fields]
        shape, dtype = _static(binding.var.ty, binding.var.name)
        if len(func.params) != len(args) + 1:
            raise NotASequence(f"{binding.var.name}: the kernel does not take its "
                               "arguments and one output")
        for p in func.params:
            if not (isinstance(p.ty, tirx.BufferType) and _compact(p)):
                raise NotASequence(f"{binding.var.name}: a kernel parameter is not a "
                                   "compact buffer")
        refs[binding.var] = ("tensor", len(plan.tensors))
        plan.tensors.append(_Tensor(_nbytes(shape, dtype), step, step))
        plan.steps.append((value.args[0], args, len(plan.tensors) - 1))

    result = body.body
    if tuple_out is not None:
        if not result.same_as(tuple_out[0]):
            raise NotASequence("a tuple is made that main does not return")
        results, plan.tuple_out = list(tuple_out[1].fields), True
    else:
        results = [result]
    for k, r in enumerate(results):
        ref = refs.get(r)
        if ref is None or ref[0] != "tensor" or plan.tensors[ref[1]].output is not None:
            raise NotASequence(f"output {k} is not a tensor of its own made by a kernel")
        plan.tensors[ref[1]].output = k
        plan.out_types.append(_static(r.ty, f"output {k}"))
    if not plan.steps:
        raise NotASequence("main calls no kernel")
    return plan


def _compact(buf) -> bool:
    """A row-major buffer starting at its data pointer (what a raw pointer can stand for)."""
    offset = buf.elem_offset
    return (not buf.strides) and (offset is None or (hasattr(offset, "value")
                                                     and int(offset.value) == 0))


def place(tensors) -> int:
    """Give each non-output tensor an arena offset; returns the arena's size in bytes.

    Largest first, each at the lowest aligned offset that no tensor live at the same time
    (their step ranges overlap, ends included) already covers."""
    placed = []
    order = sorted((t for t in tensors if t.output is None), key=lambda t: -t.nbytes)
    for t in order:
        size = _slot(t)
        busy = sorted((p.offset, p.offset + _slot(p)) for p in placed
                      if p.first <= t.last and t.first <= p.last)
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        t.offset = offset
        placed.append(t)
    return max((p.offset + _slot(p) for p in placed), default=0)


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ``ALIGN``: the room a tensor takes in the
    arena or the weights array, so that the next one starts aligned."""
    return -(-nbytes // ALIGN) * ALIGN


def _slot(t) -> int:
    """The bytes a tensor takes in the arena."""
    return aligned(t.nbytes)


def internal(func):
    """``func`` as an internal function of raw pointers: each parameter buffer declared
    over a handle parameter of the same name (inside the root block, where Relax's passes
    look for it), and no global symbol, so a TIR caller calls it directly instead of
    through its packed entry."""
    from tvm import tirx

    from ..schedules.tir_util import open_with

    params, decls = [], []
    for buf in func.params:
        handle = tirx.Var(f"{buf.name}_ptr", "handle")
        decls.append(tirx.DeclBuffer(buf, data=handle))
        params.append(handle)
    new = open_with(func, params, decls)
    new = new.without_attr("global_symbol") if "global_symbol" in (new.attrs or {}) else new
    return new.with_attr(INTERNAL, True)


def on_cpu():
    """A TIR pass for after ``MakePackedAPI``: each internal kernel's body inside a compute
    scope of its own, inside the ``device_type`` / ``device_id`` attributes of the CPU.

    ``MakePackedAPI`` puts these around the body of a function it gives a packed entry, from
    its tensor arguments; ``LowerTVMBuiltin`` reads the device attributes to allocate a
    kernel's packing buffers from the workspace pool of that device. An internal kernel has
    no entry and so no such attributes; every tvm_armq kernel runs on the CPU (device 0)
    that runs it.

    The compute scope (``<kernel>_compute_``) is where TVM's LLVM code generator puts the
    body: a function of its own that LLVM never inlines. That is what keeps two kernels'
    accesses to the same arena bytes ordered. TVM tags every load and store for LLVM's
    type-based alias analysis by the buffer it goes through, one tag per buffer, and two
    buffers of one function are never the same memory. Two kernels' buffers are, where one
    writes an arena tensor and the next reads it: inlined into ``tvm_armq_model``, their
    tags told LLVM the read could not see the write, and it dropped the write (a hybrid
    layer's int8 input, compiled for one thread). Across a call LLVM uses no such tags.
    The parallel loops' tasks were always such functions, so only serial loops were at
    risk."""
    import tvm
    from tvm import ir, tirx

    def scoped(name, func):
        body = tirx.AttrStmt(0, "compute_scope", ir.StringImm(f"{name}_compute_"), func.body)
        body = tirx.AttrStmt(ir.StringImm("default"), "device_id", tirx.const(0, "int32"),
                             body)
        body = tirx.AttrStmt(ir.StringImm("default"), "device_type",
                             tirx.const(_KDLCPU, "int32"), body)
        # it returns 0, or -1 where a workspace allocation inside it failed (the error
        # set). The return comes after the attributes' scope, which is where
        # LowerTVMBuiltin frees the workspace the body allocated.
        body = tirx.SeqStmt([body, tirx.Return(tirx.const(0, "int32"))])
        return tirx.PrimFunc(func.params, body, ret_type=ir.PrimType("int32"),
                             attrs=func.attrs)

    @tvm.transform.module_pass(opt_level=0, name="tvm_armq.internal_on_cpu")
    def run(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and func.attrs and INTERNAL in func.attrs:
                mod[gv] = scoped(gv.name_hint, func)
        return mod

    return run


def keep_internal():
    """A module pass for the end of the Relax pipeline: its last pass
    (``AttachGlobalSymbol``) names every function of the module as a symbol of the library,
    which would give each internal kernel a packed entry again (and make
    ``tvm_armq_model``'s direct calls packed ones). This takes the names back."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tvm_armq.keep_internal")
    def run(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            attrs = func.attrs or {}
            if INTERNAL in attrs and "global_symbol" in attrs:
                mod[gv] = func.without_attr("global_symbol")
        return mod

    return run


def install() -> None:
    """Put ``on_cpu`` at the end of TVM's TIR lowering pipelines (idempotent)."""
    from ..intrinsics.indirect import wrap_tir_pipelines

    wrap_tir_pipelines(_WRAPPED, after=[on_cpu])


def weights_blob(consts) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The model's constants as one byte array, each at an ``ALIGN``-byte offset (the
    alignment its kernel was compiled for, as the runtime gives every tensor's data), and
    where each lies in it, (offset, bytes), in ``consts``' order."""
    parts, spans, size = [], [], 0
    for c in consts:
        raw = np.frombuffer(c.value.numpy().tobytes(), np.uint8)
        spans.append((size, raw.size))
        parts.append(np.pad(raw, (0, aligned(raw.size) - raw.size)))
        size += aligned(raw.size)
    blob = np.concatenate(parts) if parts else np.zeros(ALIGN, np.uint8)
    return blob, spans


def _model_func(plan: _Plan, arena_bytes: int, weight_spans: list, weight_bytes: int,
                twins: dict):
    """``tvm_armq_model(inputs..., weights, outputs...)``: the steps as direct calls,
    every constant a pointer into the one ``weights`` array (``weights_blob``). With
    ``twins`` (a kernel's GlobalVar -> its serial twin's), the steps twice: through the twins
    where the runtime's pool has one thread, as they are otherwise (``as_one_function``)."""
    import tvm
    from tvm import ir, tirx

    inputs = [tirx.decl_buffer(shape, dtype, f"in{i}")
              for i, (_, shape, dtype) in enumerate(plan.inputs)]
    weights = tirx.decl_buffer((weight_bytes,), "uint8", "weights")
    outputs = [tirx.decl_buffer(shape, dtype, f"out{k}")
               for k, (shape, dtype) in enumerate(plan.out_types)]
    arena = tirx.decl_buffer((max(arena_bytes, 1),), "uint8", "arena")

    def pointer(ref):
        kind, i = ref
        if kind == "input":
            return inputs[i].data
        if kind == "const":
            offset, nbytes = weight_spans[i]
            return weights.access_ptr("r", offset=offset, extent=nbytes)
        t = plan.tensors[i]
        if t.output is not None:
            return outputs[t.output].data
        # an access pointer with its extent: TVM's buffer passes size the arena from the
        # regions its pointers cover (a bare address_of covers one byte)
        return arena.access_ptr("rw", offset=t.offset, extent=t.nbytes)

    # a kernel returns nonzero where it failed, its error already set
    # (the FFI constructor takes the condition first, whatever the Python signature says)
    def steps(callee):
        calls = [tirx.AssertStmt(
            tvm.ir.Call(callee(gv), [pointer(r) for r in args] + [pointer(("tensor", out))],
                        ret_ty="int32") == 0,
            ir.StringImm("RuntimeError"),
            [ir.StringImm(f"{gv.name_hint} failed")]) for gv, args, out in plan.steps]
        return tirx.SeqStmt(calls) if len(calls) > 1 else calls[0]

    body = steps(lambda gv: gv)
    if twins:
        one_thread = tirx.call_packed(NUM_THREADS) == 1
        body = tirx.IfThenElse(one_thread, steps(lambda gv: twins.get(gv, gv)), body)
    if arena_bytes:
        body = tirx.SeqStmt([tirx.AllocBuffer(arena), body])
    return tirx.PrimFunc([*inputs, weights, *outputs], body).with_attrs(
        {"global_symbol": FUNC_NAME, "tirx.noalias": True})


def as_one_function(mod, target, *, required: bool = False, serial_twins: bool = False):
    """``mod`` with ``main`` one call of ``tvm_armq_model`` (module docstring), or ``mod``
    unchanged where ``main`` is not a plain sequence of kernel calls (``required``: raise
    ``NotASequence``, saying why). It legalizes what operators are left (as TVM's pipeline
    would next) so that every one is a ``call_tir`` or a reshape; the VM's memory passes
    come after it.

    ``serial_twins``, for a build that leaves the pool's size to the runtime: each kernel
    with a parallel loop gets a twin with its loops serial (``<kernel>_one_thread``), and
    ``tvm_armq_model`` asks the runtime once a run how many threads its pool has
    (``runtime.NumThreads``): on one it runs the twins, whose loops run inline, where each
    parallel loop would enter the runtime (``threads.run_serially`` says what that costs);
    on more, the kernels as they are. The kernels' code is then in the library twice."""
    from tvm import relax

    from ..threads import has_parallel_loop, serial_func

    with target:
        mod = relax.transform.LegalizeOps()(mod)
        mod = relax.transform.RewriteDataflowReshape()(mod)
    try:
        plan = _plan(mod)
    except NotASequence:
        if required:
            raise
        return mod
    arena_bytes = place(plan.tensors)
    builder = relax.BlockBuilder(mod)
    twins = {}
    for gv in sorted({gv for gv, _, _ in plan.steps}, key=lambda gv: gv.name_hint):
        builder.update_func(gv, internal(mod[gv]))
        if serial_twins and has_parallel_loop(mod[gv]):
            twins[gv] = builder.add_func(internal(serial_func(mod[gv])),
                                         f"{gv.name_hint}{TWIN_SUFFIX}")
    blob, spans = weights_blob(plan.consts)
    model_gv = builder.add_func(_model_func(plan, arena_bytes, spans, blob.size, twins),
                                FUNC_NAME)
    out = builder.get()
    main = mod["main"]
    types = [relax.TensorType(shape, dtype) for shape, dtype in plan.out_types]
    call = relax.op.call_tir(model_gv, [p for p, _, _ in plan.inputs] + [relax.const(blob)],
                             types if plan.tuple_out else types[0])
    ret = relax.TupleType(types) if plan.tuple_out else types[0]
    var = relax.Var("outputs", ret)
    body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(var, call)])], var)
    out["main"] = relax.Function(main.params, body, main.ret_ty, is_pure=main.is_pure,
                                 attrs=main.attrs)
    return out


def weights_of(mod) -> np.ndarray:
    """The one weights array (``weights_blob``) that ``main`` of an ``as_one_function``
    module passes to ``tvm_armq_model``: the bytes a C library embeds."""
    from tvm import ir

    call = mod["main"].body.blocks[0].bindings[0].value
    (blob,) = [a for a in call.args[1].fields if isinstance(a, ir.Constant)]
    return blob.value.numpy()
