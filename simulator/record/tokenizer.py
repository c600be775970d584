"""A `tokenizers` tokenizer rebuilt from the vocabulary a GGUF file carries (no hub access)."""

from __future__ import annotations

from typing import Any

from ..errors import HisparseError

_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types that are never produced by merges


def build_tokenizer(meta: dict[str, Any]):
    """GPT-2 byte-level BPE (``gpt2``) or SentencePiece-style BPE with byte fallback (``llama``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if not meta.get("tokenizer.ggml.tokens"):  # was a KeyError traceback
        raise HisparseError("the GGUF file carries no vocabulary (metadata 'tokenizer.ggml.tokens')")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
        tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=False))
        pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if meta.get("tokenizer.ggml.pre") == "smollm":  # SmolLM splits digits one by one
            pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        tok = Tokenizer(models.BPE(vocab, _merges_from_scores(tokens, scores, types), byte_fallback=True,
                                   fuse_unk=True, unk_token=tokens[meta.get("tokenizer.ggml.unknown_token_id", 0)]))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    else:
        raise HisparseError(f"tokenizer model {kind!r} is not supported (gpt2 and llama are)")
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=True)
               if ty == _CONTROL]
    tok.add_special_tokens(special)
    # SentencePiece user-defined pieces (Gemma's runs of spaces and newlines) match the raw
    # text greedily, before any merge.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types, strict=True)
                    if ty == _USER_DEFINED])
    return tok


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges for a SentencePiece vocabulary: every split of a piece into two pieces,
    ranked by the merged piece's score (SentencePiece merges the best-scoring pair first)."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] not in (_CONTROL, _USER_DEFINED)}
    found: list[tuple[float, int, int, str, str]] = []
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            a, b = vocab.get(left), vocab.get(right)
            if a is not None and b is not None:
                found.append((-scores[i], a, b, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def encode(tokenizer, text: str, *, bos: int | None) -> list[int]:
    """Token ids of ``text`` (no special tokens added), with ``bos`` first when given."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return ([bos] if bos is not None else []) + list(ids)
