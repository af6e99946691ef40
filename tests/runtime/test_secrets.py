"""Secrets in any case and in any parameter (issue 23, DESIGN.md §11.1):

* a provider's error that echoes the model's api_key in another case (``INVALID KEY SK-…``)
  is masked like the key as sent: in ``RunResult.error``, the exception and every exception
  it chains (message, arguments, traceback text), the store, ``agency runs show --json``,
  the DEBUG log and the OpenTelemetry span events; at the seam, streamed, after transient
  retries, and through litellm;
* a store URL shows none of its secrets: the user info's password and every secret-bearing
  query parameter or conninfo setting (``password``, ``sslpassword``, tokens, keys),
  whatever their case or percent-encoding, in ``store.url``, ``agency runs list`` and the
  errors that quote the URL; paths (``passfile``, ``sslkey``) are shown.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import traceback
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agency_runtime._llm._retries as retries_module
from agency_runtime import (
    InvalidArgumentError,
    LLMCallError,
    Model,
    PostgresStore,
    Store,
    StoreUnavailableError,
    agency,
    open_store,
)
from agency_runtime._secrets import mask, quotes
from agency_runtime._store._redact import redact
from agency_runtime.testing import FakeModel, FakeRequest, reset
from tests.runtime.test_otel import Spans, spans  # noqa: F401 (spans: the exporter fixture)
from tests.support import LITELLM, SHARES_LITELLM, asyncio_only
from tests.test_cli import run_cli

pytestmark = pytest.mark.anyio

KEY = "sk-test-5ecret-9f8e7d"
ECHOES = (KEY.upper(), KEY.title(), "Sk-TeSt-5eCrEt-9F8e7D")
"""The key as providers echo it back: in capitals, title case and mixed case."""


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fast backoff, no fakes after, and the sys.path the CLI changes put back."""
    monkeypatch.setattr(retries_module, "BACKOFF_BASE", 0.001)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    reset()


