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

from tests.helpers import WORKLOAD_8K1K

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


# The user docs whose ``$ hisparse ...`` code blocks show real output (trimmed with ``...``): each such
# command runs, and every shown output line is found in what it prints today.
OUTPUT_DOCS = ["deployments-whatifs.md", "models-and-indexshare.md", "moe-kernels.md", "reports.md",
               "residency-and-multi-node.md", "speculative-decoding.md"]
# inputs the docs describe in words: 8k1k.toml (a closed loop of 8192 in / 1024 out, 2 requests per
# client) and g52.hst (the replay example's comment: trace gen --index-share 4:3 --layers 12 --requests 1
# --steps 200)
G52_GEN = ["trace", "gen", "--index-share", "4:3", "--layers", "12", "--requests", "1", "--steps", "200",
           "--out", "g52.hst"]


def _output_examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of each code block that starts with ``$ `` (continuations joined,
    ``time `` and ``PYTHONPATH=$PWD python -m simulator.cli`` read as ``hisparse``); the shown lines stop
    at a ``real`` timing line."""
    out = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        lines = block.splitlines()
        if not lines or not lines[0].startswith("$ "):
            continue
        cmd, i = "", 0
        while i < len(lines):
            part = lines[i].strip()
            i += 1
            cmd += " " + part.rstrip("\\")
            if not part.endswith("\\"):
                break
        cmd = re.sub(r"^\s*\$ (time )?(PYTHONPATH=\$PWD python -m simulator\.cli )?", "", " ".join(cmd.split()))
        if not cmd.startswith("hisparse "):
            cmd = "hisparse " + cmd
        shown = []
        for line in lines[i:]:
            if line.startswith("real "):
                break
            shown.append(line)
        out.append((cmd, shown))
    return out


def _missing_lines(shown: list[str], printed: str) -> list[str]:
    """The shown lines no printed line matches: a shown line's pieces between ``...`` must appear, in
    order, in one printed line (whitespace runs read as one space; a line the doc wraps is matched piece by
    piece, each wrapped part on its own)."""
    norm = [" ".join(p.split()) for p in printed.replace(str(ROOT) + "/", "").splitlines()]

    def found(pieces: list[str], out_line: str) -> bool:
        at = 0
        for p in pieces:
            at = out_line.find(p, at)
            if at < 0:
                return False
            at += len(p)
        return True

    missing = []
    for line in shown:
        pieces = [q for q in (" ".join(p.split()) for p in line.split("...")) if q]
        if pieces and not any(found(pieces, o) for o in norm):
            missing.append(line)
    return missing


def test_output_example_matching_reads_pieces_in_order():
    printed = f"== hisparse (x), on\n    1   66.0   66.0   8.24   14.5   14.5 0.103   +-6%\ncost: {ROOT}/a.json\n"
    assert _missing_lines(["    1     66.0 ...  14.5   14.5 ... 0.103   +-6%", "...", "cost: a.json"], printed) == []
    assert _missing_lines(["    1     66.1 ...  14.5"], printed) == ["    1     66.1 ...  14.5"]
    assert _missing_lines(["0.103 ... 66.0"], printed) == ["0.103 ... 66.0"]  # order counts
    cmds = _output_examples("```\n$ time PYTHONPATH=$PWD python -m simulator.cli plan --a \\\n    --b\nout 1\n"
                            "real 0m1s\nlater\n```\n```\nhisparse plan\n```\n")
    assert cmds == [("hisparse plan --a --b", ["out 1"])]


@pytest.mark.slow
@pytest.mark.parametrize("doc", OUTPUT_DOCS)
def test_doc_example_outputs_are_current(doc: str, tmp_path: Path):
    """Every ``$ hisparse ...`` example with output in these docs prints today what the doc shows (run in
    a fresh folder with the inputs the docs describe; about 10-60 s a page on 2 cores)."""
    examples = _output_examples((ROOT / "docs" / doc).read_text())
    assert examples, f"docs/{doc}: no $ example"
    (tmp_path / "8k1k.toml").write_text(WORKLOAD_8K1K)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg",
           "HISPARSE_CACHE": str(tmp_path / "cache")}

    def cli(argv):
        return subprocess.run([sys.executable, "-m", "simulator.cli", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600, env=env)

    stale = []
    for cmd, shown in examples:
        argv = shlex.split(cmd, comments=True)[1:]
        argv = [str(ROOT / a) if a.startswith(("traces/", "examples/")) else a for a in argv]
        if "g52.hst" in argv and not (tmp_path / "g52.hst").exists():
            assert cli(G52_GEN).returncode == 0
        r = cli(argv)
        assert r.returncode == 0, f"docs/{doc}: {cmd}: {r.stderr[-2000:]}"
        stale += [f"{cmd[:60]}...: {line.strip()}" for line in _missing_lines(shown, r.stdout + r.stderr)]
    assert not stale, f"docs/{doc}: shown output no longer printed:\n" + "\n".join(stale)


def test_moe_kernels_verify_pass_table_is_current():
    """docs/moe-kernels.md's verify pass of the balanced cell (8 requests per rank, 8.7K-token contexts,
    EAGLE 1-1-2 at the multinomial mean 1.69) equals ``CostModel.pass_time`` now, with DeepEP and without."""
    import dataclasses

    from simulator.costmodel import Pass
    from simulator.serving.scenario import load_scenario
    from simulator.serving.speculative import parse_speculative

    text = (ROOT / "docs" / "moe-kernels.md").read_text()
    table = text.split("| | `none` (before) | `deepep` |", 1)[1].split("\n\n", 1)[0]
    rows = {cells[0].strip("* "): cells[1:] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:])}
    sc = load_scenario(model="glm-5.2-fp8", deployment="8xh200-dp8-ep8-glm52-balanced",
                       speculative=parse_speculative("eagle:1-1-2", accept_len=1.69))
    for col, backend in enumerate(("none", "deepep")):
        c = sc.cost_model(deployment=dataclasses.replace(sc.deployment, moe_a2a_backend=backend), spec=sc.speculative)
        t = c.pass_time(dataclasses.replace(Pass.uniform(8, 8704.0, 8), verify=2, accepted=1.69, drafts=True))
        got = {"routed experts": t.parts["routed experts"][0], "collectives": t.parts["collectives"][0],
               "draft pass (MTP layer)": t.parts["draft passes (MTP layer)"][0], "pass": t.total_s[0]}
        for name, seconds in got.items():
            shown = rows[name][col].strip("* ").removesuffix(" ms")
            places = len(shown.split(".")[1])
            assert float(shown) == pytest.approx(round(1e3 * float(seconds), places), abs=1e-9), (
                f"docs/moe-kernels.md verify pass, {backend}, {name}: {shown} ms, now {1e3 * float(seconds):.2f}")
