"""The LayerNorm family: the thirteen ops TFLite's converter writes for a LayerNormalization
over the last axis, recognized at the last ADD and run as one row kernel
(``schedules.layer_norm``) that computes each op's integers in turn. The ops before that
ADD are lowered one by one as the pass meets them (the elementwise, reduce and table
families) and, no longer read, removed afterwards with the float chain.

The frontend's chain, from the end (each name an int8 tensor, ``Q(...)`` a quantize of the
float op on dequantized operands):

    out = Q(add(b, a))                 a = Q(multiply(nm, rg)), or Q(add(that, beta)):
    b   = Q(multiply(x, rg))               beta a constant [C]
    rg  = Q(multiply(r, gamma))        gamma: an int8 constant [C]
    r   = Q(rsqrt(ve))                 ve  = Q(add(var, epsilon)): a constant epsilon
    var = Q(mean(sq)), last axis       sq  = Q(d * d), d = subtract(x, m)
    m   = Q(mean(x)), last axis        nm  = Q(negative(m)): the float island
"""

from __future__ import annotations

import numpy as np

from ..intrinsics import names
from ..report import Lowered
from .graph import Graph, NotInteger, dtype_of, qparams, shape_of
from .records import KernelCall, OpFamily, Options


class _Chain:
    """Reading the chain back: each int8 tensor's defining quantize and float op."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def tensor(self, expr):
        """The int8 tensor under ``dequantize(expr)``, or None."""
        deq = self.graph.call(expr, "relax.dequantize")
        return deq.args[0] if deq is not None else None

    def op(self, tensor, name: str):
        """(quantize, the float ``name`` call under it) defining ``tensor``, or None."""
        q = self.graph.call(tensor, "relax.quantize") if tensor is not None else None
        core = self.graph.call(q.args[0], name) if q is not None else None
        return (q, core) if core is not None else None

    def operands(self, call):
        return [self.tensor(a) for a in call.args]

    def const(self, tensor):
        return self.graph.const(tensor) if tensor is not None else None

    def tensor_and_constant(self, call):
        """(the tensor operand, the constant one, its value) of a two-input op (the value
        None where neither operand is a constant)."""
        a, b = self.operands(call)
        if self.const(a) is not None:
            a, b = b, a
        return a, b, self.const(b)

    def q(self, quantize_or_deq, what: str):
        return qparams(self.graph, quantize_or_deq).scalar(what)

    def deq_q(self, expr, what: str):
        return qparams(self.graph, self.graph.call(expr, "relax.dequantize")).scalar(what)


def _last_axis_mean(chain: _Chain, tensor):
    found = chain.op(tensor, "relax.mean")
    if found is None:
        return None
    _, mean = found
    x = chain.tensor(mean.args[0])
    rank = len(shape_of(x)) if x is not None else 0
    axes = [int(a) % rank for a in mean.attrs.axis] if rank else []
    return (found, x) if axes == [rank - 1] and bool(mean.attrs.keepdims) else None


def _match(graph: Graph, root):
    """Everything the kernel needs, read from the chain, or None if it is not one."""
    if root.op != "add" or root.clip is not None:
        return None
    chain = _Chain(graph)
    beta = None
    b, a = chain.operands(root.core)
    for first in (True, False):  # ADD(MUL(x, rg), a); a = MUL(nm, rg) or ADD(that, beta)
        t = b if first else a
        found = chain.op(t, "relax.add")
        inner = chain.operands(found[1]) if found is not None else []
        consts = [chain.const(u) for u in inner]
        if len(inner) == 2 and sum(c is not None for c in consts) == 1:
            k = 0 if consts[0] is not None else 1
            beta = (found[0], inner[k], consts[k])
            if first:
                b, a = a, inner[1 - k]
            else:
                a = inner[1 - k]
            break
    out_quantize = root.quantize
    products = [chain.op(t, "relax.multiply") for t in (b, a)]
    if None in products:
        return None
    # rg: the operand both products share, defined by MUL(r, gamma)
    (_, mul_b), (_, mul_a) = products
    if None in chain.operands(mul_b) + chain.operands(mul_a):
        return None
    shared = [t for t in chain.operands(mul_b) if any(t is not None and t.same_as(u)
                                                      for u in chain.operands(mul_a))]
    if len(shared) != 1:
        return None
    rg = shared[0]
    x = next(t for t in chain.operands(mul_b) if not t.same_as(rg))
    nm = next(t for t in chain.operands(mul_a) if not t.same_as(rg))
    rg_def = chain.op(rg, "relax.multiply")
    if rg_def is None:
        return None
    r, gamma, gamma_values = chain.tensor_and_constant(rg_def[1])
    r_def = chain.op(r, "relax.rsqrt")
    if gamma_values is None or r_def is None:
        return None
    ve = chain.tensor(r_def[1].args[0])
    ve_def = chain.op(ve, "relax.add")
    if ve_def is None:
        return None
    var, eps, eps_value = chain.tensor_and_constant(ve_def[1])
    var_def = _last_axis_mean(chain, var)
    if eps_value is None or var_def is None or eps_value.size != 1:
        return None
    sq = var_def[1]
    sq_def = chain.op(sq, "relax.multiply")
    if sq_def is None or not sq_def[1].args[0].same_as(sq_def[1].args[1]):
        return None
    d = graph.call(sq_def[1].args[0], "relax.subtract")
    nm_def = chain.op(nm, "relax.negative")
    if d is None or nm_def is None:
        return None
    x_d, m = chain.operands(d)
    m_def = _last_axis_mean(chain, m)
    if x_d is None or m_def is None or not (x_d.same_as(x) and m_def[1].same_as(x)) or \
            not chain.tensor(nm_def[1].args[0]).same_as(m):
        return None
    return dict(chain=chain, x=x, m=(m, m_def[0][0]), nm=(nm, nm_def[0]), sq=(sq, sq_def[0]),
                var=(var, var_def[0][0]), eps=(eps, eps_value), ve=(ve, ve_def[0]),
                r=(r, r_def[0]), gamma=(gamma, gamma_values), rg=(rg, rg_def[0]),
                b=(b, products[0][0]), a=(a, products[1][0]), out=out_quantize, beta=beta)


def _lower(graph: Graph, root, found, _opts: Options) -> KernelCall:
    from tvm_armq.schedules import layer_norm as ln

    chain, x = found["chain"], found["x"]
    if dtype_of(x) != "int8":
        raise NotInteger(f"a LayerNorm of a {dtype_of(x)} tensor (int8 only)")

    def q(name):
        return chain.q(found[name][1], f"the LayerNorm's {name}")

    def const_q(name):
        deq = graph.call(found[name][0], "relax.dequantize")
        return chain.q(deq, f"the LayerNorm's {name}")

    x_q = _input_q(graph, found)
    beta = found["beta"]
    try:
        quant = ln.LayerNormQuant(
            x_q, q("m"), q("nm"), q("sq"), q("var"), _operand_q(graph, found["ve"][1], 1),
            q("ve"), q("r"), _operand_q(graph, found["rg"][1], 1), q("rg"), q("b"), q("a"),
            chain.q(found["out"], "the LayerNorm's output"),
            int(np.asarray(found["eps"][1]).reshape(())),
            np.asarray(found["gamma"][1]).reshape(-1).astype(np.int8),
            *((_operand_q(graph, beta[0], 1), np.asarray(beta[2]).reshape(-1)
               .astype(np.int8), chain.q(beta[0], "the LayerNorm's a + beta"))
              if beta is not None else ()))
        channels = shape_of(x)[-1]
        if quant.gamma_values.size != channels or (
                beta is not None and quant.beta_values.size != channels):
            raise NotInteger("gamma or beta is not one value per channel")
        p = ln.layer_norm_params(quant, channels)
    except ValueError as e:  # TFLite's Prepare refuses these scales too
        raise NotInteger(f"LayerNorm: {e}") from None
    shape = shape_of(x)
    rows = int(np.prod(shape[:-1]))
    consts = [quant.gamma_values, *([quant.beta_values] if beta is not None else []),
              p.neg_table, p.rsqrt_table]
    record = Lowered("layer_norm", root.label, shape, shape_of(root.quantize),
                     names.elementwise_name("layer_norm"))
    return KernelCall(ln.layer_norm_func(rows, p), "layer_norm", [(x, (rows, shape[-1]))],
                      consts, (rows, shape[-1]), record)


def _operand_q(graph: Graph, quantize, index: int):
    """(scale, zero point) of the dequantized operand ``index`` of the float op under
    ``quantize`` (the constant operand's: epsilon, gamma, beta)."""
    call = graph.call(quantize.args[0], "relax.add", "relax.multiply")
    deqs = [graph.call(a, "relax.dequantize") for a in call.args]
    consts = [d for d in deqs if d is not None and graph.const(d.args[0]) is not None]
    if len(consts) != 1:
        raise NotInteger("a LayerNorm step without one constant operand")
    return qparams(graph, consts[0]).scalar("a LayerNorm constant")


def _input_q(graph: Graph, found):
    """(scale, zero point) of x, from the dequantize the first MEAN reads."""
    mean = graph.call(found["m"][1].args[0], "relax.mean")
    return qparams(graph, graph.call(mean.args[0], "relax.dequantize")).scalar(
        "the LayerNorm's input")


# How many layers of the chain read each inner tensor: the mean (the squared difference
# and the NEG island), rg (both products), every other one the next step only.
_READERS = {"m": 2, "rg": 2}
_INNER = ("m", "nm", "sq", "var", "ve", "r", "rg", "b", "a")


def _absorbs(graph: Graph, found) -> list:
    """The chain's inner int8 tensors, when no layer outside the chain reads them."""
    inner = [found[name][0] for name in _INNER]
    if found["beta"] is not None:
        inner.append(graph.var_of.get(found["beta"][0]))
    if any(v is None or graph.uses.get(v, 0) != _READERS.get(name, 1)
           for v, name in zip(inner, [*_INNER, "a_beta"])):
        return []
    return inner


FAMILY = OpFamily("layer_norm", ("relax.quantize",), _match, _lower,
                  lambda root, found: "layer_norm", _absorbs)
