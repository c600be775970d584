"""Shared pytest fixtures and the GPU skip rule."""

from __future__ import annotations

import pytest


def _have_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU / CuPy on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
