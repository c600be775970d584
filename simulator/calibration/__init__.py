"""Calibration: time the real kernels on a GPU, fit the cost model's parameters to them, and
check the fitted model's predictions against a full decode loop it did not see."""
