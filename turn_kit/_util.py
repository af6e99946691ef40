"""Small helpers shared by turn_kit's modules: sync-or-async callbacks and duck-typed fields."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["DeferredModel", "field", "maybe_await"]


class DeferredModel(BaseModel):
    """The base of turn_kit's models, as of agency_runtime's: a schema is built on first use.

    Building every model's validator and serializer when its module was imported was most of
    the import's time, so each model defers it (``defer_build``) until it is first validated,
    dumped or described. ``defer_build`` alone would let an instance exist while its class is
    still unbuilt — made inside another model's or a TypeAdapter's validation (ours or a
    user's), by ``model_construct``, or unpickled — and pydantic-core cannot serialize such an
    instance by itself (``to_json(instance)``: "'MockValSer' object is not an instance of
    'SchemaSerializer'"). So every instance completes its class as it is made
    (``model_post_init``, ``__setstate__``): no instance of an unbuilt class ever exists.
    """

    model_config = ConfigDict(defer_build=True)

    def model_post_init(self, context: Any, /) -> None:
        """Build this model's class if this is its first instance (see the class docstring)."""
        if not type(self).__pydantic_complete__:
            _complete(type(self))

    def __setstate__(self, state: dict[Any, Any]) -> None:
        """Unpickle, building the class first (see the class docstring)."""
        _complete(type(self))
        super().__setstate__(state)


def _complete(model: type[BaseModel]) -> None:
    """Build ``model``'s schema, validator and serializer now if they are still deferred."""
    if not model.__pydantic_complete__:
        # Depth 0: its annotations resolve in its own module, never in some caller's locals.
        model.model_rebuild(_parent_namespace_depth=0)


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (callbacks may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


def field(value: object, name: str) -> Any:
    """``value[name]`` for a mapping, else ``value.name`` (``None`` when absent)."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)
