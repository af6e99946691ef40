"""``agency.Model``: a model with its own endpoint, key, sampling options and prices.

A :class:`Model` names the provider's model string (``"openai/llama-3"``, ``"fake/echo"``)
and what a request to it carries: ``api_base``, ``api_key`` (a ``SecretStr``: never in a
repr, a dump, a log line, the journal or a stored record), ``temperature``, ``seed``,
``top_p`` and other provider keyword arguments (``options``), and optionally its own
per-token prices, which win over the provider's.

Runs store a model by its :attr:`Model.name` only, so secrets are never stored. The
process-wide registry (:data:`MODELS`) maps names to models: :func:`register_model` (at
import, like entries, so another process resuming a run finds it), and a ``Model`` passed to
``agency.run`` or ``agency.enqueue`` registers itself under its name (a different model
already under that name is refused: the run will be resumed by name). A ``Model`` passed
to ``agency.llm`` is used for that call only. A model string that equals a registered name
resolves to that model (:func:`resolve_model`); any other string is a plain provider model
string, as a ``Model`` of just that string.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Iterator, Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, SecretStr, ValidationError, model_validator

from .._core._jsondata import check_text, json_problem
from .._core._money import PICO_PER_USD
from .._errors import InvalidArgumentError
from .._types import DeferredModel

if TYPE_CHECKING:
    from ._provider import Usage

__all__ = [
    "MODELS",
    "RESERVED_OPTIONS",
    "Model",
    "ModelRegistry",
    "check_model",
    "model_name",
    "register_model",
    "registered_model",
    "resolve_model",
    "run_model",
    "unregister_model",
]

_FIELDS = (
    "model",
    "name",
    "api_base",
    "api_key",
    "temperature",
    "seed",
    "top_p",
    "options",
    "json_schema",
    "input_cost_per_token",
    "output_cost_per_token",
)

RESERVED_OPTIONS: Mapping[str, str] = {
    **{name: f"it is the Model field {name}=" for name in _FIELDS},
    "messages": "the runtime sends the thread's messages",
    "tools": "pass tools=... to agency.llm",
    "stream": "use agency.llm(on_token=...) or agency.llm_stream",
    "stream_options": "the runtime sets it when it streams",
    "timeout": "pass timeout=... to agency.llm",
    "num_retries": "the runtime retries transient errors itself",
    "response_format": (
        "pass schema=... to agency.llm (with Model(..., json_schema=True) it is sent as a "
        "JSON-schema response_format)"
    ),
    "input": "the runtime sends the texts to embed",
    "base_url": "use api_base=",
}
"""Keys ``options`` may not hold, with what to do instead."""

_MAX_NAME = 512


def _problem(data: Mapping[str, Any]) -> str | None:
    """What is wrong with a model's fields (never quoting the api_key), or ``None``."""
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        return (
            "Model needs the provider's model string, e.g. Model('openai/gpt-4o-mini'); "
            f"got {model!r}"
        )
    name = data.get("name")
    if name is not None and (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > _MAX_NAME
        or any(ord(c) < 32 for c in name)
    ):
        return (
            f"Model name must be a non-empty string of at most {_MAX_NAME} printable "
            f"characters (the name runs record), got {name!r:.80}"
        )
    api_base = data.get("api_base")
    if api_base is not None:
        parts = urlsplit(api_base) if isinstance(api_base, str) else None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.netloc
            or any(c.isspace() for c in str(api_base))
        ):
            return (
                "Model api_base must be an http(s) URL like 'http://localhost:8000/v1', "
                f"got {api_base!r:.120}"
            )
        if parts.username is not None or parts.password is not None:
            return (
                "Model api_base must not hold credentials (user:password@): they would show "
                "wherever the model is shown; pass the key as api_key="
            )
    api_key = data.get("api_key")
    if api_key is not None:
        if not isinstance(api_key, str | SecretStr):
            return f"Model api_key must be a str or a SecretStr, got {type(api_key).__name__}"
        secret = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if not isinstance(secret, str) or not secret.strip():
            return "Model api_key must be a non-empty string (or None for the provider's default)"
    for field, low, high in (
        ("temperature", 0.0, math.inf),
        ("top_p", 0.0, 1.0),
        ("input_cost_per_token", 0.0, math.inf),
        ("output_cost_per_token", 0.0, math.inf),
    ):
        value = data.get(field)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            bounds = "a finite number >= 0" if high == math.inf else f"a number in [{low}, {high}]"
            unit = " (US dollars a token)" if field.endswith("per_token") else ""
            return f"Model {field} must be {bounds}{unit}, got {value!r}"
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return f"Model seed must be a whole number, got {seed!r}"
    json_schema = data.get("json_schema")
    if json_schema is not None and not isinstance(json_schema, bool):
        return (
            "Model json_schema must be True (the endpoint constrains its output to a JSON "
            "schema), False (put the schema in the prompt) or None (ask the provider), "
            f"got {json_schema!r:.80}"
        )
    options = data.get("options")
    if options is not None:
        return _options_problem(options)
    return None