def leaks(text: str) -> bool:
    """Whether ``text`` holds the key, in any case."""
    return KEY.lower() in text.lower()


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it chains (``__cause__`` and ``__context__``)."""
    pending, seen = [error], set()
    while pending:
        exc = pending.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        yield exc
        pending.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)


def assert_no_key_in(error: BaseException) -> None:
    assert not leaks("".join(traceback.format_exception(error)))
    for exc in chain(error):
        for text in (str(exc), repr(exc), repr(exc.args), repr(getattr(exc, "__notes__", ""))):
            assert not leaks(text), (type(exc), text)


def shouting(request: FakeRequest) -> str:
    """A provider that refuses the key, echoing it in other cases."""
    raise PermissionError(f"401 INVALID KEY {ECHOES[0]} (seen as {ECHOES[1]}, {ECHOES[2]})")


def model(name: str = "shouts") -> Model:
    return Model(f"fake/{name}", api_key=KEY)


@agency.entry
async def asks(name: str = "shouts", streamed: bool = False) -> str:
    on_token = (lambda delta: None) if streamed else None
    return str(await agency.llm("hi", model=model(name), on_token=on_token))


# -- the key, in any case ---------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_a_key_echoed_in_capitals_is_masked_everywhere(
    store: Store,
    caplog: pytest.LogCaptureFixture,
    spans: InMemorySpanExporter,  # noqa: F811
    streamed: bool,
) -> None:
    caplog.set_level(logging.DEBUG)
    with FakeModel("shouts", function=shouting):
        result = await agency.run(asks, "shouts", streamed, run_id="shouted", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert "401 INVALID KEY ********** (seen as **********, **********)" in result.error.message
    assert not leaks(result.error.message)
    assert not leaks(repr(result))
    assert isinstance(result.exception, LLMCallError)
    assert_no_key_in(result.exception)
    record = await agency.runs.get("shouted", store=store)
    journal = await store.load_journal("shouted")
    for text in (record.model_dump_json(), repr(record), journal.model_dump_json()):
        assert not leaks(text), text
    assert "run 'shouted' failed" in caplog.text  # the DEBUG line, with its traceback
    assert "INVALID KEY **********" in caplog.text
    assert not leaks(caplog.text)
    found = Spans(spans)
    events = [
        (name, value)
        for span in found.all
        for event in span.events
        for name, value in (event.attributes or {}).items()
    ]
    messages = [str(value) for name, value in events if name == "exception.message"]
    assert any("INVALID KEY **********" in m for m in messages), messages
    for name, value in events:
        assert not leaks(str(value)), (name, value)
    for span in found.all:
        assert not leaks(str(span.status.description)), span.name


async def test_a_key_echoed_by_transient_errors_is_masked_in_the_retries_and_the_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    echoes = [ConnectionError(f"reset while sending {echo}") for echo in ECHOES]
    caplog.set_level(logging.DEBUG)
    with (
        FakeModel("flaky", replies=echoes) as fake,
        agency.test_context(),
        pytest.raises(LLMCallError) as caught,
    ):
        await agency.llm("hi", model=model("flaky"))
    assert len(fake.calls) == 3
    assert "failed 3 times: ConnectionError: reset while sending **********" in str(caught.value)
    assert_no_key_in(caught.value)
    retries = [r.getMessage() for r in caplog.records if "transient error" in r.getMessage()]
    assert len(retries) == 2
    assert all("reset while sending **********" in m for m in retries), retries
    assert not leaks(caplog.text)


async def test_the_chained_exception_keeps_no_copy_of_the_key() -> None:
    """The provider's own exception is neither the cause nor the (hidden) context of the
    error: both would hand the key to whoever walks the chain (a reporter, a logger)."""

    def refuse(request: FakeRequest) -> str:
        error = PermissionError("denied")
        error.add_note(f"the key was {KEY.upper()}")
        raise error

    with (
        FakeModel("notes", function=refuse),
        agency.test_context(),
        pytest.raises(LLMCallError) as caught,
    ):
        await agency.llm("hi", model=model("notes"))
    assert caught.value.__context__ is None
    assert caught.value.__cause__ is not None
    assert_no_key_in(caught.value)


def test_runs_show_json_never_shows_the_key(
    store_url: tuple[str, Store], capsys: pytest.CaptureFixture[str]
) -> None:
    url, store = store_url
    with FakeModel("shouts", function=shouting):
        result = agency.run_sync(asks, run_id="shown", store=store)
    assert result.status == "failed"
    code, out, _ = run_cli(capsys, "runs", "show", "shown", "--store", url, "--json")
    assert code == 0
    shown = json.loads(out)
    assert "INVALID KEY **********" in json.dumps(shown)
    assert not leaks(out)
    code, out, _ = run_cli(capsys, "runs", "list", "--store", url, "--json")
    assert code == 0
    assert not leaks(out)


def test_the_inspector_never_shows_the_key(store: Store) -> None:
    from starlette.testclient import TestClient

    from agency_runtime._ui import create_app

    with FakeModel("shouts", function=shouting):
        assert agency.run_sync(asks, run_id="inspected", store=store).status == "failed"
    with TestClient(create_app(store), base_url="http://127.0.0.1:8765") as http:
        pages = [http.get("/runs"), http.get("/run", params={"id": "inspected"})]
    assert all(page.status_code == 200 for page in pages)
    assert "INVALID KEY **********" in pages[1].text
    for page in pages:
        assert not leaks(page.text)


@SHARES_LITELLM
@asyncio_only(LITELLM)  # via_litellm=True: litellm.acompletion answers the fake
async def test_a_key_echoed_in_capitals_through_litellm_is_masked(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with FakeModel("shouts", function=shouting, via_litellm=True):
        result = await agency.run(asks, run_id="shouted-litellm", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert "INVALID KEY **********" in result.error.message
    assert result.exception is not None
    assert_no_key_in(result.exception)
    record = await agency.runs.get("shouted-litellm", store=store)
    assert not leaks(record.model_dump_json())
    assert not leaks(caplog.text)


def test_mask_ignores_case_and_masks_the_longest_secret_first() -> None:
    assert mask(f"a {KEY.upper()} b {KEY}", KEY) == "a ********** b **********"
    assert mask("pass PASSWORD", "pass", "password") == "********** **********"
    assert mask("nothing here", None, "") == "nothing here"
    assert mask("s3cret S3CRET", "s3cret", shown="***") == "*** ***"
    assert mask("a.b a-b", "a.b") == "********** a-b"  # literal, not a pattern
    assert quotes(f"x {KEY.title()}", KEY)
    assert not quotes("x", KEY, None)


# -- store URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://agent:hunter2@db:5432/agency?sslpassword=S3cret&sslmode=require",
            "postgresql://agent:***@db:5432/agency?sslpassword=***&sslmode=require",
        ),
        (
            "postgresql://db/agency?SSLPassword=S3cret&PASSWORD=S3cret&passfile=/home/a/.pgpass"
            "&sslkey=/keys/client.key",
            "postgresql://db/agency?SSLPassword=***&PASSWORD=***&passfile=/home/a/.pgpass"
            "&sslkey=/keys/client.key",
        ),
        (
            "postgresql://db/agency?ssl%70assword=S3cret&application_name=a%20b",
            "postgresql://db/agency?ssl%70assword=***&application_name=a%20b",
        ),
        (
            "postgresql://db/agency?api_key=S3cret&auth-token=S3cret&client_secret=S3cret",
            "postgresql://db/agency?api_key=***&auth-token=***&client_secret=***",
        ),
        ("postgresql://agent:pa/ss@db/agency", "postgresql://agent:***@db/agency"),
        ("postgresql://agent:pa?ss@db/agency", "postgresql://agent:***@db/agency"),
        ("postgresql://agent:p@ss#1@db/agency?x=1", "postgresql://agent:***@db/agency?x=1"),
        ("postgresql://db:5432/agency?application_name=me@host", None),
        ("postgresql://agent@db/agency", None),
        (
            "host=db password=S3cret sslpassword = 'S3 cret' user=agent",
            "host=db password=*** sslpassword = *** user=agent",
        ),
        ("host=db SSLPASSWORD=S3cret", "host=db SSLPASSWORD=***"),
        ("sqlite:///runs.db?password=S3cret", "sqlite:///runs.db?password=***"),
        ("sqlite:////abs/me@work/runs.db", None),
        ("memory://", None),
    ],
)
def test_redact_masks_every_secret_bearing_part(url: str, shown: str | None) -> None:
    assert redact(url) == (url if shown is None else shown)


@pytest.mark.parametrize(
    "url",
    [
        "host=db password=S3cret",
        "sqlite:///runs.db?sslpassword=S3cret",
        "memory://x?token=S3cret",
    ],
)
def test_errors_about_a_store_url_quote_it_without_its_secrets(url: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        open_store(url)
    assert "S3cret" not in str(caught.value)
    assert "***" in str(caught.value)


def test_an_unreachable_server_is_named_without_its_ssl_password() -> None:
    url = "postgresql://agent@127.0.0.1:1/agency?sslpassword=S3cret&connect_timeout=1"
    with pytest.raises(StoreUnavailableError) as caught:
        open_store(url)
    assert "S3cret" not in str(caught.value)
    assert "sslpassword=***" in str(caught.value)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_runs_list_and_the_store_never_show_the_ssl_password(
    store_url: tuple[str, Store], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = store_url
    secret = f"{url}&sslpassword=S3cret"
    store = open_store(secret)
    assert isinstance(store, PostgresStore)
    assert "S3cret" not in store.url
    assert "sslpassword=***" in store.url
    assert store._scrub("server said: bad key password S3CRET (s3cret)") == (
        "server said: bad key password *** (***)"
    )
    for argv in (("runs", "list"), ("runs", "show", "nope")):
        code, out, err = run_cli(capsys, *argv, "--store", secret)
        assert "S3cret" not in out + err, argv
        assert re.search(r"sslpassword=\*\*\*", out + err), (argv, out, err)
    assert code != 0  # no run "nope": the error names the store, redacted
