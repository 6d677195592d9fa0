"""Base-2 softmax arithmetic shared by the log-prob kernels' epilogues.

The kernels evaluate ``exp(x - m)`` as ``exp2(t)``, ``t = (x - m) log2(e)``: one ``ex2.approx.ftz``
instruction per logit, where ``tl.exp`` adds a multiply by log2(e) and a denormal guard (a compare
and two multiplies; the flushed terms are below 2**-126 of the row's largest). The logits arrive
unscaled, ``y`` with ``x = y * inv_t`` (inv_t > 0), so that ``t`` is one FMA of ``y``:

    t = y * c - ref,    c = fp32(inv_t * log2 e),    ref = fp32(my * c),    my = the row max of y.

``ref`` is rounded: an fp32 reference 441 (logits 300) is off by up to 1.5e-5 from ``my * c``, which
as a shift of every ``t`` of the row would be an error of that size in every probability. So the sums
``s = sum 2**t`` and ``a = sum 2**t * t`` are taken relative to the fp32 number ``ref`` itself (exact
in real arithmetic: ``t`` is then ``(y - my) c`` plus the row constant ``my c - ref``), and
``natural_partial`` moves them, once per row, to the partial the merge expects: relative to
``m = fp32(my * inv_t)`` and in natural units. The two rounding residues it needs, ``my c - ref`` and
``my inv_t - m``, are exact (one FMA each). What remains per logit is the rounding of ``t`` itself
and the relative error of ``c``, both proportional to ``|x - m|``, as with ``exp(x - m)``.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
# exp2(t) is 0 in fp32 for t below -150 (denormals end at 2**-149): t clamped here keeps 0 * t finite
# where t = -inf (a masked column, a -inf bias or logit) without changing any term that is not 0
T_MIN = tl.constexpr(-1024.0)


@triton.jit
def ref2(my, c):
    """The base-2 reference ``fp32(my * c)`` of rows whose unscaled max is ``my`` (0 where my = -inf:
    every term of such a row is 0, and -inf - -inf would be NaN)."""
    return tl.where(my == float("-inf"), 0.0, my) * c


@triton.jit
def rescale2(my_old, my_new, c):
    """``ref2(my_old) - ref2(my_new)``: the exponent that moves running sums from the old reference
    to the new one (-inf for the empty partial, whose sums are 0)."""
    return tl.where(my_old == float("-inf"), float("-inf"), ref2(my_old, c) - ref2(my_new, c))


@triton.jit
def natural_partial(my, s, a, inv_t, ENTROPY: tl.constexpr):
    """The partial ``(m, s, a)`` of ``x = y * inv_t`` that the merge expects (``m = fp32(my * inv_t)``,
    ``s = sum exp(x - m)``, ``a = sum exp(x - m) (x - m)``) from base-2 sums relative to
    ``ref2(my, c)``: ``s = sum 2**t`` and ``a = sum 2**t t``. Per row; see the module docstring."""
    c = inv_t * LOG2E
    m = my * inv_t
    k = tl.fma(my, inv_t, -m) * LOG2E - tl.fma(my, c, -ref2(my, c))  # exact residues, then base 2
    k = tl.where(my == float("-inf"), 0.0, k)
    scale = tl.exp2(k)
    if ENTROPY:
        a = (a + k * s) * (scale * LN2)
    return m, s * scale, a
