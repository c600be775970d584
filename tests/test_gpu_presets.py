"""Every shipped GPU preset cites a source for each figure it sets (#25 item 3): every numeric key
carries a trailing comment or a ``[sources]`` entry, the figures the planner leans on are written out
(not left to a default), FP4 tensor rates are 0 on Hopper and positive on Blackwell, and HBM bytes are
what a datasheet's GB (or the driver's MiB for that GB) can be."""

from __future__ import annotations

import dataclasses
import tomllib
import typing

import pytest

from simulator.serving import presets as P
from simulator.serving import specs
from simulator.serving.specs import GpuSpec

GPUS = P.preset_names("gpus")
# The vendor's capacity in GB for each part (what its datasheet or spec page says). The preset holds
# the bytes nvidia-smi reports where a published log gives MiB (GiB-sized stacks less a reserve: about
# 6.9% above the GB figure), or the GB figure itself.
DATASHEET_GB = {"h100": 80, "h200": 141, "h20": 96, "h20-141g": 141, "gh200": 144, "b200": 180,
                "rtx-pro-6000": 96}
HOPPER = {"h100", "h200", "h20", "h20-141g", "gh200"}
BLACKWELL = {"b200", "rtx-pro-6000"}
# keys every preset writes out with its source rather than inherit a default
REQUIRED = {"hbm_bytes", "hbm_bw", "bf16_flops", "fp4_flops", "link", "link_bw", "gather_efficiency",
            "gather_efficiency_large_rows", "gpus_per_node"}
NUMERIC = {k for k, v in typing.get_type_hints(GpuSpec, globalns=vars(specs)).items() if v in (float, int)}


def _top_level_lines(text: str) -> dict[str, str]:
    """key -> the comment after its value ('' when none), for the keys before the first table. The
    comment starts at the first '#' before which the value parses on its own (a '#' inside a string
    leaves it unterminated)."""
    out = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            break
        if not stripped or stripped.startswith("#") or "=" not in stripped:
            continue
        key, rest = (s.strip() for s in stripped.split("=", 1))
        comment = ""
        for i, ch in enumerate(rest):
            if ch == "#" and _parses(rest[:i]):
                comment = rest[i + 1:].strip()
                break
        out[key] = comment
    return out


def _parses(value: str) -> bool:
    try:
        tomllib.loads(f"v = {value}")
        return True
    except tomllib.TOMLDecodeError:
        return False


def test_every_shipped_gpu_is_classified():
    assert set(GPUS) == set(DATASHEET_GB) == HOPPER | BLACKWELL and not HOPPER & BLACKWELL


@pytest.mark.parametrize("name", GPUS)
def test_every_numeric_key_has_a_source(name):
    path = P.PRESET_DIR / "gpus" / f"{name}.toml"
    text = path.read_text()
    data = tomllib.loads(text)
    sources = data.get("sources", {})
    assert isinstance(sources, dict) and all(isinstance(v, str) and v.strip() for v in sources.values())
    known = {f.name for f in dataclasses.fields(GpuSpec)}
    assert set(sources) <= known, f"{path}: [sources] names unknown keys {sorted(set(sources) - known)}"
    lines = _top_level_lines(text)
    assert REQUIRED <= set(lines), f"{path}: figures left to defaults: {sorted(REQUIRED - set(lines))}"
    numeric = [k for k, v in data.items() if k in NUMERIC and isinstance(v, (int, float))]
    assert numeric and set(numeric) <= set(lines)
    unsourced = [k for k in numeric if not lines[k] and k not in sources]
    assert not unsourced, f"{path}: no comment or [sources] entry for {unsourced}"
    assert "link" in sources or lines["link"], f"{path}: the host link names no source"
    gpu = P.load("gpus", name)  # and the file loads, sources included
    assert dict(gpu.sources) == sources


def test_the_sources_table_is_read_by_the_spec():
    gpu = P.load("gpus", "h200")
    assert "143,771 MiB" in gpu.sources["hbm_bytes"] and "BRIEF 3" in gpu.sources["hbm_bw"]


def test_a_source_that_is_not_text_is_refused(tmp_path):
    """[sources] is a table of citations: `foo = 5` under it was accepted (the schema says a table of strings)."""
    from simulator.errors import HisparseError

    text = open("simulator/presets/gpus/h200.toml").read().replace("\n[sources]\n", "\n[sources]\nfoo = 5\n", 1)
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(HisparseError, match=r"g.toml: \[sources\] foo = 5: not a string"):
        P.load("gpus", str(path))


@pytest.mark.parametrize("name", GPUS)
def test_fp4_only_on_blackwell(name):
    gpu = P.load("gpus", name)
    if name in HOPPER:
        assert gpu.fp4_flops == 0.0
    else:
        assert gpu.fp4_flops > 0 and gpu.fp4_flops == pytest.approx(2 * gpu.fp8_flops)  # FP4 = 2 x FP8 dense


@pytest.mark.parametrize("name", GPUS)
def test_hbm_bytes_are_the_datasheet_gb_or_the_drivers_mib(name):
    gpu = P.load("gpus", name)
    ratio = gpu.hbm_bytes / (DATASHEET_GB[name] * 1e9)
    assert 1.0 <= ratio <= 1.08, f"{name}: {gpu.hbm_bytes:.4g} B against a {DATASHEET_GB[name]} GB datasheet"


@pytest.mark.parametrize("name", GPUS)
def test_datasheet_rates_are_dense_and_in_range(name):
    """Dense (not 2:4-sparse) rates: every shipped part is between the H20's 148 TFLOP/s BF16 and the
    B200's 2.25 PFLOP/s, and HBM between GDDR7's 1.8 and HBM3e's 8 TB/s."""
    gpu = P.load("gpus", name)
    bf16 = gpu.datasheet_bf16_flops or gpu.bf16_flops
    hbm = gpu.datasheet_hbm_bw or gpu.hbm_bw
    assert 1.4e14 <= bf16 <= 2.25e15 and 1.7e12 <= hbm <= 8.0e12
    if gpu.datasheet_bf16_flops:
        assert gpu.bf16_flops <= gpu.datasheet_bf16_flops and gpu.hbm_bw <= gpu.datasheet_hbm_bw  # measured below


def test_the_h200_keeps_its_measured_figures():
    gpu = P.load("gpus", "h200")
    assert (gpu.hbm_bw, gpu.bf16_flops, gpu.link_bw) == (4.266e12, 7.69e14, 55.0e9)  # BRIEF 3
    assert (gpu.datasheet_hbm_bw, gpu.datasheet_bf16_flops) == (4.8e12, 9.89e14)
    assert gpu.hbm_bytes == 150.75e9  # 143,771 MiB
