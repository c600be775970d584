"""CuPy RawKernels for the two GPU halves of a HiSparse decode step.

Importing this package needs no GPU; each kernel module imports CuPy lazily
and raises a clear error when no GPU or CuPy is present.
"""
