"""The policy registry is the one place a policy is named.

The engine's compiled dispatch is generated from it (and must be current), and a new policy is
one module plus one registry line: the test below adds one to a copy of the package and replays
it through the engine and the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simulator.replay import policies
from simulator.replay.policies import generate

ROOT = Path(__file__).resolve().parent.parent


def test_generated_dispatch_is_current():
    for path, text in generate.outputs().items():
        assert path.read_text() == text, f"{path.name} is stale: run python -m simulator.replay.policies.generate"


def test_every_registered_module_declares_state_and_hooks():
    from simulator.replay.policies import dispatch

    assert len(dispatch.MODULES) == len(policies.REGISTRY)
    for entry, module in zip(policies.REGISTRY, dispatch.MODULES, strict=True):
        assert module.__name__.rsplit(".", 1)[1] == entry.module
        assert isinstance(module.STATE, policies.PolicyState), entry.name
        for hook in generate.HOOKS:
            assert callable(getattr(module, hook)), (entry.name, hook)
    assert [p.value for p in policies.Policy] == list(policies.POLICIES)


# A dummy policy: LRU by a scan for the oldest use stamp. Sequentially (one access at a time)
# that is exactly LRU, so its misses must equal the registered lru's.
DUMMY = '''"""LRU-SCAN: the unprotected slot used longest ago, found by a scan (a registry test's dummy)."""

from __future__ import annotations

from numba import njit

from . import PolicyState

STATE = PolicyState(slot_rows=1, position_rows=0, scalars=1)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    g[0] = 0


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    best = -1
    for s in range(B):
        if mark[s] != stamp and (best < 0 or sw[0][s] < sw[0][best]):
            best = s
    return best


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    g[0] += 1
    sw[0][slot] = g[0]


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    for i in range(nh):
        g[0] += 1
        sw[0][hit_slots[i]] = g[0]


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0
'''

REGISTRY_LINE = '    PolicyEntry("lru-scan", "lru_scan", "LRU found by a scan (test dummy)"),\n'


@pytest.mark.slow  # a copy of the package without its numba cache: every policy compiled from scratch (minutes on 2 cores)
def test_a_new_policy_is_one_module_and_one_registry_line(tmp_path):
    copy = tmp_path / "simulator"
    shutil.copytree(ROOT / "simulator", copy, ignore=shutil.ignore_patterns("__pycache__", "*.nb[ic]"))
    pol = copy / "replay" / "policies"
    (pol / "lru_scan.py").write_text(DUMMY)  # the one file
    init = (pol / "__init__.py").read_text()
    anchor = "REGISTRY: tuple[PolicyEntry, ...] = (\n"
    assert anchor in init
    (pol / "__init__.py").write_text(init.replace(anchor, anchor + REGISTRY_LINE))  # the one line
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "HISPARSE_CACHE": str(tmp_path / "cache")}

    def run(*args: str) -> str:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              check=True).stdout

    assert "wrote" in run("-m", "simulator.replay.policies.generate")
    assert "lru-scan" in run("-m", "simulator.cli", "replay", "--help")

    rng = np.random.default_rng(5)
    rows = [rng.choice(60, size=12, replace=False) for _ in range(80)]
    np.save(tmp_path / "t.npy", np.array(rows, dtype=np.int32))
    out = json.loads(run("-m", "simulator.cli", "replay", "t.npy", "--ctx0", "60", "--policy", "lru-scan,lru",
                         "--buffer", "16,30", "--semantics", "sequential", "--quiet", "--json"))
    misses = {(r["policy"], r["buffer"]): r["misses"] for r in out}
    assert set(misses) == {(p, b) for p in ("lru-scan", "lru") for b in (16, 30)}
    for b in (16, 30):
        assert misses["lru-scan", b] == misses["lru", b] > 0
