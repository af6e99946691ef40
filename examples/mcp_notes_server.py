"""A small MCP server for ``examples/mcp_agent.py``: a notebook kept in a JSON file.

    python3 examples/mcp_notes_server.py       # speaks MCP on stdin/stdout

Written with the official ``mcp`` SDK (``pip install 'agency-runtime[mcp]'``). ``NOTES_FILE``
is where it keeps the notes; every tool call is also appended to ``NOTES_FILE.log``, so the
example can show that each call ran once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

NOTES = Path(os.environ.get("NOTES_FILE", "notes.json"))
server = MCPServer("notes")


def _load() -> dict[str, str]:
    return json.loads(NOTES.read_text()) if NOTES.exists() else {}


def _ran(what: str) -> None:
    with open(f"{NOTES}.log", "a") as log:
        log.write(what + "\n")


@server.tool()
def list_notes() -> list[str]:
    """The titles of every note."""
    _ran("list_notes")
    return sorted(_load())


@server.tool()
def read_note(title: str) -> str:
    """The text of one note."""
    _ran(f"read_note {title}")
    notes = _load()
    if title not in notes:
        raise ToolError(f"there is no note titled {title!r}")
    return notes[title]


@server.tool()
def write_note(title: str, text: str) -> str:
    """Write (or replace) a note."""
    _ran(f"write_note {title}")
    notes = _load()
    notes[title] = text
    NOTES.write_text(json.dumps(notes))
    return f"saved {title!r}"


if __name__ == "__main__":
    server.run("stdio")