def _options_problem(options: object) -> str | None:
    if not isinstance(options, Mapping):
        return (
            "Model options must be a dict of provider keyword arguments, "
            f"got {type(options).__name__}"
        )
    for key in options:
        if not isinstance(key, str) or not key.isidentifier():
            return f"Model options keys must be keyword-argument names, got {key!r}"
        reason = RESERVED_OPTIONS.get(key)
        if reason is not None:
            return f"Model options may not set {key!r}: {reason}"
    problem = json_problem(dict(options))
    if problem is not None:
        return f"Model options must be JSON data: {problem}"
    return None


class Model(DeferredModel):
    """A model to call, with what each request to it carries.

    ``model`` is the provider's model string (``"openai/llama-3"``, ``"fake/echo"``);
    ``name`` (default: ``model``) is what runs record and what the registry knows it by.
    ``api_base`` and ``api_key`` reach the provider with every request (the key is a
    ``SecretStr``: it is shown as ``'**********'`` everywhere). ``temperature``, ``seed``,
    ``top_p`` and ``options`` (more provider keyword arguments, JSON data) are sent when
    set. ``json_schema`` says whether the endpoint constrains its output to a JSON schema
    (``agency.llm(..., schema=X)`` then sends it as ``response_format``; ``None``, the
    default: ask the provider, which knows hosted models but not local servers).
    ``input_cost_per_token`` / ``output_cost_per_token`` (US dollars) price its calls, over
    any price the provider reports; a call of a model nobody priced is billed $0.

    Frozen. Invalid fields raise :class:`~agency_runtime.InvalidArgumentError`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    model: str
    """The provider's model string (it picks the provider: ``fake/...``, else litellm)."""
    name: str
    """What runs and journals record (default: :attr:`model`)."""
    api_base: str | None = None
    """The endpoint's base URL (``http(s)://...``), e.g. an OpenAI-compatible server."""
    api_key: SecretStr | None = None
    """The key sent to the endpoint; never shown, logged or stored."""
    temperature: float | None = None
    seed: int | None = None
    top_p: float | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    """Other keyword arguments for the provider (``{"presence_penalty": 0.5}``)."""
    json_schema: bool | None = None
    """Whether ``agency.llm(..., schema=X)`` sends ``X`` as a JSON-schema ``response_format``
    for the endpoint to constrain its output (``True``: e.g. llama.cpp, vLLM; ``False``: the
    schema goes in the prompt); ``None``: the provider decides (litellm knows hosted models;
    an ``openai/<local>`` model it does not know gets the prompt)."""
    input_cost_per_token: float | None = None
    """US dollars per prompt token (wins over the provider's price)."""
    output_cost_per_token: float | None = None
    """US dollars per completion token (wins over the provider's price)."""

    def __init__(
        self,
        model: str,
        *,
        name: str | None = None,
        api_base: str | None = None,
        api_key: SecretStr | str | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        top_p: float | None = None,
        options: Mapping[str, Any] | None = None,
        json_schema: bool | None = None,
        input_cost_per_token: float | None = None,
        output_cost_per_token: float | None = None,
    ) -> None:
        fields: dict[str, Any] = {
            "model": model,
            "name": model if name is None else name,
            "api_base": api_base,
            "api_key": api_key,
            "temperature": temperature,
            "seed": seed,
            "top_p": top_p,
            "options": {} if options is None else options,
            "json_schema": json_schema,
            "input_cost_per_token": input_cost_per_token,
            "output_cost_per_token": output_cost_per_token,
        }
        problem = _problem(fields)
        if problem is not None:
            raise InvalidArgumentError(problem)
        check_text(fields["name"], "Model name")
        try:
            super().__init__(**fields)
        except ValidationError as exc:  # pragma: no cover - _problem checks everything first
            raise InvalidArgumentError(f"invalid Model: {exc.errors()[0]['msg']}") from None

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:
        """``Model.model_validate(...)`` gets the same checks (and ``name`` its default)."""
        if not isinstance(data, Mapping):
            return data
        fields = dict(data)
        if fields.get("name") is None and isinstance(fields.get("model"), str):
            fields["name"] = fields["model"]
        problem = _problem(fields)
        if problem is not None:
            raise ValueError(problem)
        if fields.get("options") is not None:
            fields["options"] = copy.deepcopy(dict(fields["options"]))
        for field in ("temperature", "top_p", "input_cost_per_token", "output_cost_per_token"):
            if isinstance(fields.get(field), int):
                fields[field] = float(fields[field])
        return fields

    # -- what a request carries ----------------------------------------------------------

    @property
    def params(self) -> dict[str, Any]:
        """The provider keyword arguments of every chat request: ``options``, then
        ``temperature``, ``seed`` and ``top_p`` when set."""
        params = copy.deepcopy(self.options) if self.options else {}
        for field in ("temperature", "seed", "top_p"):
            value = getattr(self, field)
            if value is not None:
                params[field] = value
        return params

    @property
    def priced(self) -> bool:
        """Whether this model has a price of its own (then it wins over the provider's)."""
        return self.input_cost_per_token is not None or self.output_cost_per_token is not None

    def price_pico(self, usage: Usage) -> int:
        """What ``usage`` costs at this model's prices, in exact pico-dollars (an unset
        price counts as 0)."""
        total = Decimal(0)
        for price, tokens in (
            (self.input_cost_per_token, usage.prompt_tokens),
            (self.output_cost_per_token, usage.completion_tokens),
        ):
            if price:
                total += Decimal(repr(float(price))) * tokens
        return int((total * PICO_PER_USD).to_integral_value(ROUND_HALF_EVEN))

    # -- shown without secrets ---------------------------------------------------------------

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """Only the fields that are set (the api_key as ``'**********'``)."""
        yield "model", self.model
        if self.name != self.model:
            yield "name", self.name
        for field in _FIELDS[2:]:
            value = getattr(self, field)
            if value is not None and value != {}:
                yield field, value

    def __hash__(self) -> int:
        return hash((self.model, self.name, self.api_base))

    def _differences(self, other: Model) -> list[str]:
        """The names of the fields whose values differ from ``other``'s (never a value)."""
        return [field for field in _FIELDS if getattr(self, field) != getattr(other, field)]


