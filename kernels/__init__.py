"""Pure Triton kernels and their thin launchers (installed as ``pacs_fast.kernels``).

This package imports only ``triton`` and ``torch``; it never imports the rest of ``pacs_fast``.
Autograd wrappers and backend dispatch live in ``pacs_fast.ops``.
"""

# Options every launch passes (and the AOT compile, kernels/aot.py): FP fusion (a multiply and an add
# contracted to one FMA) asked for explicitly. Triton 3.9 warns on every first compile that its default
# turns it off in 3.10; the epilogues' instruction counts (docs/GPU.md) assume it on. The accuracy-critical
# FMAs are explicit (``tl.fma``) either way.
LAUNCH_OPTIONS = {"enable_fp_fusion": True}
