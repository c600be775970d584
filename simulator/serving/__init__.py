"""Serving model: presets, per-GPU memory, the decode/prefill cost model, miss profiles from
trace replay, the SimPy deployment model and the capacity planner."""
