"""The recorder on tiny random-weight models written as GGUF files in the test (no download):
the same loading, tokenizer, model and writer code as the real models."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from simulator.cli import main  # noqa: E402
from simulator.errors import HisparseError  # noqa: E402
from simulator.record.recorder import RecordSpec, output_paths, record  # noqa: E402
from simulator.trace import open_trace  # noqa: E402

TEXT = str(Path(sysconfig.get_paths()["stdlib"]) / "argparse.py")  # real text, on every Python


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def _write_tiny(path: Path, arch: str, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    layers, hidden, heads, kv, ffn = (2, 32, 4, 2, 64) if arch == "llama" else (6, 32, 2, 1, 48)
    head_dim = hidden // heads if arch == "llama" else 16
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    if arch == "llama":
        tokens = _bytes_to_unicode() + ["\u0120t", "e\u0120", "in"]
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([1] * len(tokens))
        w.add_token_merges(["\u0120 t", "e \u0120", "i n"])
    else:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(16)
        tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "  ", "e", "t", "\u2581t"]
        types = [3, 3, 3, 2] + [6] * 256 + [1, 4, 1, 1, 1]
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores([0.0] * 260 + [-1.0, 0.0, -2.0, -3.0, -0.5])
        w.add_bos_token_id(2)
        w.add_add_bos_token(True)
    w.add_unk_token_id(3 if arch == "gemma3" else 0)
    vocab = len(tokens)

    def mat(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    w.add_tensor("output_norm.weight", norm(hidden))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(hidden))
        w.add_tensor(b + "attn_q.weight", mat(heads * head_dim, hidden) * 3)
        w.add_tensor(b + "attn_k.weight", mat(kv * head_dim, hidden) * 3)
        w.add_tensor(b + "attn_v.weight", mat(kv * head_dim, hidden))
        w.add_tensor(b + "attn_output.weight", mat(hidden, heads * head_dim))
        w.add_tensor(b + "ffn_norm.weight", norm(hidden))
        w.add_tensor(b + "ffn_gate.weight", mat(ffn, hidden))
        w.add_tensor(b + "ffn_up.weight", mat(ffn, hidden))
        w.add_tensor(b + "ffn_down.weight", mat(hidden, ffn))
        if arch == "gemma3":
            w.add_tensor(b + "attn_q_norm.weight", norm(head_dim))
            w.add_tensor(b + "attn_k_norm.weight", norm(head_dim))
            w.add_tensor(b + "post_attention_norm.weight", norm(hidden))
            w.add_tensor(b + "post_ffw_norm.weight", norm(hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {arch: _write_tiny(d / f"tiny-{arch}.gguf", arch) for arch in ("llama", "gemma3")}


def _spec(model: Path, out: Path, **kw) -> RecordSpec:
    args = dict(model=str(model), texts=(TEXT,), prompt_tokens=300, steps=12, ks=(8, 32), out=str(out),
                prefill_chunk=64, checkpoint_every=4)
    args.update(kw)
    return RecordSpec(**args)


def test_output_paths() -> None:
    assert output_paths("t/a.hst", (64,)) == [Path("t/a.hst")]
    assert output_paths("t/a.hst", (64, 128)) == [Path("t/a-k64.hst"), Path("t/a-k128.hst")]
    assert output_paths("t/a-{k}.hst", (8,)) == [Path("t/a-8.hst")]


def test_record_is_deterministic(tiny, tmp_path) -> None:
    r1 = record(_spec(tiny["llama"], tmp_path / "a.hst"), quiet=True)
    r2 = record(_spec(tiny["llama"], tmp_path / "b.hst"), quiet=True)
    assert [p.name for p in r1.paths] == ["a-k8.hst", "a-k32.hst"]
    assert r1.generated == r2.generated and len(r1.generated) == 12
    for a, b in zip(r1.paths, r2.paths, strict=True):
        assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-k32.hst", "a-k8.hst", "b-k32.hst", "b-k8.hst"]
    t = open_trace(r1.paths[1])
    assert t.meta.k == 32 and t.meta.source["kind"] == "recorded"
    assert t.meta.source["model"] == "tiny-llama.gguf" and t.meta.source["text"] == ["argparse.py"]
    assert sorted(key.layer for key in t.keys) == [0, 1]
    small = open_trace(r1.paths[0])
    for s in t:
        assert s.steps == 12
        assert list(s.ctx_len) == list(range(300, 312))
        assert (s.counts == 32).all()
        # the k = 8 set is a subset of the k = 32 set, step by step
        s8 = small.read(s.key)
        for t_ in range(s.steps):
            assert set(s8.step(t_)) <= set(s.step(t_))


def test_resume_gives_the_same_file(tiny, tmp_path) -> None:
    straight = record(_spec(tiny["llama"], tmp_path / "s.hst"), quiet=True)

    class Stop(Exception):
        pass

    def stop(t: int) -> None:
        if t == 6:
            raise Stop

    spec = _spec(tiny["llama"], tmp_path / "r.hst")
    with pytest.raises(Stop):
        record(spec, quiet=True, on_step=stop)
    assert (tmp_path / "r-k8.hst.partial").exists() and (tmp_path / "r-k8.hst.ckpt").exists()
    with pytest.raises(HisparseError, match="--resume") as refused:
        record(spec, quiet=True)
    # names the output and the files left, not the folder ("."): r-k8.hst: ... (.../r-k8.hst.ckpt, ...partial)
    assert str(refused.value).startswith(str(tmp_path / "r-k8.hst") + ": ") and "r-k8.hst.ckpt" in str(refused.value)
    resumed = record(spec, resume=True, quiet=True)
    assert resumed.prefill_tokens == 0 and resumed.decode_tokens == 12 - 4  # from the checkpoint at 4
    for a, b in zip(straight.paths, resumed.paths, strict=True):
        assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.ckpt"))


def test_chunked_prefill_matches_one_pass(tiny) -> None:
    from simulator.record.model import Model
    from simulator.record.weights import load_gguf

    g = load_gguf(tiny["gemma3"])
    tokens = list(range(4, 200))
    one, chunked = Model(g, 256), Model(g, 256)
    l1, p1 = one.forward(tokens, logits=True, record=(5,))
    chunked.forward(tokens[:70])
    chunked.forward(tokens[70:150])
    l2, p2 = chunked.forward(tokens[150:], logits=True, record=(5,))
    torch.testing.assert_close(l1, l2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(p1[5], p2[5], rtol=1e-4, atol=1e-6)
    assert p1[5].shape == (200 - 4,) and abs(float(p1[5].sum()) - 1.0) < 1e-5


def test_gemma_records_global_layers_only(tiny, tmp_path) -> None:
    res = record(_spec(tiny["gemma3"], tmp_path / "g.hst", ks=(16,), steps=5), quiet=True)
    t = open_trace(res.paths[0])
    assert [key.layer for key in t.keys] == [5]
    assert t.meta.source["architecture"] == "gemma3" and t.meta.source["layers"] == [5]
    assert int(next(iter(t)).ctx_len[0]) == 300


def test_cli_record_and_errors(tiny, tmp_path, capsys) -> None:
    out = tmp_path / "c.hst"
    argv = ["trace", "record", "--model", str(tiny["llama"]), "--text", TEXT, "--prompt-tokens", "200",
            "--steps", "3", "--topk", "16", "--out", str(out), "--quiet"]
    assert main(argv) == 0 and out.exists()
    assert main(["trace", "validate", str(out)]) == 0
    bad = tmp_path / "short.txt"
    bad.write_text("too short")
    assert main(argv[:5] + [str(bad)] + argv[6:]) == 2
    assert "fewer than --prompt-tokens" in capsys.readouterr().err
    assert main(["trace", "record", "--model", "no-such-model", "--text", TEXT, "--prompt-tokens", "9",
                 "--steps", "1", "--topk", "4", "--out", str(tmp_path / "x.hst")]) == 2


def test_fewer_steps_give_a_prefix(tiny, tmp_path) -> None:
    """What the slow test relies on: --steps only cuts the recording short."""
    long = record(_spec(tiny["llama"], tmp_path / "l.hst", ks=(8,)), quiet=True)
    short = record(_spec(tiny["llama"], tmp_path / "s.hst", ks=(8,), steps=5), quiet=True)
    a, b = open_trace(long.paths[0]), open_trace(short.paths[0])
    for key in a.keys:
        assert np.array_equal(a.read(key).indices[:5], b.read(key).indices)


def test_record_puts_the_process_float_settings_back(tiny, tmp_path) -> None:
    """The recorder flushes denormals to zero and runs one thread while it records; afterwards
    the caller's process computes subnormals again (hypothesis and numpy code that follows in the
    same process depend on it) and has its thread count back."""
    import numpy as np
    import torch

    threads = torch.get_num_threads()
    record(_spec(tiny["llama"], tmp_path / "f.hst", ks=(8,), steps=2), quiet=True)
    tiny_value = np.float32(1e-40)
    assert tiny_value * np.float32(1.0) != 0.0 and torch.tensor([1e-40]).item() != 0.0
    assert torch.get_num_threads() == threads
