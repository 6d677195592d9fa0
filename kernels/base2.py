"""Base-2 softmax arithmetic shared by the log-prob kernels' epilogues.

The kernels evaluate ``exp(x - m)`` as ``exp2(t)``, ``t = (x - m) log2(e)``: one ``ex2.approx.ftz``
instruction per logit, where ``tl.exp`` adds a multiply by log2(e) and a denormal guard (a compare
and two multiplies; the flushed terms are below 2**-126 of the row's largest). The logits arrive
unscaled, ``y`` with ``x = y * inv_t`` (inv_t > 0), and the row max is taken of ``y``:

    t = (y - my) * c,    c = fp32(inv_t * log2 e),    my = the row max of y,

a subtraction that is exact for the large terms (Sterbenz) and one multiply, whatever the logits'
magnitude (a -1e30 padding bias, a vocabulary block masked in full). The sums ``s = sum 2**t`` and
``a = sum 2**t t`` are then relative to ``my * inv_t`` exactly, while the partial the merge expects
is relative to ``m = fp32(my * inv_t)``; ``natural_partial`` moves them there once per row with the
exact rounding residue of that product (one FMA) and into natural units. Without it, a temperature
would shift every term of a row by up to ulp(m) / 2 (1.5e-5 at logits of 300) as the rounding of
``logits * inv_t`` did before.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
# exp2(t) is 0 in fp32 for t below -150 (denormals end at 2**-149): t clamped here keeps 0 * t finite
# where t = -inf (a masked column, a -inf bias or logit) without changing any term that is not 0
T_MIN = tl.constexpr(-1024.0)


@triton.jit
def finite_max(my):
    """The reference of rows whose max of y is ``my``: ``my``, or 0 where it is -inf (every term of
    such a row is 0, and -inf - -inf would be NaN)."""
    return tl.where(my == float("-inf"), 0.0, my)


@triton.jit
def natural_partial(my, s, a, inv_t, ENTROPY: tl.constexpr):
    """The partial ``(m, s, a)`` of ``x = y * inv_t`` that the merge expects (``m = fp32(my * inv_t)``,
    ``s = sum exp(x - m)``, ``a = sum exp(x - m) (x - m)``) from base-2 sums relative to ``my * inv_t``:
    ``s = sum 2**t``, ``a = sum 2**t t``. Per row; see the module docstring. The shift ``k`` (base 2) is
    below 0.4 wherever |m| < 2**22; bounded by 1 it keeps rows of absurd magnitude finite."""
    m = my * inv_t
    k = tl.where(my == float("-inf"), 0.0, tl.fma(my, inv_t, -m) * LOG2E)  # the product's exact residue
    k = tl.minimum(tl.maximum(k, -1.0), 1.0)
    scale = tl.exp2(k)
    if ENTROPY:
        a = (a + k * s) * (scale * LN2)
    return m, s * scale, a
