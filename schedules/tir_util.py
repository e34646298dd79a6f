"""TIR helpers of the schedules: loop surgery, vectors of a register's width, the row tail's
output merge, a kernel's parameters viewed in the model's shapes or declared over other
parameters (``open_with``), a float value kept from FMA fusion (``fence``)."""

from __future__ import annotations

import numpy as np


def fence(value):
    """``value`` as LLVM may not fuse with what uses it: a product stays a product of its
    own (one rounding) where LLVM would fuse it with the add after it into one FMLA, and a
    sum is not folded with the subtraction after it. ``llvm.arithmetic.fence`` costs no
    instruction."""
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(str(value.ty), "llvm.arithmetic.fence", value)


def merge_outputs(func, main_name: str = "output", tail_name: str = "output_tail"):
    """``func`` with a row tail's two output buffers (``gemm_compute.conv2d_gemm_te``:
    ``main_name`` and ``tail_name``) joined into one ``main_name`` buffer of all M rows;
    the tail's becomes a view of its last rows (a match_buffer of the root block).
    ``func`` itself when it has no row tail. Meant for a scheduled func: no schedule
    primitive may run after it."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx
    from tvm.tirx.buffer import Buffer

    names = [p.name for p in func.params]
    if tail_name not in names:
        return func
    out, tail = func.params[names.index(main_name)], func.params[names.index(tail_name)]
    main, rest = int(out.shape[0]), int(tail.shape[0])
    inner = [int(d) for d in out.shape[1:]]
    full = tirx.decl_buffer((main + rest, *inner), out.dtype, main_name)
    view = tirx.decl_buffer(tuple(int(d) for d in tail.shape), tail.dtype, tail_name,
                            elem_offset=main * int(np.prod(inner)))
    swap = {out: full, tail: view}
    realize = tvm_ffi.structural_map(func.body, [(Buffer, lambda b: swap.get(b, b))])
    root = realize.block
    rows = [tvm.ir.Range.from_min_extent(main, rest)] + [tvm.ir.Range.from_min_extent(0, d)
                                                         for d in inner]
    match = s_tir.MatchBufferRegion(view, tirx.BufferRegion(full, rows))
    params = [full if p.same_as(out) else p for p in func.params if not p.same_as(tail)]
    return _with_root(func, params, realize, match_buffers=[*root.match_buffers, match])


def _with_root(func, params, realize, *, body=None, match_buffers=None):
    """``func`` with ``params`` and its root block (of the SBlockRealize ``realize``) given
    another ``body`` and / or ``match_buffers``, every other field as it was."""
    from tvm import s_tir, tirx

    root = realize.block
    root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                        root.body if body is None else body, root.init, root.alloc_buffers,
                        root.match_buffers if match_buffers is None else match_buffers,
                        root.annotations)
    return tirx.PrimFunc(params, s_tir.SBlockRealize(realize.iter_values, realize.predicate,
                                                     root),
                         ret_type=func.ret_type, attrs=func.attrs)


def flatten_written(func, block_name: str):
    """``func`` with the buffer its block ``block_name`` writes laid out as one flat axis:
    the same bytes in the same (row-major) order, every access rewritten to the flat
    offset (``Schedule.transform_layout``).

    A direct-read GEMM indexes the bordered input copy by flat offset on its last axis
    (``gemm_compute.direct_gemm_te``). TVM checks that a producer covers what its
    consumers read, axis by axis, clipping a read to the axis; a row tail reads from its
    first output pixel on, wholly past the last axis, and with the copy 4-D that check
    fails and no block of the function could be moved. Returned as a new func, so that
    a schedule built from it computes that check afresh."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    block = sch.get_sblock(block_name)
    (written,) = sch.get(block).writes
    shape = [int(d) for d in written.source.shape]

    def flat(*index):
        offset = index[0]
        for i, extent in zip(index[1:], shape[1:]):
            offset = offset * extent + i
        return [offset]

    sch.transform_layout(block, ("write", 0), flat)
    return sch.mod["main"]


def partition(sch, loop, parts) -> list:
    """``loop`` cut into consecutive loops of the given extents (zeros skipped), in order;
    a zero-extent part gets None."""
    sizes = [p for p in parts if p]
    loops = sch.loop_partition(loop, sizes[:-1] + [None]) if len(sizes) > 1 else [loop]
    it = iter(loops)
    return [next(it) if p else None for p in parts]


