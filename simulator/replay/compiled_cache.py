"""The replay engine's compiled copies on disk, and the digest of the sources they come from.

numba's on-disk cache checks only the file a function is defined in, so after an edit of a
policy, of a helper such as ``policies/_heap.py`` or of the step loop, the entry points would
keep running their old compiled copy. ``drop_stale_compiled_copies`` drops the cached machine
code of every engine module when any of their sources changed. ``engine_digest`` names the
engine's semantics: caches of replay results (the planner's miss profiles) include it, so an
engine change never reuses a stale replay. This module imports neither numpy nor numba.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The compiled engine modules of this package (the policies' modules are all compiled).
ENGINE_MODULES = ("step", "entries")


def _sources(here: Path) -> list[Path]:
    return [*(here / f"{m}.py" for m in ENGINE_MODULES), *sorted((here / "policies").glob("*.py"))]


def _digest(here: Path) -> str:
    return hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in _sources(here) if p.exists())).hexdigest()


@cache
def engine_digest() -> str:
    """SHA-1 of the engine's sources (step loop, entry points, policies)."""
    return _digest(HERE)


def drop_stale_compiled_copies(here: Path = HERE) -> None:
    """When the engine or a policy module changed since the last call, drop their cached machine code."""
    digest = _digest(here)
    dirs = [here / "__pycache__", here / "policies" / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):  # numba mirrors the source tree under it
        root = Path(os.environ["NUMBA_CACHE_DIR"])
        dirs += [root / str(d.parent.resolve()).lstrip(os.sep) for d in dirs]
    stamp = dirs[0] / "replay-sources.sha1"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    for d in dirs:
        patterns = ["*.nb[ic]"] if d.parent.name == "policies" else [f"{m}.*.nb[ic]" for m in ENGINE_MODULES]
        for pattern in patterns:
            for f in d.glob(pattern):
                f.unlink(missing_ok=True)
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(digest)
        tmp.replace(stamp)
    except OSError:  # a read-only install: numba then compiles in memory
        pass
