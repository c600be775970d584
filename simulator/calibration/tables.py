"""What each raw calibration table must hold before a fit reads it (``hisparse calibrate --refit``).

``hisparse calibrate`` saves every measurement as ``<name>-<gpu>.csv`` and fits from those files,
so ``--refit`` can redo a fit on a machine without a GPU. A table edited by hand or cut short must
fail as a one-line error that names the file, the column and the data row, not as a traceback
from deep inside a least-squares fit, and a table with no rows must not fit to a zero launch cost.
One spec per table name (the names of ``calibration.run``'s table tuples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import HisparseError


@dataclass(frozen=True)
class TableSpec:
    """Columns a fit reads: ``numbers`` finite, ``times`` (microseconds) finite and positive,
    ``labels`` present (text keys the fit groups by)."""

    numbers: tuple[str, ...] = ()
    times: tuple[str, ...] = ("us",)
    labels: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.labels, *self.numbers, *self.times)


TABLE_SPECS: dict[str, TableSpec] = {
    "swap_in": TableSpec(numbers=("batch", "rows", "row_bytes")),
    "attention": TableSpec(numbers=("batch", "heads"), times=("us", "roofline_us"), labels=("kv_dtype",)),
    "gemm": TableSpec(numbers=("bytes", "flops"), labels=("kind", "dtype")),
    "elementwise": TableSpec(numbers=("bytes",)),
    "indexer": TableSpec(numbers=("batch", "ctx", "heads"), labels=("q_dtype",)),
    "graph": TableSpec(numbers=("kernels",)),
    "grouped_tp": TableSpec(numbers=("k", "n", "weight_groups", "flops", "bytes"), labels=("layout", "name", "dtype")),
    # the torch._scaled_grouped_mm rows beside the Triton ones may have no time (a shape it refused)
    "fused_moe_tp": TableSpec(numbers=("node_tokens", "weight_bytes", "flops", "experts_touched"), times=(),
                              labels=("impl", "best", "name", "dtype")),
}


def check_table(df: pd.DataFrame, name: str, path: str) -> pd.DataFrame:
    """``df`` (read from ``path``) against ``TABLE_SPECS[name]``: every column there, at least one
    data row, numbers that parse and are finite, times above zero. Returns ``df`` as read (a column
    that passes holds numbers only, so pandas parsed it as such: integers stay integers, as the
    fits' keys need, e.g. ``fp8_h32``); raises ``HisparseError`` naming the file, column and data row."""
    spec = TABLE_SPECS[name]
    missing = [c for c in spec.columns if c not in df.columns]
    if missing:
        raise HisparseError(f"{path}: column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
                            f"missing (columns: {', '.join(map(str, df.columns))})")
    if df.empty:
        raise HisparseError(f"{path}: no data rows (a header alone); rerun hisparse calibrate for this table")
    for col in (*spec.numbers, *spec.times):
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        ok = np.isfinite(values) & ((values > 0) if col in spec.times else True)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            need = "a positive number of microseconds" if col in spec.times else "a finite number"
            raise HisparseError(f"{path}: column '{col}', data row {i + 1}: '{df[col].iloc[i]}' is not {need}")
    for col in spec.labels:
        blank = df[col].isna().to_numpy()
        if blank.any():
            i = int(np.flatnonzero(blank)[0])
            raise HisparseError(f"{path}: column '{col}', data row {i + 1}: empty")
    return df
