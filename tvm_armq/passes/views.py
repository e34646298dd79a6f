"""Views read and written through the buffers they view, so that LLVM sees them alias.

A tensorized block reaches its operands through views: the intrinsic's buffers matched on a
region of the block's (``MatchBufferRegion``), such as the direct form's A on the padded
input. Lowered, a view is a buffer of its own whose data is the address of its first
element::

    v = T.address_of(data_padded[offset])
    view = T.decl_buffer((252,), "int8", data=v)
    ... view[T.Ramp(i, 1, 16)] ...

TVM's LLVM code generator tags each load and store for LLVM's type-based alias analysis by
the buffer it goes through (``codegen_llvm.cc``, ``AddAliasInfo``). In a function whose
pointers are restricted (``tirx.noalias``: all our kernels) an address bound this way is
a root of its own, and two roots are never the same memory. So a function that writes
``data_padded`` and then reads it through ``view`` tells LLVM the read cannot see the
writes, and LLVM may drop or move them. It did: a serial build of a dotprod TRANSPOSE_CONV
at stride 1 (one direct-form GEMM reading the padded input) gave wrong outputs. A parallel
build hid it, as each parallel loop is a function of its own and LLVM uses no tags across a
call; the serial builds (``--threads 1``, the C library, the serial twins) did not.

This pass rewrites each access of such a view as the same access of the viewed buffer at
the view's offset, so both carry the viewed buffer's tag. The view's declaration stays,
unused. It runs at the end of TVM's TIR pipelines, once buffers are flat."""

from __future__ import annotations

from ..intrinsics.indirect import walk, wrap_tir_pipelines

_WRAPPED = "_tvm_armq_views"  # the mark of a TIR pipeline this pass is installed in


def _flat_views(body) -> dict:
    """{view buffer: (viewed buffer, element offset)} for every flat view of ``body`` whose
    data is ``address_of`` an element of a flat buffer of the same dtype, resolved to the
    buffer at the root of a chain of views."""
    from tvm import ir, tirx

    address_of = ir.Op.get("tirx.address_of")
    addresses = {}
    for bind in walk(body, tirx.Bind):
        value = bind.value
        if isinstance(value, ir.expr.Call) and value.op.same_as(address_of):
            (load,) = value.args
            if isinstance(load, ir.expr.TensorLoad) and len(load.indices) == 1:
                addresses[bind.var] = load
    views = {}
    for decl in walk(body, tirx.DeclBuffer):
        load = addresses.get(decl.data)
        view, viewed = decl.buffer, None if load is None else load.source
        if viewed is None or len(view.shape) != 1 or len(viewed.shape) != 1 \
                or view.dtype != viewed.dtype or not _is_zero(view.elem_offset):
            continue
        offset = load.indices[0]
        if viewed in views:  # a view of a view
            viewed, outer = views[viewed]
            offset = outer + offset
        views[view] = (viewed, offset)
    return views


def _is_zero(expr) -> bool:
    from tvm import tirx

    return isinstance(expr, tirx.IntImm) and expr.value == 0


def _shifted(index, offset):
    """``index`` (scalar, ramp or other vector) moved by the scalar ``offset``; a ramp stays a
    ramp, which the code generator turns into one vector access."""
    from tvm import tirx

    scalar = index.ty.dtype.with_lanes(1)
    if offset.ty.dtype != scalar:
        offset = tirx.Cast(scalar, offset)
    if isinstance(index, tirx.Ramp):
        return tirx.Ramp(index.base + offset, index.stride, index.lanes)
    lanes = index.ty.dtype.lanes
    return index + (offset if lanes == 1 else tirx.Broadcast(offset, lanes))


def through_viewed_buffers(func):
    """``func`` with each access of a flat view (module docstring) made on the buffer it
    views; ``func`` itself if it has none."""
    import tvm_ffi
    from tvm import ir, tirx

    views = _flat_views(func.body)
    if not views:
        return func

    def load(node):
        if node.source not in views:
            return node
        viewed, offset = views[node.source]
        return tirx.BufferLoad(viewed, [_shifted(node.indices[0], offset)])

    def store(node):
        if node.buffer not in views:
            return node
        viewed, offset = views[node.buffer]
        return tirx.BufferStore(viewed, node.value, [_shifted(node.indices[0], offset)])

    body = tvm_ffi.structural_map(func.body, [(ir.expr.TensorLoad, load),
                                              (tirx.BufferStore, store)])
    return func.with_body(body)


def views_pass():
    """The TIR pass of ``through_viewed_buffers``, on every PrimFunc of a module."""
    from tvm import tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="tvm_armq.ThroughViewedBuffers")
    def run(func, _mod, _ctx):
        return through_viewed_buffers(func)

    return run


def install() -> None:
    """Put ``views_pass`` at the end of TVM's TIR lowering pipelines (idempotent)."""
    wrap_tir_pipelines(_WRAPPED, after=[views_pass])
