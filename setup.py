"""Builds the optional compiled fast paths (simulator/native/_native.c) and copies the checkout's
data files the package reads (``simulator/bundled.py``: the default trace, the generator presets,
the published targets) into the built package; everything else is in pyproject.toml.
``optional=True``: without a C compiler the package installs and runs on its numba references."""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = ("traces/glm51-longbench.hst", "traces/generated/*.hst", "traces/presets/*.toml", "traces/targets/*.toml")  # = simulator.bundled.FILES


class BuildWithData(build_py):
    """build_py, then the checkout's data files into ``simulator/_bundled/`` of the build."""

    def run(self) -> None:
        super().run()
        for pattern in BUNDLED:
            found = sorted(ROOT.glob(pattern))
            if not found:
                raise SystemExit(f"setup.py: {pattern}: no such file in the checkout")
            for src in found:
                dst = Path(self.build_lib) / "simulator" / "_bundled" / src.relative_to(ROOT)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


setup(cmdclass={"build_py": BuildWithData},
      ext_modules=[Extension("simulator.native._native", ["simulator/native/_native.c"],
                             extra_compile_args=["-O3", "-funroll-loops"], optional=True)])
