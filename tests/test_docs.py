"""The user documentation stays true: the generated preset reference equals what the specs say,
every relative link resolves, every one-command answer of the README's how-to table runs, every
command of the docs' examples parses, and the README's accuracy table and the docs' quoted tie band
are the validation's current figures."""
from __future__ import annotations

import json
import re
import shlex
import statistics
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


# the docs whose examples describe the current tool (validation.md and BENCHMARKS.md are dated notebooks)
CURRENT_DOCS = [d for d in DOCS if d.name != "validation.md"] + [ROOT / "traces" / "README.md"]


def _block_commands(text: str) -> list[str]:
    """The ``hisparse ...`` command lines of a page's code blocks (``$ `` / ``time `` prefixes and
    backslash continuations joined)."""
    out, inside, buf = [], False, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        s = line.strip()
        if not inside or not (buf or re.match(r"^(\$ )?(time )?hisparse ", s)):
            continue
        buf = f"{buf} {s}" if buf else re.sub(r"^(\$ )?(time )?", "", s)
        if buf.endswith("\\"):
            buf = buf[:-1]
            continue
        out.append(buf)
        buf = ""
    return out


def test_doc_example_commands_parse():
    """Every example command in the docs' code blocks parses with the CLI's own parser (a renamed
    option, or a shell redirect where the command takes --out, breaks this)."""
    from simulator import cli

    cmds = [(doc, c) for doc in CURRENT_DOCS for c in _block_commands(doc.read_text())]
    assert len(cmds) >= 15
    for doc, cmd in cmds:
        argv = shlex.split(cmd, comments=True)[1:]
        try:
            cli.build_parser(argv[0]).parse_args(argv)
        except SystemExit:
            pytest.fail(f"{doc.relative_to(ROOT)}: {cmd!r} does not parse")


def _pct(x: float) -> int:
    return round(100 * x)


def test_readme_accuracy_table_is_current():
    """The README's accuracy table (per set: points, median and max |error|) equals the validation's
    per-set errors in bands.json (kept current by the slow test of serving/bands.py)."""
    sets = json.loads((ROOT / "simulator" / "presets" / "published" / "bands.json").read_text())["sets"]
    errors = {name: [e for group in ("systems", "ttft") for sys in s[group].values() for e in sys["abs_errors"]]
              for name, s in sets.items()}
    rows = {"HiSparse paper": "paper-glm51-8xh200", "#30985": "issue-30985-baseline",
            "low-latency": "cookbook-glm52-h200-low-latency", "balanced": "cookbook-glm52-h200-balanced",
            "high-throughput": "cookbook-glm52-h200-high-throughput", "DeepSeek-V4-Flash": "lmsys-dsv4-flash-h200",
            "DeepSeek-V4-Pro": "lmsys-dsv4-pro-b200", "#33075": "pr33075-rtx-pro-6000",
            "#30514": "pr30514-dsv32-h200-prefill"}
    table = (ROOT / "README.md").read_text().split("## Accuracy", 1)[1].split("\n## ", 1)[0]
    seen = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 4 or not cells[2].endswith("%"):
            continue
        if cells[0] == "all measured points":
            errs = [e for v in errors.values() for e in v]
        else:
            (name,) = [n for key, n in rows.items() if key in cells[0]]
            errs = errors[name]
            seen.add(name)
        assert re.match(rf"^{len(errs)}\b", cells[1]), f"README accuracy row {cells[0]!r}: {len(errs)} points"
        median, largest = (float(c.rstrip("%")) for c in cells[2:])
        assert round(median) == _pct(statistics.median(errs)), f"README accuracy row {cells[0]!r}: median"
        assert largest == _pct(max(errs)), f"README accuracy row {cells[0]!r}: max"
    assert seen == set(sets), f"README accuracy table: sets missing {set(sets) - seen}"


def test_quoted_tie_band_is_current():
    """Where the docs quote the model's error band (the tie band of the recommendation and the
    what-ifs' verdicts), it is the one the plan uses now (MODEL_ERROR_BAND, from bands.json)."""
    from simulator.serving.slo import MODEL_ERROR_BAND

    pattern = re.compile(r"(?:error band \(?|\(band |validated error \(|model's )(\d+)%")
    stale = [f"{d.relative_to(ROOT)}: {m.group(0)}" for d in CURRENT_DOCS for m in pattern.finditer(d.read_text())
             if int(m.group(1)) != _pct(MODEL_ERROR_BAND)]
    assert not stale, f"the model's error band is {MODEL_ERROR_BAND:.0%} now: {stale}"
