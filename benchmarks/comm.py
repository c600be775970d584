"""Time NCCL all_reduce / all_gather / reduce_scatter / all_to_all at DSA decode-step sizes.

On a machine of 8 GPUs (one process per GPU; GPU counts 2, 4 and 8 in one run):

    python benchmarks/comm.py --out calibration --csv-name comm-h200.csv
    torchrun --nproc-per-node 8 benchmarks/comm.py --out calibration --csv-name comm-h200.csv

On CPU processes (the same code through gloo): ``--backend gloo --device cpu``.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1). ``hisparse calibrate --comm-refit CSV`` fits the CSV.
See simulator/calibration/comm_harness.py for what is timed and how.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.calibration.comm_harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
