"""Store operations as programs: generators of statements, run by a dialect's executor.

Every store operation is written once, as a *program*: a generator that yields its
statements (:class:`Sql`: the SQL, written with psycopg's ``%(name)s`` placeholders, and its
parameters) and is sent back each one's rows (:class:`Result`). It returns the operation's
value. An executor runs a program on one connection: the SQLite store's inline, under its lock;
the PostgreSQL store's on a worker thread or on psycopg's asyncio API. What a program says is
the same on every backend; only the executor and the dialect's fragments differ.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, NamedTuple, TypeAlias, TypeVar, cast

__all__ = ["Op", "Result", "Sql", "changed_one", "drive"]

T = TypeVar("T")


class Sql(NamedTuple):
    """One statement of a program: its SQL (``%(name)s`` placeholders) and parameters."""

    query: str
    params: Mapping[str, Any] | None = None


class Result(NamedTuple):
    """What a statement gave back: its rows (none for one without a result) and rowcount."""

    rows: list[tuple[Any, ...]]
    rowcount: int

    def one(self) -> tuple[Any, ...] | None:
        """The first row, ``None`` when there is none."""
        return self.rows[0] if self.rows else None


Op: TypeAlias = Generator[Sql, Result, T]
"""A program: the statements of one store operation, yielded one at a time, each sent back
its :class:`Result`; it returns the operation's value."""


def drive(program: Op[T], execute: Callable[[Sql], Result]) -> T:
    """Run ``program``, each statement by ``execute``; the program's value."""
    try:
        sql = next(program)
        while True:
            sql = program.send(execute(sql))
    except StopIteration as done:
        return cast(T, done.value)


def changed_one(query: str, params: Mapping[str, Any]) -> Op[bool]:
    """A one-statement program: whether ``query`` changed exactly one row."""
    return (yield Sql(query, params)).rowcount == 1
