"""Write the engine's compiled dispatch from the registry: ``python -m simulator.replay.policies.generate``.

numba compiles one copy of the step loop per policy when the policy id is a constant, so every
hook is a direct call (a run-time id costs a dispatch on every hook: 0.35-0.54 s instead of
0.23 s on 41 M accesses). That needs, per policy, a branch in each hook ladder and an entry
point calling the loop with its id. Those are generated here into two checked-in modules (numba's
on-disk cache needs a real source file), so the registry stays the one place a policy is named:

- ``policies/dispatch.py``: the five hooks (init, victim, insert, hits, order), each a ladder
  over the registry's ids that folds away for a constant id;
- ``entries.py``: one compiled entry point per policy, and ``ENTRIES`` in registry order.

tests/test_replay_registry.py regenerates both and compares them with the files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import REGISTRY, PolicyEntry

HERE = Path(__file__).resolve().parent
DISPATCH = HERE / "dispatch.py"
ENTRIES = HERE.parent / "entries.py"

_HEADER = '''"""{doc}

Generated from the registry (simulator/replay/policies/__init__.py) by
``python -m simulator.replay.policies.generate``: do not edit.
"""

from __future__ import annotations

'''

# hook -> (arguments after pid, whether it returns a value)
HOOKS: dict[str, tuple[str, bool]] = {
    "init": ("sw, pw, g, B, cmax", False),
    "victim": ("sw, pw, g, B, cmax, mark, stamp, slot_pos, pos", True),
    "insert": ("sw, pw, g, B, cmax, slot, pos, nu, stamp", False),
    "hits": ("sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh", False),
    "order": ("sw, pw, g, B, cmax, out", True),
}

# The step loop's arguments after pid (step.py: run), as the entry points pass them on.
STEP_ARGS = "a, b, c, d, e, f, g, h, i, j, k, m, n, o, p"
# step.run_placed's two more (policies registered with placed=True): steps per commit, parameter.
PLACED_ARGS = "q, r"


def _hook(name: str, args: str, returns: bool, registry: tuple[PolicyEntry, ...]) -> str:
    lines = ["", "", "@njit(cache=True)", f"def {name}(pid, {args}):  # pragma: no cover - compiled",
             "    literally(pid)  # one compiled copy per policy: the other branches fold away"]
    for pid, entry in enumerate(registry):
        lines.append(f"    {'if' if pid == 0 else 'elif'} pid == {pid}:  # {entry.name}")
        lines.append(f"        {'return ' if returns else ''}{entry.module}.{name}({args})")
    lines.append("    else:")
    lines.append(f'        raise ValueError("{name}: no policy with this id")')
    return "\n".join(lines) + "\n"


def dispatch_source(registry: tuple[PolicyEntry, ...] = REGISTRY) -> str:
    modules = sorted({e.module for e in registry})
    out = _HEADER.format(doc="The policy hooks the step loop calls, one ladder each over the registry's ids.")
    out += "from numba import literally, njit\n\n"
    out += f"from . import {', '.join(modules)}\n"
    out += f"\n# The policy modules in registry order: MODULES[pid].\nMODULES = {_tuple(e.module for e in registry)}\n"
    for name, (args, returns) in HOOKS.items():
        out += _hook(name, args, returns, registry)
    return out


def _tuple(names) -> str:
    names = list(names)
    return f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"


def _entry_name(entry: PolicyEntry) -> str:
    return "replay_" + entry.name.replace("-", "_")


def entries_source(registry: tuple[PolicyEntry, ...] = REGISTRY) -> str:
    out = _HEADER.format(doc="One compiled entry point per policy: the step loop with the policy's id as a constant.")
    out += "from numba import njit\n\nfrom . import step\n"
    for pid, entry in enumerate(registry):
        # A placed policy's loop takes two more arguments: trace steps per commit, the policy's parameter.
        args, loop = (f"{STEP_ARGS}, {PLACED_ARGS}", "run_placed") if entry.placed else (STEP_ARGS, "run")
        out += (f"\n\n@njit(cache=True, nogil=True)\n"
                f"def {_entry_name(entry)}({args}):  # pragma: no cover - compiled\n"
                f"    return step.{loop}({pid}, {args})\n")
    out += f"\n\n# In registry order: ENTRIES[pid].\nENTRIES = {_tuple(_entry_name(e) for e in registry)}\n"
    return out


def outputs() -> dict[Path, str]:
    """Each generated file with the text it should hold."""
    return {DISPATCH: dispatch_source(), ENTRIES: entries_source()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the engine's dispatch from the policy registry.")
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = parser.parse_args(argv)
    stale = [path for path, text in outputs().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path}: out of date (python -m simulator.replay.policies.generate)")
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs()[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
