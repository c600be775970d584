"""CuPy RawKernels for the two GPU halves of a HiSparse decode step, and a Triton fused-MoE GEMM
(``fused_moe``) that times the routed experts the way SGLang runs them.

Importing this package needs no GPU; each kernel module imports CuPy (or Triton) lazily
and raises a clear error when no GPU or CuPy is present.
"""
