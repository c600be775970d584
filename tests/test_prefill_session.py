"""CPU checks of benchmarks/prefill_session.sh, the one device call for the prompt-chunk kernels.

The device run itself needs a Hopper GPU; what can fail here: a benchmark option the script passes that the
benchmark no longer takes (the call would then spend its device time on a usage error), and the script's own
errors (an unknown step, a folder without the carried pieces) exiting 2 before any GPU work.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "prefill_session.sh"


def _invocations() -> list[tuple[str, list[str]]]:
    """(benchmark path, the --options it is called with) for each python call in the script."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    calls = []
    for m in re.finditer(r"\$py (benchmarks/\w+\.py)([^|]*)\|", text):
        calls.append((m.group(1), re.findall(r"(--[a-z][a-z-]*)", m.group(2))))
    return calls


def test_every_benchmark_option_the_script_passes_exists():
    calls = _invocations()
    assert {p for p, _ in calls} == {"benchmarks/deepgemm_mqa_logits.py", "benchmarks/flashmla_prefill.py"}
    for path, opts in calls:
        source = (ROOT / path).read_text()
        taken = set(re.findall(r'add_argument\("(--[a-z-]+)"', source))
        assert opts and set(opts) <= taken, f"{path}: {sorted(set(opts) - taken)} not among its options"


def test_script_parses_and_names_an_unknown_step(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    r = subprocess.run(["bash", str(SCRIPT), "bench", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown step 'bench'" in r.stderr


def test_run_without_the_carried_pieces_stops_before_any_benchmark(tmp_path):
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "PY": "python3"}
    r = subprocess.run(["bash", str(SCRIPT), "run", str(tmp_path / "empty"), "quick"], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "has no flashmla-src.tar.gz" in r.stderr and "prepare" in r.stderr
    assert not out.exists()


def test_run_names_the_one_piece_missing(tmp_path):
    carried = tmp_path / "carried"
    carried.mkdir()
    for name in ("flashmla-src.tar.gz", "sgl_deep_gemm-0.1.3-py3-none-manylinux2014_x86_64.whl"):
        (carried / name).write_bytes(b"")
    r = subprocess.run(["bash", str(SCRIPT), "run", str(carried)], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}, cwd=tmp_path)
    assert r.returncode == 2 and "has no apache_tvm_ffi-0.1.9-*.whl" in r.stderr
    assert sorted(p.name for p in carried.iterdir()) == ["flashmla-src.tar.gz",
                                                          "sgl_deep_gemm-0.1.3-py3-none-manylinux2014_x86_64.whl"]
