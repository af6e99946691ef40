"""Tools for ``agency.llm(..., tools=[...])``: a Python function and the JSON schema of its
arguments, built from its signature and docstring with pydantic.

``agency.tool(fn, name=None, description=None, needs_approval=False)`` wraps a function (sync
or async); a bare function in ``tools=`` is wrapped with the defaults. The schema comes from
the parameters' annotations (every parameter needs one pydantic can validate; ``*args`` and
``**kwargs`` are refused), their defaults, and the descriptions of a Google-style ``Args:``
section; the tool's description is the docstring's text before its sections.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import from_json

from .._bounds import check_seconds
from .._core._jsondata import json_problem
from .._errors import InvalidArgumentError
from .._policies import Retry, as_policy

if TYPE_CHECKING:
    from ._provider import ToolSpec

__all__ = ["Tool", "as_tools", "tool"]

# Patterns, compiled (and cached by re) on first use:
_NAME = r"^[A-Za-z0-9_-]{1,64}$"
_SECTION = r"^\s*(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?):\s*$"
_ARG = r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$"


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call, with the schema of its arguments.

    Build one with :func:`agency.tool <tool>`. ``arguments`` validates the model's
    arguments; ``spec`` is what the provider is sent.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    needs_approval: bool
    arguments: type[BaseModel]
    spec: ToolSpec
    retries: Retry | None = None
    """Durable retries of a failing call (``agency.tool(fn, retries=...)``), else none."""
    timeout: float | None = None
    """Seconds one call (one attempt) may take, else unbounded."""

    @property
    def step_name(self) -> str:
        """The name of a call's journaled unit (``tool:<step_name>``): the tool's name."""
        return self.name

    def parse(self, text: str) -> dict[str, Any]:
        """The model's arguments (JSON text) validated: the keyword arguments to call with.

        Raises ``ValidationError`` (or ``ValueError`` for text that is not JSON, or for
        numbers JSON cannot hold: ``Infinity``, ``NaN``, ``1e400``, which are invalid
        arguments to feed back like any other, DESIGN §11.1).
        """
        validated = self.arguments.model_validate_json(text or "{}")
        problem = json_problem(from_json(text or "{}"))
        if problem is not None:
            raise ValueError(f"{problem}; send finite numbers")
        return {name: getattr(validated, name) for name in type(validated).model_fields}


def _described(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """A docstring's summary (the text before its first section) and its ``Args:`` lines."""
    doc = inspect.getdoc(fn) or ""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        header = re.match(_SECTION, line)
        if header:
            section, current = header.group(1).lower(), None
            continue
        if section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters"):
            arg = re.match(_ARG, line)
            if arg and not line.startswith((" " * 8, "\t\t")):
                current = arg.group(1).lstrip("*")
                params[current] = arg.group(2).strip()
            elif current is not None and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
    return " ".join(" ".join(summary).split()), params


def _arguments_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"tool {name!r}: cannot read its signature ({exc})") from exc
    try:
        hints = get_type_hints(fn)
    except Exception as exc:  # an annotation that does not resolve
        raise InvalidArgumentError(
            f"tool {name!r}: its annotations cannot be resolved ({type(exc).__name__}: {exc})"
        ) from exc
    _, described = _described(fn)
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidArgumentError(
                f"tool {name!r}: *{param.name} / **{param.name} parameters are not supported; "
                "name each argument the model may pass"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise InvalidArgumentError(
                f"tool {name!r}: positional-only parameter {param.name!r} is not supported "
                "(the model passes arguments by name)"
            )
        if param.name not in hints:
            raise InvalidArgumentError(
                f"tool {name!r}: parameter {param.name!r} needs a type annotation (the model "
                "is sent a JSON schema of the arguments)"
            )
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (
            hints[param.name],
            Field(default, description=described.get(param.name) or None),
        )
    try:
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        model.model_json_schema()
    except Exception as exc:  # pydantic cannot validate or describe a parameter's type
        raise InvalidArgumentError(
            f"tool {name!r}: an argument type is not supported ({type(exc).__name__}: {exc}); "
            "use JSON-friendly types (str, int, float, bool, lists, dicts, pydantic models)"
        ) from exc
    return model


def _make(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    needs_approval: bool,
    retries: Retry | int | None = None,
    timeout: float | None = None,
) -> Tool:
    if not callable(fn):
        raise InvalidArgumentError(f"a tool must be a function, got {type(fn).__name__}")
    chosen = name if name is not None else getattr(fn, "__name__", "")
    if not isinstance(chosen, str) or not re.match(_NAME, chosen):
        raise InvalidArgumentError(
            f"a tool's name must be 1 to 64 letters, digits, '_' or '-' (providers require it), "
            f"got {chosen!r}; pass name="
        )
    summary, _ = _described(fn)
    text = description if description is not None else summary
    if not isinstance(text, str):
        raise InvalidArgumentError(f"tool {chosen!r}: description must be a string")
    arguments = _arguments_model(fn, chosen)
    schema = arguments.model_json_schema()
    schema.pop("title", None)
    from ._provider import ToolSpec  # the seam's shapes load with their first use

    return Tool(
        fn=fn,
        name=chosen,
        description=text,
        needs_approval=bool(needs_approval),
        arguments=arguments,
        spec=ToolSpec(name=chosen, description=text, parameters=schema),
        retries=as_policy(retries, timeout),
        timeout=None if timeout is None else check_seconds(timeout, "tool: timeout", positive=True),
    )


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool = False,
    retries: Retry | int | None = None,
    timeout: float | None = None,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool = False,
    retries: Retry | int | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool = False,
    retries: Retry | int | None = None,
    timeout: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """A tool for ``agency.llm(..., tools=[...])``: ``agency.tool(fn)`` or ``@agency.tool(...)``.

    ``name`` defaults to the function's name, ``description`` to its docstring's summary.
    With ``needs_approval``, every call first asks a ``std::tool-approval`` interrupt (data
    ``{"tool", "arguments"}``); a rejection tells the model the call was refused.
    ``retries`` and ``timeout`` are a step's (``s.step``): a failing call is retried
    durably, each failed attempt journaled; after the last one the model reads the failure.
    """
    if fn is None:
        return lambda target: _make(target, name, description, needs_approval, retries, timeout)
    return _make(fn, name, description, needs_approval, retries, timeout)


def as_tools(tools: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """``tools=`` as tools by name (bare functions wrapped); duplicate names are refused."""
    if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
        raise InvalidArgumentError(
            f"tools must be a list of functions or agency.tool(...) values, got {tools!r:.60}"
        )
    chosen: dict[str, Tool] = {}
    for item in tools:
        made = item if isinstance(item, Tool) else _make(item, None, None, False)
        if made.name in chosen:
            raise InvalidArgumentError(
                f"two tools are named {made.name!r}; give one another name with "
                "agency.tool(fn, name=...)"
            )
        chosen[made.name] = made
    return chosen


ValidationFailure = (ValidationError, ValueError)
"""What :meth:`Tool.parse` raises for arguments the model got wrong."""
