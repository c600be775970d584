"""QA pass over `hisparse trace record`: a GGUF file that is not a complete model of a supported
architecture is refused with one line naming the file and what is missing (it was a KeyError
traceback, exit 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fuzzing import run_cli

pytest.importorskip("torch")  # the 'record' extra, as tests/test_record.py
gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")


def _gguf(path: Path, arch: str, *, meta: bool = True, vocab: bool = True, tensors: tuple[str, ...] = (),
          embed: tuple[int, int] = (3, 8)) -> Path:
    """A GGUF file of one 1-layer model of ``arch``, with or without its config keys and
    vocabulary, holding only ``tensors`` (at the shapes the config gives; the embedding at ``embed``)."""
    w = gguf.GGUFWriter(str(path), arch)
    if meta:
        w.add_block_count(1)
        w.add_context_length(512)
        w.add_embedding_length(8)
        w.add_feed_forward_length(16)
        w.add_head_count(2)
        w.add_layer_norm_rms_eps(1e-6)
    if vocab:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b", "c"])
    shapes = {"token_embd.weight": embed, "output_norm.weight": (8,)}
    for name in tensors or ("token_embd.weight",):
        w.add_tensor(name, np.zeros(shapes[name], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("kind, says", [
    ("arch", "architecture 'gpt2' is not supported"),
    ("no-meta", "GGUF metadata 'llama.block_count' is missing"),
    ("no-vocab", "GGUF metadata 'tokenizer.ggml.tokens' is missing"),
    ("no-tensor", "tensor blk.0.attn_norm.weight is missing"),
    ("bad-shape", "tensor token_embd.weight has shape (3, 4), its metadata gives (3, 8)"),
])
def test_record_refuses_an_incomplete_gguf_in_one_line(tmp_path, capsys, kind, says):
    model = {
        "arch": lambda p: _gguf(p, "gpt2"),
        "no-meta": lambda p: _gguf(p, "llama", meta=False),
        "no-vocab": lambda p: _gguf(p, "llama", vocab=False),
        "no-tensor": lambda p: _gguf(p, "llama", tensors=("token_embd.weight", "output_norm.weight")),
        "bad-shape": lambda p: _gguf(p, "llama", embed=(3, 4)),
    }[kind](tmp_path / "m.gguf")
    text = tmp_path / "t.txt"
    text.write_text("a b c " * 50)
    out = tmp_path / "r.hst"
    code, _, err = run_cli(["trace", "record", "--model", str(model), "--text", str(text), "--prompt-tokens", "8",
                            "--steps", "2", "--topk", "4", "--out", str(out), "--quiet"], capsys)
    assert code == 2, err
    assert says in err and str(model) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "t.txt"]  # nothing written
