"""The package surface: cheap import, public names, typed, one exception tree."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import agency_runtime
import turn_kit


def _fresh(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (its stderr shown if it fails)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


HEAVY = (
    # provider and transport libraries, imported by the first call that needs them
    "litellm", "openai", "telegram", "httpx", "slack_sdk", "aiohttp",
    # the extras: PostgreSQL, the run inspector, tracing, schedules
    "psycopg", "psycopg_pool", "starlette", "uvicorn", "opentelemetry", "croniter",
    # what an event loop or a feature brings, not the import: asyncio (trio programs never
    # load it), TLS, sqlite3 and the like
    "asyncio", "ssl", "certifi", "sqlite3", "email.utils", "hashlib", "socket", "json",
    # the package's own optional parts: the store backends, memory, the provider seam, the
    # offline fake provider (loaded by the first fake/ model, or agency_runtime.testing)
    "agency_runtime._store._postgres", "agency_runtime._store._sqlite",
    "agency_runtime._store._memory", "agency_runtime._memory", "agency_runtime._llm._provider",
    "agency_runtime._llm._litellm", "agency_runtime._fakes", "turn_kit.telegram",
    "turn_kit.slack",
)  # fmt: skip
"""Modules a program's first use of the packages (:data:`FIRST_USE`) must not load (issue 17:
the import's cost)."""


FIRST_USE = (
    "from agency_runtime import agency, AgencyError, RunResult, Message, Worker, open_store\n"
    "from turn_kit import create_turn_runner, TurnHistoryEntry, TurnKitError"
)
"""What a program of the README's kind imports: the runtime, the kit and their data shapes."""


def test_importing_the_packages_loads_only_their_shells() -> None:
    # Each public name loads its module on first read (PEP 562): the import itself loads
    # nothing of the runtime (issue 30: the import's cost as a ratio).
    code = (
        "import sys; before = set(sys.modules); import agency_runtime, turn_kit; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('agency_runtime', 'turn_kit')))"
    )
    assert _fresh(code) == str(["agency_runtime", "agency_runtime._lazy", "turn_kit"])


def test_a_first_use_of_the_packages_loads_nothing_heavy() -> None:
    # Compared with what the interpreter had loaded before the import: a site hook of the
    # environment may load some of these (certifi, say) in every interpreter, and the
    # dependencies the packages stand on (pydantic, anyio) load what their versions load
    # (pydantic 2.14's types module imports hashlib through secrets): what is ours is the rest.
    code = (
        "import sys; import pydantic, pydantic.types, pydantic_core, anyio; "
        f"before = set(sys.modules)\n{FIRST_USE}\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules and m not in before))"
    )
    assert _fresh(code) == "[]"


@pytest.mark.parametrize("package", [agency_runtime, turn_kit], ids=lambda p: p.__name__)
def test_each_lazy_name_is_the_one_type_checkers_see(package: ModuleType) -> None:
    # The TYPE_CHECKING imports (what mypy, pyright and IDEs see) and _LAZY (what a read
    # loads) name the same names from the same modules, and together they are __all__.
    assert package.__file__ is not None
    source = Path(package.__file__).read_text(encoding="utf-8")
    seen: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom)
                assert statement.level == 1
                for alias in statement.names:
                    seen[alias.name] = f".{statement.module}"
    lazy = vars(package)["_LAZY"]
    assert seen == lazy
    public = set(vars(package)["__all__"])
    assert set(lazy) == public - {"__version__"}
    assert set(dir(package)) >= public


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    for package in (agency_runtime, turn_kit):
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name  # noqa: B018


def test_importing_the_packages_builds_no_pydantic_schema() -> None:
    # Every model defers its schema to its first use (DeferredModel): none is built yet.
    code = (
        f"{FIRST_USE}\n"
        "from pydantic import BaseModel\n"
        "def models(cls):\n"
        "    for sub in cls.__subclasses__():\n"
        "        yield sub\n"
        "        yield from models(sub)\n"
        "print(sorted({m.__qualname__ for m in models(BaseModel)\n"
        "    if m.__module__.split('.')[0] in ('agency_runtime', 'turn_kit')\n"
        "    and m.__pydantic_complete__}))"
    )
    assert _fresh(code) == "[]"


