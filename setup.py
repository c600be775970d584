"""Builds the optional compiled fast paths (simulator/native/_native.c); everything else is in
pyproject.toml. ``optional=True``: without a C compiler the package installs and runs on its
numba references."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("simulator.native._native", ["simulator/native/_native.c"],
                             extra_compile_args=["-O3", "-funroll-loops"], optional=True)])
