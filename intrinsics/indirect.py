"""The INDIRECT form: a direct-read K loop whose rows of A start at their own output pixels.

The DIRECT form (``forms.desc_direct``) reads a micro-tile's mr rows of A in place at
``origin + i * row_stride``: mr consecutive output pixels of one output row. Where the
output row is no whole number of micro-tiles (a 14 x 14 or 7 x 7 map with mr = 4, a
stride-2 1x1 layer into one), some micro-tiles cross from one output row into the next,
and row i's origin is that of its own pixel m = bm * mr + i (NHWC, flat offsets into the
input, or into its bordered copy when the layer pads):

    origin(m) = ((b * H + oh * sh) * W + ow * sw) * C     b, oh, ow = m's image, row, column

which has divisions in it. Tensorize matches a block against a desc whose indices are
affine in the block's iterators, so this cannot be tensorized. QNNPACK's answer is an
indirection buffer (a pointer per row and tap); here the pointers are computed, mr per
micro-tile, from the same expression the compute uses.

How it runs:

    schedule   blockizes the micro-tile column loop of a part whose window is by pixel
               (``DirectWindow.by_pixel``) and marks the block (``mark``) with the
               form's name (``forms.direct_name``: kernel, window, n_tiles);
    lower      a TIR pass at the front of TVM's lowering pipelines (``install``, called
               by ``import tvm_armq``) replaces each marked block's scalar loops with the
               kernel's direct-read instruction sequence (its module's ``direct``
               builder), given each row's offset: the block's own A index with the row
               fixed to i and every K position 0. The block keeps its iterators, reads
               and writes; B and C are bound to it as tensorize binds them (match
               buffers), A is the whole flat input.

Same instructions as DIRECT: only the address of each row's load differs.
"""

from __future__ import annotations

from .forms import DirectWindow, direct_name
from .kernels import Kernel

# The block annotation that marks a blockized micro-tile loop for ``lower``: the INDIRECT
# form's name (``forms.direct_name`` of a by-pixel window).
MARK = "tvm_armq.indirect"


def mark(sch, loop, kernel: Kernel, window: DirectWindow, n_tiles: int, target=None) -> None:
    """Blockize the micro-tile column loop ``loop`` (of extent n_tiles, above
    ([run,] K block, i, j, kk) of a GEMM that reads A by pixel) and mark the block for
    ``lower``. Raises as ``registry.tensorize`` does when the target cannot run the
    kernel."""
    from .kernels import require

    if not window.by_pixel:
        raise ValueError(f"{kernel.name}: an affine window is tensorized (DIRECT form), "
                         "not marked for the indirect lowering")
    require(kernel, target)
    block = sch.blockize(loop)
    sch.annotate(block, MARK, direct_name(kernel, window, n_tiles))


def walk(node, kind) -> list:
    """The nodes of type ``kind`` under ``node``, in pre-order."""
    import tvm_ffi

    found = []

    def visit(n):
        found.append(n)
        return n

    tvm_ffi.structural_map(node, [(kind, visit)], order="pre")
    return found


def _substitute(expr, mapping: dict):
    """``expr`` with the variables of ``mapping`` replaced."""
    import tvm_ffi
    from tvm import tirx

    return tvm_ffi.structural_map(expr, [(tirx.Var, lambda v: mapping.get(v, v))])