# -- the registry --------------------------------------------------------------------------------


class ModelRegistry:
    """Name → :class:`Model`, for the process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, Model] = {}

    def register(self, model: Model) -> Model | None:
        """Make ``model.name`` resolve to ``model``; return the model it replaces, if any."""
        if not isinstance(model, Model):
            raise InvalidArgumentError(
                f"register_model needs an agency.Model(...), got {type(model).__name__}"
            )
        with self._lock:
            previous = self._models.get(model.name)
            self._models[model.name] = model
        return previous

    def adopt(self, model: Model) -> Model:
        """Register ``model`` under its name unless an equal model holds it already.

        A different model under the same name raises: a run records only the name, so a
        name must mean one model in a process.
        """
        with self._lock:
            held = self._models.get(model.name)
            if held is None:
                self._models[model.name] = model
                return model
        if held == model:
            return held
        differ = ", ".join(held._differences(model))
        raise InvalidArgumentError(
            f"another agency.Model is registered under the name {model.name!r} (it differs "
            f"in {differ}); runs record models by name, so give this one its own "
            f"Model(..., name='...'), or replace the other with agency.register_model(...)"
        )

    def unregister(self, name: str) -> Model | None:
        """Forget the model registered under ``name``; return it (``None``: there was none)."""
        with self._lock:
            return self._models.pop(name, None)

    def get(self, name: str) -> Model | None:
        """The model registered under ``name``, or ``None``."""
        return self._models.get(name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        with self._lock:
            return sorted(self._models)

    def api_keys(self) -> list[str]:
        """The api_keys of the registered models (to mask them where an error quotes one)."""
        with self._lock:
            keys = [m.api_key for m in self._models.values() if m.api_key is not None]
        return [key.get_secret_value() for key in keys]

    def clear(self) -> None:
        """Forget every registered model (tests)."""
        with self._lock:
            self._models.clear()


MODELS = ModelRegistry()


def known_secrets(model: object = None) -> list[str]:
    """What a stored error or a trace must not quote: the api_key of ``model`` (when it is
    an :class:`Model` holding one) and of every registered model."""
    keys = MODELS.api_keys()
    if isinstance(model, Model) and model.api_key is not None:
        keys.append(model.api_key.get_secret_value())
    return keys


"""The process's named models."""


