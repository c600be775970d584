"""Launch a CuPy-loaded kernel with launch attributes (the driver's cuLaunchKernelEx, via ctypes).

CuPy's RawKernel launches plainly or cooperatively but takes no launch attributes, and
programmatic dependent launch (PDL: the kernel's blocks may start while the kernel before it in
the stream finishes; the kernel orders itself with ``griddepcontrol.wait``) is one. The structs
below follow ``CUlaunchConfig`` and ``CUlaunchAttribute`` in CUDA 12/13's cuda.h.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

ATTR_COOPERATIVE = 2  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("numAttrs", ctypes.c_uint)]


assert ctypes.sizeof(_Attr) == 72 and ctypes.sizeof(_Config) == 56


@cache
def _driver() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return lib


_SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
            np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64}


def _param(a: Any) -> Any:
    if hasattr(a, "data") and hasattr(a.data, "ptr"):  # a cupy array: its device pointer
        return ctypes.c_void_p(int(a.data.ptr))
    if isinstance(a, np.generic) and a.dtype in _SCALARS:
        return _SCALARS[a.dtype](a.item())
    raise TypeError(f"kernel argument of type {type(a).__name__} is not supported by launch_ex")


def launch_ex(function_ptr: int, grid: int, block: int, shared_mem: int, stream_ptr: int, args: tuple,
              *, cooperative: bool, programmatic: bool) -> None:
    """cuLaunchKernelEx(function, grid, block, args) with the attributes asked for; raises
    RuntimeError naming the driver's error code if the launch is refused."""
    attrs = []
    if programmatic:
        attrs.append(ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
    if cooperative:
        attrs.append(ATTR_COOPERATIVE)
    arr = (_Attr * max(1, len(attrs)))()
    for i, ident in enumerate(attrs):
        arr[i].id = ident
        arr[i].value = 1
    cfg = _Config(int(grid), 1, 1, int(block), 1, 1, int(shared_mem), ctypes.c_void_p(int(stream_ptr) or None),
                  arr, len(attrs))
    params = [_param(a) for a in args]
    ptrs = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
    err = _driver().cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(int(function_ptr)), ptrs, None)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {err} (attributes {attrs})")