def test_a_deferred_models_instances_serialize_however_they_were_made() -> None:
    # pydantic-core cannot serialize an instance of a class whose schema is still deferred;
    # DeferredModel builds the class with its first instance, whichever way it is made.
    code = """
import pickle
from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_json
from agency_runtime import Interrupt, JournalEntry, Message, RunResult
from turn_kit import TurnHistoryEntry

# the first Message, made without validation, serialized before anything else builds the class
assert b'"content":"hello"' in to_json(Message.trusted("assistant", "hello"))

class Users(BaseModel):  # a user's model, built now, holding one of ours
    history: list[Message]

made = [
    Users.model_validate({"history": [{"role": "user", "content": "hi"}]}).history[0],
    TypeAdapter(list[Interrupt]).validate_python([{"interrupt_id": "i"}])[0],
    TurnHistoryEntry.model_construct(content="x"),
    pickle.loads(pickle.dumps(RunResult.model_construct(run_id="r", status="completed"))),
    JournalEntry.from_row(dict(
        run_id="r", seq=1, path="p", name="n", callsite="", result="1", locals=None,
        scopes=None, deltas=None, error=None, cost_pico=0, tokens=0, created_at=1.0,
    )),
]
print([type(value).__name__ for value in made if not to_json(value)])
"""
    assert _fresh(code) == "[]"


def test_every_model_of_the_packages_derives_from_deferred_model() -> None:
    # Read from the source (importing every module would load litellm and the extras): a
    # class of the packages derives from pydantic's BaseModel only through DeferredModel,
    # and DeferredModel is written once (turn_kit uses agency_runtime's, no copy).
    root = Path(__file__).parent.parent
    direct, bases = [], []
    for package in ("agency_runtime", "turn_kit"):
        for file in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ClassDef):
                    continue
                if node.name == "DeferredModel":
                    bases.append(str(file.relative_to(root)))
                elif any(ast.unparse(base).endswith("BaseModel") for base in node.bases):
                    direct.append(f"{file.relative_to(root)}: {node.name}")
    assert direct == []
    assert bases == ["agency_runtime/_types.py"]


def test_turn_kits_models_derive_from_the_public_deferred_model() -> None:
    from agency_runtime._types import DeferredModel

    assert agency_runtime.DeferredModel is DeferredModel
    assert issubclass(turn_kit.TurnHistoryEntry, agency_runtime.DeferredModel)


def _documented_names() -> set[str]:
    """The names the README lists under *Public names*."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Public names", 1)[1]
    block = section.split("```text", 1)[1].split("```", 1)[0]
    names: set[str] = set()
    for line in block.splitlines():
        words = line.split(":", 1)[1] if ":" in line else line
        names.update(words.split())
    return names


def test_the_public_surface_is_exactly_the_documented_names() -> None:
    exported = set(agency_runtime.__all__)
    documented = _documented_names()
    assert exported - documented == set(), "exported but not documented in the README"
    assert documented - exported == set(), "documented in the README but not exported"
    assert len(agency_runtime.__all__) == len(exported), "__all__ lists a name twice"


def test_every_public_name_is_importable() -> None:
    for package in (agency_runtime, turn_kit):
        for name in package.__all__:
            assert hasattr(package, name), f"{package.__name__}.{name} is listed but missing"


@pytest.mark.parametrize(
    "name",
    [
        "agency",
        "CallsiteLocation",
        "Interrupt",
        "RunResult",
        "RuntimeContext",
        "ThreadStore",
        "MessageThread",
        "Message",
        "Store",
        "AgencyError",
        "OutsideFrameError",
        "RunNotFoundError",
        "GuardExceededError",
        "GuardApproveError",
        "CheckpointError",
        "LockReentryError",
        "LockTimeoutError",
        "HandlerRecursionError",
        "StepResultError",
        "NondeterminismError",
        "StructuredOutputError",
        "RunPaused",
        "RestoreSignal",
        "InvalidArgumentError",
        "RunConflictError",
        "RunFailedError",
        "RunPausedError",
    ],
)
def test_the_names_fixed_by_the_design_are_exported(name: str) -> None:
    assert name in agency_runtime.__all__


def test_the_packages_ship_py_typed() -> None:
    for package in (agency_runtime, turn_kit):
        assert (Path(package.__file__).parent / "py.typed").exists()


def _exported_exceptions() -> list[type[BaseException]]:
    values = [getattr(agency_runtime, name) for name in agency_runtime.__all__]
    return [
        value for value in values if inspect.isclass(value) and issubclass(value, BaseException)
    ]


def test_errors_form_one_tree_and_signals_escape_except_exception() -> None:
    signals = {agency_runtime.RunPaused, agency_runtime.RestoreSignal}
    for error in _exported_exceptions():
        if error in signals:
            assert not issubclass(error, Exception), error
        else:
            assert issubclass(error, agency_runtime.AgencyError), error
        assert error.__module__ == "agency_runtime._errors"
        assert error.__doc__, f"{error} has no docstring"
        assert "\n" not in error.__doc__.strip(), f"{error}: one-line docstring"


def test_invalid_argument_error_is_also_a_value_error() -> None:
    assert issubclass(agency_runtime.InvalidArgumentError, ValueError)
