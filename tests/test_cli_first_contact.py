"""First contact, second pass (issue 24), at the command line: a missing store named by
``--store``, ``schedules add`` of an entry no worker could run, a script that runs its own
event loop when ``--import`` imports it, and a fake model whose run spans processes."""

from __future__ import annotations

import inspect
import re
import textwrap
import uuid
from pathlib import Path

import pytest

from agency_runtime import pytest_plugin
from tests.forked import ForkServer
from tests.test_cli import _agency, _child_env, _python, run_cli

README = Path(__file__).resolve().parent.parent / "README.md"


def test_a_worker_on_a_missing_store_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "worker", "--store", f"sqlite:///{tmp_path}/new.db")
    assert code == 1
    assert f"no store at {tmp_path}/new.db (from --store " in err
    assert "the file does not exist" in err
    assert "check the path" in err
    assert "pass --store" not in err  # it was passed
    code, _, err = run_cli(capsys, "worker", "--store", f"sqlite:///{tmp_path}/nowhere/new.db")
    assert code == 1
    assert f"the directory {tmp_path}/nowhere does not exist" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "runs", "list")  # nothing named: the default store
    assert code == 1
    assert "pass --store URL or set AGENCY_STORE" in err


_JOBS = """
from agency_runtime import agency

def nightly() -> str:
    return "n"

def _make():
    @agency.entry
    def inner() -> str:
        return "i"
    return inner

INNER = _make()

@agency.entry
def declared() -> str:
    return "d"
"""


def test_schedules_add_refuses_an_entry_no_worker_could_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = f"fc_jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(_JOBS)
    url = f"sqlite:///{tmp_path / 's.db'}"
    common = ["--every", "60", "--import", module, "--store", url]
    for ref, why in [
        (f"{module}:INNER", "defined inside another function"),
        (f"{module}:nightly", "is not declared as an entry"),
    ]:
        code, _, err = run_cli(capsys, "schedules", "add", "s1", ref, *common)
        assert code == 1, ref
        assert len(err.strip().splitlines()) == 1
        assert "agency.schedules.add" in err
        assert why in err
    code, out, _ = run_cli(capsys, "schedules", "list", "--store", url)
    assert "no schedules" in out
    code, _, err = run_cli(capsys, "schedules", "add", "s1", f"{module}:declared", *common)
    assert code == 0, err


@pytest.mark.parametrize(
    "top_level",
    [
        'agency.run_sync(main, run_id="r1")',
        "anyio.run(agency.run, main)",
    ],
)
def test_an_imported_script_that_runs_its_own_loop_says_to_add_the_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], top_level: str
) -> None:
    script = tmp_path / f"app_{uuid.uuid4().hex[:8]}.py"
    script.write_text(
        "import anyio\nfrom agency_runtime import agency\n\n"
        "@agency.entry\ndef main() -> int:\n    return 1\n\n"
        f"{top_level}\n"
    )
    url = f"sqlite:///{tmp_path / 's.db'}"
    code, _, err = run_cli(
        capsys, "schedules", "add", "s", f"{script}:main", "--every", "60",
        "--import", str(script), "--store", url,
    )  # fmt: skip
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "ran its top-level code" in err
    assert 'if __name__ == "__main__":' in err
    assert "make sure it is importable" not in err


# -- a fake model whose run spans processes --------------------------------------------------

_SUPPORT_APP = '''
from pathlib import Path

from agency_runtime import agency
from agency_runtime.testing import FakeModel, FakeRequest, FakeToolCall

HERE = Path(__file__).parent


@agency.tool(needs_approval=True)
def refund(order: int) -> str:
    """Refund an order."""
    with (HERE / "refunds.log").open("a") as log:
        log.write(f"{order}\\n")
    return f"refunded {order}"


def support(request: FakeRequest) -> str | list[FakeToolCall]:
    if any(m["role"] == "tool" for m in request.messages):  # the tool answered already
        return "Refunded order 7."
    return [FakeToolCall("refund", {"order": 7})]


FakeModel("fc-support", function=support).register()  # at import, in every process


@agency.entry
async def ticket(text: str) -> str:
    return await agency.llm(text, tools=[refund], model="fake/fc-support")


if __name__ == "__main__":
    print(agency.run_sync(ticket, "refund order 7", run_id="t-7").status)
'''


@pytest.mark.slow
def test_a_function_fake_model_answers_alike_in_every_process(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    (tmp_path / "support_app.py").write_text(_SUPPORT_APP)
    env = _child_env(AGENCY_STORE=f"sqlite:///{tmp_path / 'support.db'}")
    started = _python(
        fork_server, "import runpy; runpy.run_path('support_app.py', run_name='__main__')",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert started.stdout.split() == ["paused"]  # the refund needs an approval
    done = _agency(
        fork_server, "runs", "respond", "t-7", "--approve", "--import", "support_app.py",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Refunded order 7." in done.stdout
    assert (tmp_path / "refunds.log").read_text() == "7\n"  # the tool ran once


# -- the README documents the pytest fixtures -------------------------------------------------


def test_the_readme_documents_every_pytest_fixture_and_what_it_gives() -> None:
    text = README.read_text()
    section = text[text.index("### Testing without a network") :]
    section = section[: section.index("\n### ", 5)]
    gives = {
        "agency_store": "MemoryStore",
        "agency_frame": "Frame",
        "agency_fake_model": "a factory",
        "agency_clock": "FakeClock",
    }
    assert set(gives) == set(pytest_plugin.__all__)
    for name, what in gives.items():
        assert re.search(rf"^\* `{name}` → `?{what}", section, re.M), name
    factory = inspect.getsource(pytest_plugin.agency_fake_model)
    assert 'def make(name: str = "scripted", **options: Any)' in factory
    assert '`agency_fake_model(name="scripted", **options) ->' in section
    assert "`replies=` script belongs to the process" in section
    assert "function=" in textwrap.dedent(section)
