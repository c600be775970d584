"""User-facing errors: the CLI prints their message and exits non-zero, with no traceback."""

from __future__ import annotations


class HisparseError(Exception):
    """An error caused by the user's input (a file, an option), not by a bug."""


class TraceError(HisparseError):
    """A bad trace: the message names the file and, where known, request, layer and step."""

    def __init__(
        self,
        problem: str,
        *,
        path: object = None,
        request: int | None = None,
        layer: int | None = None,
        step: int | None = None,
    ) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.request, self.layer, self.step = request, layer, step
        where = [self.path] if self.path else []
        for name, value in (("request", request), ("layer", layer), ("step", step)):
            if value is not None:
                where.append(f"{name} {value}")
        super().__init__(f"{', '.join(where)}: {problem}" if where else problem)

    def at(self, *, path: object = None, request: int | None = None, layer: int | None = None) -> TraceError:
        """The same problem with more of its location filled in (what the caller knows)."""
        return TraceError(
            self.problem,
            path=self.path if path is None else path,
            request=self.request if request is None else request,
            layer=self.layer if layer is None else layer,
            step=self.step,
        )
