"""Analyses above the replay engine: they draw or read traces and replay them (the generator's
fit to a trace or to published statistics, a trace's statistics against targets)."""