def register_model(model: Model) -> Model | None:
    """Make the string ``model.name`` mean ``model`` in this process (in ``agency.llm``,
    ``agency.run``, ``agency.enqueue``, ``AGENCY_MODEL`` and resumed runs); return the model
    it replaces. Register models at import, like entries, so every process that may resume
    a run knows them."""
    return MODELS.register(model)


def unregister_model(name: str) -> Model | None:
    """Undo :func:`register_model` for ``name``; return the model it forgets."""
    return MODELS.unregister(name)


def registered_model(name: str) -> Model | None:
    """The model registered under ``name``, or ``None``."""
    return MODELS.get(name)


def check_model(model: object, what: str = "model") -> str | Model | None:
    """``model`` when it is ``None``, a non-empty string or a :class:`Model`; else an
    :class:`InvalidArgumentError`."""
    if model is None or isinstance(model, Model):
        return model
    if not isinstance(model, str) or not model.strip():
        raise InvalidArgumentError(
            f"{what} must be a non-empty string like 'openai/gpt-4o-mini' or an "
            f"agency.Model(...), got {model!r:.80}"
        )
    return model


def model_name(model: str | Model | None) -> str | None:
    """What a run records for ``model``: a model's name, a string as it is."""
    return model.name if isinstance(model, Model) else model


def resolve_model(model: str | Model) -> Model:
    """``model`` itself, the model registered under the string, or a model of the plain
    provider string."""
    if isinstance(model, Model):
        return model
    registered = MODELS.get(model)
    if registered is not None:
        return registered
    plain = _PLAIN.get(model)
    if plain is None:
        plain = Model(model)  # checked (and refused) here, once per string
        if len(_PLAIN) >= _MAX_PLAIN:
            _PLAIN.clear()
        _PLAIN[model] = plain
    return plain


_PLAIN: dict[str, Model] = {}
"""The models of plain provider strings :func:`resolve_model` made (a ``Model`` is frozen and
building one validates every field: each ``agency.llm`` call on a string model asks again)."""
_MAX_PLAIN = 256


def run_model(model: str | Model | None) -> str | Model | None:
    """A run's model for its context: the registered model of a stored name, else the name."""
    if isinstance(model, str):
        return MODELS.get(model) or model
    return model
