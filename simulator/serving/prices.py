"""Cost per output token of a plan point, from a price table: GPU-hours and the pinned host memory
HiSparse's host pool takes.

``$/h = gpus x gpu_hour + host GB x host_gb_month / 730`` (730 hours a month), and
``$/M output tokens = $/h / (steady tok/s x 3600) x 1e6``. The host term counts the pinned host
pool SGLang allocates at start-up (``host_to_device_ratio`` x the device pool, per GPU; the
baseline's is 0): the server's own RAM is part of the GPU-hour price, the pool is what HiSparse
asks beyond it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import HisparseError

HOURS_PER_MONTH = 730.0
# The most a price may be, $ per GPU-hour or per GB-month: a GPU-hour costs ~$1-100, so 1e6 leaves four
# orders of magnitude (another currency's figure given as dollars) and keeps every cost finite
# (--price-gpu-hour 1e308 printed "$inf per M output tokens").
MAX_PRICE = 1e6


@dataclass(frozen=True)
class Prices:
    gpu_hour: float  # $ per GPU-hour
    host_gb_month: float = 0.0  # $ per GB-month of host memory (1e9 bytes)
    source: str = "command line"

    def __post_init__(self) -> None:
        for name in ("gpu_hour", "host_gb_month"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise HisparseError(f"{self.source}: {name} = {v!r} must be a number >= 0")
            if v > MAX_PRICE:
                raise HisparseError(f"{self.source}: {name} = {v!r} must be at most {MAX_PRICE:g} ($)")
        if self.gpu_hour == 0 and self.host_gb_month == 0:
            raise HisparseError(f"{self.source}: give gpu_hour (and host_gb_month): both are 0")

    def usd_per_hour(self, gpus: int, host_bytes_per_gpu: float) -> float:
        return gpus * self.gpu_hour + gpus * host_bytes_per_gpu / 1e9 * self.host_gb_month / HOURS_PER_MONTH

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"hours_per_month": HOURS_PER_MONTH}


def load_prices(path: str) -> Prices:
    """A price table TOML: ``gpu_hour = 3.5``, optional ``host_gb_month`` and ``source``."""
    from .presets import read_toml

    p = Path(path)
    if not p.is_file():
        raise HisparseError(f"--prices {path}: no such file")
    data = read_toml(p)
    known = {"gpu_hour", "host_gb_month", "source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HisparseError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if "gpu_hour" not in data:
        raise HisparseError(f"{path}: missing key gpu_hour ($ per GPU-hour)")
    src = data.get("source", "")
    if not isinstance(src, str):
        raise HisparseError(f"{path}: source must be a string")
    return Prices(data["gpu_hour"], data.get("host_gb_month", 0.0), f"{path}" + (f" ({src})" if src else ""))


def add_costs(rows: list[dict], scenario, prices: Prices | None) -> None:
    """Add ``usd_per_hour``, ``host_pool_gb_per_gpu`` and ``usd_per_m_output_tokens`` to each row
    (None without prices, or for a point with no throughput)."""
    from .memory import plan_memory

    pools: dict = {}
    for r in rows:
        key = (r["device_buffer_size"], r["host_to_device_ratio"]) if r["system"] == "hisparse" else None
        if key not in pools:
            hs = None
            if key is not None:
                hs = dataclasses.replace(scenario.hisparse, device_buffer_size=int(key[0]),
                                         host_to_device_ratio=float(key[1]))
            pools[key] = plan_memory(scenario.model, scenario.gpu, scenario.deployment, hs).host_pool_bytes if hs else 0.0
        r["host_pool_gb_per_gpu"] = pools[key] / 1e9
        if prices is None:
            r["usd_per_hour"] = r["usd_per_m_output_tokens"] = None
            continue
        per_h = prices.usd_per_hour(scenario.deployment.gpus, pools[key])
        tok = r["steady_tok_s_deployment"]
        r["usd_per_hour"] = per_h
        r["usd_per_m_output_tokens"] = per_h / (tok * 3600) * 1e6 if tok and tok > 0 else None
