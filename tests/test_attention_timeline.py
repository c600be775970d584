"""CPU checks of the attention timeline's reader (benchmarks/attention_timeline.py): the stamp
layout mirrors the kernel's TL_* constants, and the summary reads a synthetic timeline back (the
GPU run itself needs a Hopper card)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks import attention_timeline as tl

ROOT = Path(__file__).resolve().parents[1]


def test_layout_matches_the_kernel_source():
    src = (ROOT / "cupy_kernels" / "sparse_attention.cu").read_text()
    consts = {name: int(v) for name, v in re.findall(r"#define (TL_FIXED|TL_TILES|TL_SERIES|TL_CTAS) (\d+)", src)}
    assert consts == {"TL_FIXED": tl.TL_FIXED, "TL_TILES": tl.TL_TILES, "TL_SERIES": tl.TL_SERIES, "TL_CTAS": tl.TL_CTAS}
    events = re.search(r"enum TlEvent \{([^}]*)\}", src).group(1)
    assert [int(v) for v in re.findall(r"= (\d+)", events)] == [
        tl.TL_START, tl.TL_Q_READY, tl.TL_LOOP_END, tl.TL_EPI_END, tl.TL_END, tl.TL_GT_START, tl.TL_GT_END, tl.TL_PAIR]
    series = re.search(r"enum TlSeries \{([^}]*)\}", src).group(1)
    assert [int(v) for v in re.findall(r"= (\d+)", series)] == [tl.FREED, tl.FULL, tl.PV, tl.EMPTY, tl.ARRIVED,
                                                               tl.WG1_FREED]


def _synthetic(n_ctas: int, period: int, ghz: float, peer_clock: int = 0, peer_late: int = 0) -> np.ndarray:
    """A timeline where every CTA runs the same schedule: tile period `period` cycles, WG0 frees at
    +0, sees the tile full at +500, issues P V at +3000; the producer's empty wait ends at -1000,
    its tile arrives at +200; WG1 frees the tile's buffer at +3500 (cycles from each tile's start).
    The odd CTA of each pair reads its SM's clock64 `peer_clock` cycles ahead of the even one's and runs
    `peer_late` cycles behind it; both stamp TL_PAIR at the same instant."""
    st = np.zeros(tl.TL_CTAS * tl.TL_EVENTS, np.uint64)
    rows = st.reshape(tl.TL_CTAS, tl.TL_EVENTS)
    for c in range(n_ctas):
        r = rows[c]
        r[tl.TL_START], r[tl.TL_Q_READY] = 1000, 3000
        odd = c % 2
        r[tl.TL_PAIR] = 9000 + odd * peer_clock
        for it in range(tl.TL_TILES):
            t0 = 10_000 + it * period + odd * (peer_clock + peer_late)
            for s, d in ((tl.FREED, 0), (tl.FULL, 500), (tl.PV, 3000), (tl.EMPTY, -1000), (tl.ARRIVED, 200),
                         (tl.WG1_FREED, 3500)):
                r[tl.TL_FIXED + s * tl.TL_TILES + it] = t0 + d
        r[tl.TL_LOOP_END] = 10_000 + tl.TL_TILES * period
        r[tl.TL_EPI_END] = int(r[tl.TL_LOOP_END]) + 4000
        r[tl.TL_END] = int(r[tl.TL_EPI_END]) + 1000
        r[tl.TL_GT_START] = 5_000_000 + 10 * c
        r[tl.TL_GT_END] = int(r[tl.TL_GT_START]) + round((int(r[tl.TL_END]) - 1000) / ghz)
    return st


def test_summary_reads_a_synthetic_timeline_back():
    out = tl.summarise(_synthetic(4, 6000, 2.0), 4, tl.TL_TILES, producer_stamps=True)
    assert out["sm_ghz"] == 2.0
    assert out["tile_period_us"] == 3.0  # 6000 cycles at 2 GHz
    assert out["wg0_waits_full_us"] == 0.25 and out["wg0_s_softmax_us"] == 1.25 and out["wg0_pv_tail_us"] == 1.5
    assert out["prod_waits_empty_us"] == 2.4 and out["prod_tile_us"] == 0.6 and out["full_after_arrive_us"] == 0.15
    assert out["q_ready_us"] == 1.0 and out["epilogue_us"] == 2.0 and out["end_wait_us"] == 0.5
    assert out["start_spread_us"] == 0.03
    # tile it's buffer: WG0 freed it at the top of tile it - 1, WG1 at +3500 of tile it - 2
    assert out["empty_after_wg0_freed_us"] == 2.5 and out["wg1_freed_after_wg0_us"] == -1.25
    # a slower tile period moves only what depends on it
    slow = tl.summarise(_synthetic(4, 7000, 2.0), 4, tl.TL_TILES, producer_stamps=True)
    assert slow["tile_period_us"] == 3.5 and slow["wg0_pv_tail_us"] == 2.0 and slow["wg0_waits_full_us"] == 0.25
    assert "prod_tile_us" not in tl.summarise(_synthetic(2, 6000, 2.0), 2, tl.TL_TILES, producer_stamps=False)


def test_the_pair_is_aligned_at_its_shared_instant_whatever_the_two_clocks_read():
    # the odd CTA's counter reads 1e9 cycles ahead and it runs 400 cycles (0.2 us at 2 GHz) behind its peer
    for peer_clock in (0, 10**9):
        out = tl.summarise(_synthetic(4, 6000, 2.0, peer_clock=peer_clock, peer_late=400), 4, tl.TL_TILES,
                           producer_stamps=True, pair_stamps=True)
        assert out["pair_phase_us"] == 0.2
        # the even CTA's peer releases 0.2 us after it (last), the odd one's 0.2 us before: half the readings
        assert out["pair_last_release_is_peer"] == 0.5 and out["pair_peer_release_after_own_us"] == 0.0
        # empty wait done 5000 cycles after the own release; 4600 after the even CTA's later peer: median 2.4 us
        assert out["pair_empty_after_last_release_us"] == 2.4
        # split by whose release came last: the even CTA (peer last) 4600 cycles, the odd one (own last) 5000
        assert out["pair_empty_after_peer_last_us"] == 2.3 and out["pair_empty_after_own_last_us"] == 2.5
    in_phase = tl.summarise(_synthetic(4, 6000, 2.0), 4, tl.TL_TILES, producer_stamps=True, pair_stamps=True)
    assert in_phase["pair_phase_us"] == 0.0 and in_phase["pair_empty_after_last_release_us"] == 2.5
    assert in_phase["pair_empty_after_own_last_us"] == 2.5 and in_phase["pair_empty_after_peer_last_us"] == ""
    assert "pair_phase_us" not in tl.summarise(_synthetic(4, 6000, 2.0), 4, tl.TL_TILES, producer_stamps=True)


def test_bad_options_exit_2_without_a_traceback():
    for argv in (["--variants", "narrow"], ["--heads", "64"], ["--launches", "0"]):
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_timeline.py"), *argv],
                           capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2 and "Traceback" not in p.stderr and "--variants must be among" in p.stderr, argv


def test_rows_of_different_variants_share_one_csv(tmp_path):
    # wsxl's rows carry the remote-release columns, the others' do not: one header, blanks where absent
    from benchmarks.csv_out import write_rows

    write_rows(tmp_path / "t.csv", [{"variant": "wsxb", "a": 1}, {"variant": "wsxl", "a": 2, "remote": 3}])
    assert (tmp_path / "t.csv").read_text().splitlines() == ["variant,a,remote", "wsxb,1,", "wsxl,2,3"]
