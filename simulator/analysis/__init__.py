"""Analyses above the replay engine: they draw or read traces and replay them (the generator's
fit to a trace or to published statistics, a trace's statistics against targets)."""

# Decode steps left out of a trace's steady-state statistics (``targets.Shape.warmup``; the plan's
# steady miss ratio): a constant here so that the serving model reads it without the analyses' imports.
STEADY_WARMUP_STEPS = 16
