"""Real models (slow; run with -m slow): re-record the first steps of committed traces from the
commands documented in traces/README.md and compare them with the committed files."""

from __future__ import annotations

import re
import shlex
import sysconfig
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PREFIX_STEPS = 8


def _documented_command(name: str) -> list[str]:
    """The `hisparse trace record` command that traces/README.md gives for file ``name``."""
    readme = (ROOT / "traces" / "README.md").read_text()
    for line in readme.splitlines():
        if f"`{name}`" in line and "hisparse trace record" in line:
            cmd = re.search(r"`(hisparse trace record [^`]+)`", line).group(1)
            lib = sysconfig.get_paths()["stdlib"]
            return shlex.split(cmd.replace("$LIB", lib))
    raise AssertionError(f"no record command for {name} in traces/README.md")


def _with(argv: list[str], option: str, value: str) -> list[str]:
    i = argv.index(option)
    return argv[: i + 1] + [value] + argv[i + 2:]


@pytest.mark.parametrize("name", ["smollm2-gpl3-k128.hst"])
def test_rerecord_prefix_matches_committed(name, tmp_path) -> None:
    pytest.importorskip("torch")
    from simulator.cli import main
    from simulator.record.recorder import output_paths
    from simulator.trace import open_trace

    argv = _documented_command(name)
    assert argv[:3] == ["hisparse", "trace", "record"]
    argv = _with(argv, "--steps", str(PREFIX_STEPS))
    out = _with(argv, "--out", str(tmp_path / Path(argv[argv.index("--out") + 1]).name))
    assert main(out[1:] + ["--quiet"]) == 0
    ks = tuple(int(k) for k in argv[argv.index("--topk") + 1].split(","))
    for path in output_paths(out[out.index("--out") + 1], ks):
        committed = open_trace(ROOT / "traces" / path.name)
        fresh = open_trace(path)
        assert fresh.meta.source["model_sha256"] == committed.meta.source["model_sha256"]
        assert fresh.meta.source["text_files"] == committed.meta.source["text_files"]
        for key in committed.keys:
            a, b = committed.read(key), fresh.read(key)
            assert np.array_equal(a.ctx_len[:PREFIX_STEPS], b.ctx_len)
            assert np.array_equal(a.indices[:PREFIX_STEPS], b.indices), (path.name, key)
