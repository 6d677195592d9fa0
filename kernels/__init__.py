"""Pure Triton kernels and their thin launchers (installed as ``pacs_fast.kernels``).

This package imports only ``triton`` and ``torch``; it never imports the rest of ``pacs_fast``.
Autograd wrappers and backend dispatch live in ``pacs_fast.ops``.
"""
