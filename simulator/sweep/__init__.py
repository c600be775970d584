"""Parameter sweeps: grid files expanded into points, run on Ray or in-process, resumable."""
