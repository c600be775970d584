"""The cost model: the one price of every forward pass the serving model runs.

- ``ops``: the kernels of a layer and of a step, from the model's shapes and the deployment's layout;
- ``terms``: the fitted kernel terms (launch + bytes / bandwidth or FLOPs / rate), from calibration;
- ``pricing``: which terms a GPU gets (measured, or another GPU's scaled) and the layout of a deployment;
- ``collectives``: NCCL/DeepEP collective times on a GPU's interconnect;
- ``host_sync``: the GPU idle gap of DeepEP normal dispatch's host wait (measured);
- ``passes``: ``CostModel.pass_time(Pass) -> StepTime`` for a decode, mixed or prefill pass;
- ``pass_terms``: the table of terms a pass's time is the sum of.

The names below load ``passes`` on first use, so that the specs, which name ``collectives``, can
be imported before it (``passes`` reads the specs).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Category", "CostModel", "Pass", "PassShape", "RankWork", "StepTime", "cuda_graph_batch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import passes

        return getattr(passes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
