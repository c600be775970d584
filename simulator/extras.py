"""Optional extras (``pip install 'hisparse-sim[record]'``): a command that needs one says which
to install, in one line, before any work, instead of failing on an ImportError mid-run."""

from __future__ import annotations

import importlib

from .errors import HisparseError

# extra -> the modules it provides that the commands import (pyproject.toml's optional-dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "record": ("torch", "gguf", "tokenizers"),
    "sweep": ("ray",),
}


class MissingExtra(HisparseError):
    """A module of an optional extra is not installed."""


def require(extra: str, command: str) -> None:
    """Import every module of ``extra`` (they are about to be used) or raise one line naming the
    missing module and the pip command that installs it."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtra(f"{command} needs {module}, which is not installed: pip install 'hisparse-sim[{extra}]' "
                               f"(in a checkout: pip install -e '.[{extra}]')") from None
