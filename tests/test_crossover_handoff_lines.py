"""The st.async hand-off of variant wsxa (cupy_kernels/sparse_attention.cu, dequant_row_smem_peer), modelled on the CPU.

A raw 16-byte FP8 unit becomes two bf16 units (lo, hi) at positions 2q, 2q + 1 of its row's 128-byte line, so
the four lanes of a row cover every other 16 B of the line per store. Remote stores of half lines move half the
bytes per second of whole lines (benchmarks/dsmem_bandwidth.py: 16-18 against 31 GB/s per CTA on an H100), so
the lanes of two adjacent rows trade one unit and each of their two stores fills one row's whole line. This
replays that exchange for one warp (8 rows x 4 lanes) over the 8 latent chunks and checks what lands where: every
(row, chunk, position) of the peer's tile gets its own unit exactly once, and every store of the warp writes
whole lines. The GPU test of the same semantics is test_sparse_attention_gpu.py (wsxa bit for bit with ws).
"""

from __future__ import annotations

from collections import Counter


def swz(r: int, u: int) -> int:
    """Byte offset of 16-byte unit u of row r in a 128-byte-swizzled chunk (sparse_attention.cu `swz`)."""
    return r * 128 + ((u ^ (r & 7)) << 4)


def warp_stores(warp: int, rank: int) -> list[list[tuple[int, int, tuple]]]:
    """Each of the warp's st.async instructions in order: per lane (chunk byte offset, chunk, value), the value
    named by what it is (row, bf16 unit position) so a wrong exchange shows."""
    stores = []
    for m in range(8):  # latent chunks: raw units q + 4 m
        lanes = []
        for lane in range(32):
            ltid = warp * 32 + lane
            row, q = 32 * rank + (ltid >> 2), ltid & 3
            u = q + 4 * m
            lo, hi = (row, (u & 3) * 2), (row, (u & 3) * 2 + 1)  # what the lane converted: its row's two units
            first = ((ltid >> 2) & 1) == 0  # the kernel reads threadIdx.x's bit 2; the producer's base is 256
            lanes.append((row, u, lo, hi, first, hi if first else lo))  # the last: what it gives its partner
        first_store, second_store = [], []
        for lane, (row, u, lo, hi, first, _give) in enumerate(lanes):
            got = lanes[lane ^ 4][5]  # __shfl_xor_sync(..., 4)
            row_a = row if first else row ^ 1
            row_b = row_a ^ 1
            pos = (u & 3) * 2 + (0 if first else 1)
            first_store.append((swz(row_a, pos), m, lo if first else got))
            second_store.append((swz(row_b, pos), m, got if first else hi))
        stores += [first_store, second_store]
    return stores


def test_every_unit_of_the_peer_tile_lands_once_where_it_belongs():
    for rank in (0, 1):
        landed = Counter()
        for warp in range(4):
            for store in warp_stores(warp, rank):
                for off, chunk, (row, pos) in store:
                    assert off == swz(row, pos), (rank, warp, chunk, row, pos)  # the value is that address's unit
                    landed[(chunk, off)] += 1
        rows = range(32 * rank, 32 * rank + 32)
        assert set(landed) == {(c, swz(r, p)) for c in range(8) for r in rows for p in range(8)}
        assert set(landed.values()) == {1}


def test_each_store_of_the_warp_writes_four_whole_lines():
    for rank in (0, 1):
        for warp in range(4):
            for store in warp_stores(warp, rank):
                lines = Counter(off // 128 for off, _, _ in store)
                assert len(lines) == 4 and set(lines.values()) == {8}
                for line in lines:  # 8 different 16-byte units of the line
                    assert len({off for off, _, _ in store if off // 128 == line}) == 8


def test_the_kernel_still_trades_units_as_this_model_does():
    # the model above mirrors these lines of the kernel; if they change, the model must be revisited
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "cupy_kernels" / "sparse_attention.cu").read_text()
    body = src[src.index("void dequant_row_smem_peer("):]
    body = body[:body.index("\n}\n")]
    for line in ("const bool first = ((threadIdx.x >> 2) & 1) == 0;",
                 "const int row_a = first ? row : row ^ 1, row_b = row_a ^ 1, pos_off = first ? 0 : 1;",
                 "const uint4 give = first ? hi : lo;",
                 "got.x = __shfl_xor_sync(0xffffffff, give.x, 4);",
                 "const int pos = (u & 3) * 2 + pos_off;",
                 "st_async16(chunk + swz(row_a, pos) + to_peer, first ? lo : got, peer_bar);",
                 "st_async16(chunk + swz(row_b, pos) + to_peer, first ? got : hi, peer_bar);"):
        assert line in body, line
