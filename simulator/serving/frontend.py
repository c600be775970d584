"""SGLang's TokenizerManager: one process that tokenizes text prompts one at a time, in arrival order.

Why it is modelled: it sets when each request of a burst reaches the DP ranks. Read in SGLang's source
at the releases the published sets ran (the PyPI wheels sglang 0.5.12.post1, issue #30985's image, and
0.5.14, the GLM-5.2 cookbook cells):

- ``sglang.bench_serving`` with ``--dataset-name random`` sends text (``datasets/random.py``:
  ``return_text=not args.tokenize_prompt``; a ShareGPT prompt's token ids repeated or cut to the input
  length, then ``tokenizer.decode``d); with ``--request-rate inf`` every request is created at once as
  an asyncio task behind ``asyncio.Semaphore(max_concurrency)`` (``bench_serving.py`` ``benchmark``,
  ``get_request``), so the first ``max_concurrency`` requests are sent together and each later one when
  a client's previous request finishes.
- ``TokenizerManager.generate_request`` awaits ``_tokenize_one_request``, whose ``_tokenize_texts``
  calls ``self.tokenizer(...)`` synchronously inside the event loop (``managers/tokenizer_manager.py``);
  ``--tokenizer-worker-num`` defaults to 1 and ``--enable-dynamic-batch-tokenizer`` to off
  (``server_args.py``). So the prompts of a burst are tokenized one after another, and each is sent to
  the DataParallelController (``round_robin`` for non-PD serving: ``_handle_load_balance_method``)
  as soon as it is tokenized.
- A rank's scheduler takes new requests at the top of each iteration (``event_loop_normal`` /
  ``event_loop_overlap``: ``recv_requests`` then ``get_next_batch_to_run``), so a request that arrives
  during a forward pass waits for the next one. The effect on a burst, described by an SGLang
  maintainer for a DP-attention PD prefill server (sgl-project/sglang PR #23588, 2026-04-23): four
  concurrent requests round-robined to four DP ranks run as two iterations, DP0 prefilling alone in
  the first while the others run idle batches.

The pace is measured (``benchmarks/tokenizer_pace.py``, ``benchmarks/results/tokenizer_pace-xeon.csv``,
2026-12-06, this workplace's Intel Xeon CPU host, load average 0.11; tokenizers 0.23.3; 30 repeats): a byte-level BPE
(SmolLM2's 49,152-token vocabulary, rebuilt from its GGUF) encoding bench_serving ``random`` prompts built
as SGLang builds them from English prose: median 0.97 ms at 1,024 tokens, 8.13 ms at 8,192 and 44.5 ms
at 32,768 (0.95-1.36 us per token). Two published figures agree within 1.5x: HuggingFace tokenizers take 1.1 s for ~1 M tokens
(charlesxu.io "3.3x Faster HuggingFace Tokenizers for Single Sequence") and encode 2.5-2.7 MiB/s of
English through the Python binding on an AMD EPYC at 5.4 GHz (the IREE tokenizer benchmark gist,
benvanik, 2026-02-21), ~1.5 us per token at ~4.2 bytes per token. Assumed: GLM-5.x's tokenizer is the
Rust BPE (the wheels pin transformers 5.6.0 / 5.8.1, and v5 dropped the Python "slow" tokenizers,
huggingface/transformers PR #40936; its files were not read). Not included: the HTTP parsing and the
transformers wrapper around the Rust call (both well under a millisecond for these prompts), and the
server host's own CPU, which is not this one (x3 and x10 the pace move the DP8 cells by under 1%:
docs/validation.md, "Prefill in waves").

``--tokenize-prompt`` (the workload's ``tokenize_prompt``) sends token ids instead: no tokenization.
"""

from __future__ import annotations

import numpy as np

# benchmarks/results/tokenizer_pace-xeon.csv: prompt tokens -> median seconds per encode
MEASURED_TOKENS = (1024, 8192, 32768)
MEASURED_S = (0.971e-3, 8.127e-3, 44.509e-3)

SOURCE = ("SGLang 0.5.12.post1 / 0.5.14 TokenizerManager._tokenize_texts: one synchronous tokenizer call per "
          "request in the event loop (--tokenizer-worker-num 1); HF tokenizers' byte-level BPE measured here "
          "(benchmarks/tokenizer_pace.py): 8.13 ms per 8,192-token and 44.5 ms per 32,768-token random prompt")


def tokenize_seconds(tokens: int) -> float:
    """Seconds the TokenizerManager spends on one text prompt of ``tokens`` tokens: the measured points,
    linear between them, through the origin below the first and at the last point's rate per token
    above it."""
    if tokens < 0:
        raise ValueError(f"tokens {tokens} must be >= 0")
    last_rate = MEASURED_S[-1] / MEASURED_TOKENS[-1]
    if tokens > MEASURED_TOKENS[-1]:
        return tokens * last_rate
    return float(np.interp(tokens, (0, *MEASURED_TOKENS), (0.0, *MEASURED_S)))