def cut_at_the_image(sch, block, padding, height: int, width: int) -> list:
    """A padded copy's ``block`` (loops: batch, row, pixel, channel) cut where the image
    starts and ends, along rows and along each row's pixels (``padding``: top, left,
    bottom, right, around an image of ``height`` x ``width``): inside the image the copy
    needs no bounds test (the cut lets the simplifier drop it), around it the border is a
    plain fill. Returns, per part of the rows, (its row loop, the channel loop of each of
    its parts of the pixels), for the caller to vectorize and parallelize."""
    top, left, bottom, right = padding
    parts = []
    for rows in partition(sch, sch.get_loops(block)[1], [top, height, bottom]):
        if rows is None:
            continue
        pixels = sch.get_loops(only_block(sch, rows))[-2]
        parts.append((rows, [sch.get_loops(only_block(sch, part))[-1]
                             for part in partition(sch, pixels, [left, width, right])
                             if part is not None]))
    return parts


def only_block(sch, loop):
    (block,) = sch.get_child_blocks(loop)
    return block


def loops_below(sch, block, loop) -> list:
    """The loops around ``block`` that are nested inside ``loop``."""
    loops = sch.get_loops(block)
    anchor = sch.get(loop)
    for idx, rv in enumerate(loops):
        if sch.get(rv).same_as(anchor):
            return loops[idx + 1:]
    raise ValueError("block is not under the given loop")


def largest_divisor(extent: int, want: int) -> int:
    return max(d for d in range(1, max(1, min(want, extent)) + 1) if extent % d == 0)


def vectorize_in_registers(sch, loop, lanes: int):
    """``loop`` vectorized ``lanes`` at a time: one vector when its extent is at most
    ``lanes``, else a loop over whole vectors and, for the extent's remainder, one
    narrower vector. Returns the loop over whole vectors (None when there is none).
    A vector as wide as a whole channel loop (hundreds of lanes) is legalized by LLVM
    element by element wherever it is not a plain load or store."""
    extent = int(sch.get(loop).extent)
    if extent <= lanes:
        sch.vectorize(loop)
        return None
    main = extent // lanes * lanes
    parts = [loop] if main == extent else sch.loop_partition(loop, [main, None])
    vectors, inner = sch.split(parts[0], [None, lanes])
    sch.vectorize(inner)
    if len(parts) > 1:
        sch.vectorize(parts[1])
    return vectors


def view_params(func, shapes: dict):
    """``func`` with parameter ``i`` taking shape ``shapes[i]`` (same dtype, same element
    count): the body still reads and writes the old buffer, declared over the new
    parameter's data as a row-major view of it.

    A GEMM writes C as [M, groups, N] and reads a dense layer's row as [1, 1, 1, K]; the
    model's tensors are NHWC and [1, K]. Viewing the parameter inside the kernel is the
    reshape at no cost, where a Relax reshape between two calls is a runtime call
    (``vm.builtin.reshape``) and a tensor object each run."""
    from tvm import tirx

    params, decls = list(func.params), []
    for i, shape in sorted(shapes.items()):
        old = params[i]
        shape = tuple(int(d) for d in shape)
        if int(np.prod(shape)) != int(np.prod([int(d) for d in old.shape])):
            raise ValueError(f"view_params: {old.name} {tuple(old.shape)} is not {shape}")
        new = tirx.decl_buffer(shape, old.dtype, old.name)
        decls.append(tirx.DeclBuffer(old, data=tirx.call_intrin("handle", "tirx.buffer_data",
                                                                new)))
        params[i] = new
    if not decls:
        return func
    return open_with(func, params, decls)


def open_with(func, params, decls):
    """``func`` taking ``params``, its body opened by the statements ``decls`` (buffer
    declarations over the new parameters). In a function of blocks they open the root
    block's body, where Relax's passes (op-pattern analysis) look for the block."""
    from tvm import s_tir, tirx

    realize = func.body
    if isinstance(realize, s_tir.SBlockRealize):
        return _with_root(func, params, realize,
                          body=tirx.SeqStmt([*decls, realize.block.body]))
    return tirx.PrimFunc(params, tirx.SeqStmt([*decls, func.body]), ret_type=func.ret_type,
                         attrs=func.attrs)
