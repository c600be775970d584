"""Dependencies point one way: cli -> commands -> serving/calibration/sweep -> replay -> trace -> native.

Read from the sources (every import statement, the ones inside functions too), so an import
that only runs on some path still counts:
- ``cupy_kernels`` (the GPU kernels) imports nothing from ``simulator``: the simulator checks the
  kernels against its engine, not the other way round (the reference lives in
  ``simulator/replay/swap_in_reference.py``);
- ``simulator.trace`` imports nothing from ``simulator.replay``: an analysis that replays belongs
  above replay.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in one file of the repository."""
    package = list(path.relative_to(ROOT).parts[:-1])  # a module's package (an __init__'s own)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names = [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
            out += [(node.lineno, n) for n in names]
    return out


def _offenders(folder: str, forbidden: str) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {name}"
            for path in sorted((ROOT / folder).rglob("*.py"))
            for line, name in _imports(path) if name == forbidden or name.startswith(forbidden + ".")]


def test_the_import_reader_resolves_relative_imports():
    names = {name for _, name in _imports(ROOT / "simulator" / "replay" / "engine.py")}
    assert {"simulator.replay.compiled_cache", "simulator.replay.entries", "simulator.replay.policies"} <= names


def test_kernels_import_nothing_from_the_simulator():
    assert not _offenders("cupy_kernels", "simulator"), "\n".join(_offenders("cupy_kernels", "simulator"))


def test_trace_imports_nothing_from_replay():
    found = _offenders("simulator/trace", "simulator.replay")
    assert not found, "simulator.trace must not depend on simulator.replay:\n" + "\n".join(found)


def test_the_wheel_carries_what_the_package_reads_from_the_checkout():
    """``setup.py`` copies ``simulator.bundled.FILES`` into the wheel (it cannot import the package
    it builds, so it keeps its own copy of the list): the two lists agree and every pattern matches."""
    from simulator.bundled import FILES

    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "BUNDLED")
    assert tuple(listed) == FILES
    assert all(list(ROOT.glob(pattern)) for pattern in FILES)
