"""Serving model: typed specs and presets (specs.py, presets.py), one Scenario (scenario.py), SGLang's
memory accounting (memory.py), miss profiles from trace replay (misses.py), the SimPy instance model
(model.py), the planner (planner.py) and the validation against published runs (published.py). Every
forward pass is priced by ``simulator.costmodel``."""
