"""The notebooks execute from notebooks/, Jupyter's default working folder (their data paths
resolve from the repository); outputs are not kept in the repo."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


# policy_comparison (~100 s on 2 cores: every policy over the bundled traces) and
# capacity_planning (~50 s: plans at every concurrency) run in the slow tier.
SLOW = pytest.mark.slow


@pytest.mark.parametrize("name", [pytest.param("policy_comparison.ipynb", marks=SLOW),
                                  pytest.param("capacity_planning.ipynb", marks=SLOW), "calibration_report.ipynb"])
def test_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout's package
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook shows its figures"
