"""The user documentation stays true: the generated preset reference equals what the specs say,
every relative link resolves, and every one-command answer of the README's how-to table runs."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_presets_reference_is_current():
    from simulator.serving.schema import markdown_reference

    committed = (ROOT / "docs" / "presets-reference.md").read_text()
    assert committed == markdown_reference(), (
        "docs/presets-reference.md is stale: python -m simulator.serving.schema > docs/presets-reference.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path):
    missing = []
    for target in LINK.findall(doc.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (doc.parent / target).exists():
            missing.append(target)
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def _howto_commands() -> list[str]:
    """The backticked `hisparse ...` commands of the README's how-to table, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## How-to", 1)[1].split("\n## ", 1)[0]
    return [c for c in re.findall(r"`(hisparse [^`]+)`", section)]


def test_howto_table_names_real_options():
    """Each how-to command parses with the CLI's own parser (a renamed option breaks this)."""
    from simulator import cli

    cmds = _howto_commands()
    assert len(cmds) >= 10
    for cmd in cmds:
        argv = shlex.split(cmd)[1:]
        parser = cli.build_parser(argv[0])
        parser.parse_args(argv)


@pytest.mark.slow
def test_howto_commands_run(tmp_path: Path):
    """Every how-to command runs from a fresh folder (files it names are made by the row before)."""
    env_cmds = []
    for cmd in _howto_commands():
        argv = shlex.split(cmd)[1:]
        argv = [str(ROOT / a) if a.startswith("traces/") else a for a in argv]
        env_cmds.append(argv)
    # the user's own trace of the "my own trace" row: a small generated one
    env_cmds.insert(0, ["trace", "gen", "--preset", "glm51-longbench", "--steps", "4", "--layers", "2",
                        "--requests", "1", "--out", "my.hst"])
    for argv in env_cmds:
        r = subprocess.run([sys.executable, "-m", "simulator.cli", *argv], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                "HOME": str(tmp_path), "MPLBACKEND": "Agg"})
        assert r.returncode == 0, f"hisparse {' '.join(argv)}: {r.stderr[-2000:]}"
