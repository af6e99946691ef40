"""Checkpoints and restore.

A checkpoint records a run's journal position with its threads, globals, scope locals and
spend. Its id is derived from where it was taken (scope address and ordinal), so the same
call re-run after a resume or a restore has the same id, and the checkpoint recorded first
is kept. ``restore`` raises :class:`RestoreSignal`; the run boundary rewinds the journal to
the checkpoint's position (later steps, answers and checkpoints are deleted), applies the
``args``/``globals`` overrides and runs the entry again, replaying the steps before it.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from ._core._frame import current_frame, position_of
from ._durable._journal import journal_of
from ._errors import CheckpointError, InvalidArgumentError, RestoreSignal
from ._types import Checkpoint

__all__ = ["MAX_RESTORES", "create_checkpoint", "get_checkpoint", "restore"]

MAX_RESTORES = 100
"""More restores than this, of one checkpoint or of a whole run, is taken for a loop."""


async def create_checkpoint(label: str | None = None, *, pinned: bool = False) -> str:
    """Record a checkpoint here and return its id."""
    frame = current_frame("checkpoint()")
    journal = journal_of(frame.ctx)
    position = position_of(frame)
    token = journal.next_token(position.address, "checkpoint")
    checkpoint_id = f"cp:{position.address or '/'}#{token}"
    if checkpoint_id in journal.checkpoints:
        return checkpoint_id  # a replay passes the same checkpoint: keep the recorded one
    try:
        globals_copy = from_json(to_json(frame.globals))
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"cannot checkpoint run {journal.run_id!r}: its globals are not JSON data ({exc})"
        ) from exc
    scope = position.scope
    module_id, scope_name, step_path = frame.callsite or ("", "", "")
    checkpoint = Checkpoint(
        checkpoint_id=checkpoint_id,
        run_id=journal.run_id,
        seq=journal.next_seq(),
        label=label,
        module_id=module_id,
        scope_name=scope_name,
        step_path=step_path,
        threads=frame.threads.to_json(),
        globals=globals_copy,
        locals=dict(scope.locals) if scope is not None else {},
        cost=frame.ctx.cost,
        tokens=frame.ctx.tokens,
        pinned=pinned,
        created_at=frame.ctx.clock.time(),
    )
    await journal.save_checkpoint(checkpoint)
    return checkpoint_id


def get_checkpoint(checkpoint_id: str) -> Checkpoint:
    """The checkpoint with this id in the current run; raises :class:`CheckpointError`."""
    journal = journal_of(current_frame("get_checkpoint()").ctx)
    checkpoint = journal.checkpoints.get(checkpoint_id)
    if checkpoint is None:
        raise CheckpointError(f"Checkpoint {checkpoint_id} does not exist or has been deleted")
    return checkpoint


async def restore(
    checkpoint: str | Checkpoint,
    *,
    args: dict[str, Any] | list[Any] | tuple[Any, ...] | None = None,
    globals: dict[str, Any] | None = None,
    max_restores: int | None = None,
) -> None:
    """Rewind the run to ``checkpoint`` and run the entry again from there.

    ``args``: a dict overrides keyword arguments, a list or tuple replaces the positional
    ones. ``globals``: values for the default module's globals (``agency.global_(name)``).
    When ``max_restores`` restores of this checkpoint already happened, return silently.
    """
    frame = current_frame("restore()")
    journal = journal_of(frame.ctx)
    if isinstance(checkpoint, str):
        target = get_checkpoint(checkpoint)
    elif isinstance(checkpoint, Checkpoint):
        target = checkpoint
    else:
        raise InvalidArgumentError(
            f"restore needs a checkpoint id or a Checkpoint, got {type(checkpoint).__name__}"
        )
    if args is not None and not isinstance(args, dict | list | tuple):
        raise InvalidArgumentError(
            f"restore(args=...) takes a dict (keyword arguments) or a list (positional "
            f"arguments), got {type(args).__name__}"
        )
    if globals is not None and not isinstance(globals, dict):
        raise InvalidArgumentError(
            f"restore(globals=...) takes a dict, got {type(globals).__name__}"
        )
    if max_restores is not None and max_restores < 0:
        raise InvalidArgumentError(f"max_restores must be 0 or more, got {max_restores}")
    key = target.checkpoint_id
    if max_restores is not None and journal.restores[key] >= max_restores:
        return
    journal.restores[key] += 1
    if journal.restores[key] > MAX_RESTORES:
        raise CheckpointError(
            f"Checkpoint {key} has been restored {journal.restores[key]} times. "
            "Possible infinite loop."
        )
    if sum(journal.restores.values()) > MAX_RESTORES:
        raise CheckpointError(
            f"Exceeded maximum number of restores ({MAX_RESTORES}) in run {journal.run_id!r}. "
            "Possible infinite loop."
        )
    raise RestoreSignal(target, args, globals)
