"""Serving model: typed specs and presets (specs.py, presets.py), one Scenario (scenario.py), SGLang's
memory accounting (memory.py), collectives (comm.py), the per-step cost model (costs.py), miss
profiles from trace replay (misses.py), the SimPy rank model (model.py), the planner (planner.py) and
the validation against published runs (published.py)."""
