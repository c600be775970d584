"""The replay plot stays readable with many series and shows no false drop after the cold start."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from simulator.replay.plots import plot_rolling_misses


def _per_step(policies, buffers, steps=300, streams=3):
    rows = []
    for p, b, s, t in itertools.product(policies, buffers, range(streams), range(steps)):
        misses = 2048 if t == 0 else 100 + (b // 1024)  # cold start at step 0, then flat
        rows.append(dict(request=s, layer=0, step=t, ctx_len=5000 + t, policy=p, buffer=b, misses=misses))
    return pd.DataFrame(rows)


def test_many_series_colour_by_policy_style_by_buffer_baselines_apart():
    policies = ["lru", "fifo", "clock", "lfu", "arc", "s3fifo", "sieve", "random", "opt", "none", "static-prefix"]
    buffers = [2048, 3072, 4096, 6144]
    fig = plot_rolling_misses(_per_step(policies, buffers, steps=150, streams=1), window=50)
    main, side = fig.axes
    assert side.get_title() == "no-cache baselines" and len(side.lines) == 2 * len(buffers)
    assert len(main.lines) == 9 * len(buffers)
    colours = {}
    for line in main.lines + side.lines:
        colours.setdefault(line.get_color(), set()).add(line.get_linestyle())
    assert len(colours) == len(policies)  # one colour per policy, none repeated
    assert all(len(styles) == len(buffers) for styles in colours.values())  # a style per buffer
    legend = fig.legends[0]
    assert legend.get_bbox_to_anchor().x0 >= fig.bbox.x1 - 1  # outside the axes, right of them
    assert "mean over 1 streams" in main.get_ylabel() and "50-step rolling mean" in main.get_ylabel()


def test_no_false_drop_when_the_cold_start_leaves_the_window():
    fig = plot_rolling_misses(_per_step(["lru"], [4096]), window=100)
    (line,) = fig.axes[0].lines
    x, y = line.get_data()
    assert x[0] >= 100  # drawn from the first full window on (the warm-up is shaded)
    assert np.allclose(y, 104)  # flat: step 0's 2048 misses are not in the mean