def _lower_block(block):
    """The marked SBlock ``block`` with its scalar body replaced by the instruction
    sequence (module docstring)."""
    import tvm
    from tvm import s_tir, sym, tirx

    from . import registry

    name = str(block.annotations[MARK])
    kernel, window, n_tiles = registry.parse_direct_name(name)
    (inner,) = walk(block.body, s_tir.SBlockRealize)
    update = inner.block.body
    # the update is C[g, bm, bn, i, j] += acc(A[0, 0, 0, a]) * acc(B[g, bn, kb, j, kk])
    # (gemm_compute.direct_gemm_te, after decompose_reduction)
    if not isinstance(update, tirx.BufferStore):
        raise ValueError(f"{name}: the marked block's update is no buffer store")
    product = update.value.b
    a_load, b_load = product.a.value, product.b.value
    c_buf, a_buf, b_buf = update.buffer, a_load.source, b_load.source
    bound = {iv.var: value for iv, value in zip(inner.block.iter_vars, inner.iter_values)}
    a_index = _substitute(a_load.indices[-1], bound)
    row_of_tile = _substitute(update.indices[3], bound)
    loop_vars = [loop.loop_var for loop in walk(block.body, tirx.For)]
    row_vars = [v for v in loop_vars if _uses(row_of_tile, v)]
    if len(row_vars) != 1:
        raise ValueError(f"{name}: the micro-tile's row is no single loop of the block")
    analyzer = sym.Analyzer()
    rows = []
    for i in range(kernel.mr):
        at = {v: tirx.const(i if v.same_as(row_vars[0]) else 0, v.ty.dtype) for v in loop_vars}
        rows.append(analyzer.simplify(_substitute(a_index, at)))
    a_extent = 1
    for d in a_buf.shape:
        a_extent *= int(d)
    impl = registry.implementation(kernel).direct(kernel, window, n_tiles, rows=rows,
                                                  a_extent=a_extent)
    root = impl.body.block
    a_impl, b_impl, c_impl = impl.params  # TVM 0.27: a buffer parameter is the buffer

    def region(buf, regions):
        (found,) = [r for r in regions if r.source.same_as(buf)]
        return found

    whole_a = tirx.BufferRegion(a_buf, [tvm.ir.Range.from_min_extent(0, 1)
                                        for _ in a_buf.shape[:-1]]
                                + [tvm.ir.Range.from_min_extent(0, a_extent)])
    matches = [s_tir.MatchBufferRegion(a_impl, whole_a),
               s_tir.MatchBufferRegion(b_impl, region(b_buf, block.reads)),
               s_tir.MatchBufferRegion(c_impl, region(c_buf, block.writes))]
    annotations = {k: v for k, v in block.annotations.items() if k != MARK}
    return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                        root.body, None, list(root.alloc_buffers), matches, annotations)


def _uses(expr, var) -> bool:
    from tvm import tirx

    return any(v.same_as(var) for v in walk(expr, tirx.Var))


def lower_func(func):
    """``func`` with every marked block lowered (``func`` itself if it has none)."""
    import tvm_ffi
    from tvm import s_tir

    if not any(MARK in b.annotations for b in walk(func.body, s_tir.SBlock)):
        return func

    def lower(block):
        return _lower_block(block) if MARK in block.annotations else block

    body = tvm_ffi.structural_map(func.body, [(s_tir.SBlock, lower)])
    return func.with_body(body)


def lower_pass():
    """The TIR pass that lowers every marked block of a module (``lower_func``)."""
    from tvm import tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="tvm_armq.LowerIndirect")
    def run(func, _mod, _ctx):
        return lower_func(func)

    return run


_MARK_PREFIX = "_tvm_armq_"    # of the attributes that mark a wrapped TIR pipeline
_WRAPPED = _MARK_PREFIX + "indirect"


def install() -> None:
    """Put ``lower_pass`` in front of TVM's TIR lowering pipelines ("default", "s_tir"),
    so any build of a func with marked blocks lowers them first (idempotent)."""
    wrap_tir_pipelines(_WRAPPED, before=[lower_pass])


def wrap_tir_pipelines(mark: str, *, before=(), after=()) -> None:
    """Run the passes the factories ``before`` make in front of TVM's TIR lowering
    pipelines ("default", "s_tir") and those of ``after`` at their end (before the host's
    finalizing passes), once per ``mark``: a pipeline already carrying it is left alone.
    Marks start with ``_MARK_PREFIX``; a wrapper carries the marks of the pipeline it wraps,
    so wrapping twice under the same mark stays a no-op whatever was wrapped in between."""
    import tvm

    assert mark.startswith(_MARK_PREFIX), mark
    from tvm.tirx import compilation_pipeline as pipelines

    for name in ("default", "s_tir"):
        factory = pipelines.PIPELINE_MAP.get(name)
        if factory is None or hasattr(factory, mark):
            continue

        def wrapped(*args, _factory=factory, **kwargs):
            pipeline, finalize_host, finalize_device = _factory(*args, **kwargs)
            passes = [make() for make in before] + [pipeline] + [make() for make in after]
            return tvm.transform.Sequential(passes), finalize_host, finalize_device

        for attr in [a for a in dir(factory) if a.startswith(_MARK_PREFIX)]:
            setattr(wrapped, attr, True)
        setattr(wrapped, mark, True)
        pipelines.PIPELINE_MAP[name] = wrapped
