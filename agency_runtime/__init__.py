"""agency_runtime: durable, budgeted, multi-turn LLM agents.

The public surface is the :data:`agency` namespace plus the data shapes and exceptions
re-exported here. Importing this package is cheap: litellm is imported lazily, on the first
LLM call.
"""

from ._context import AbortSignal, BranchState, RuntimeContext
from ._errors import (
    AgencyCancelledError,
    AgencyError,
    CheckpointError,
    EntryImportError,
    GuardApproveError,
    GuardExceededError,
    HandlerRecursionError,
    InvalidArgumentError,
    LockReentryError,
    LockTimeoutError,
    NondeterminismError,
    OutsideFrameError,
    RestoreSignal,
    ResultSerializationError,
    RunConflictError,
    RunFailedError,
    RunNotFoundError,
    RunPaused,
    RunPausedError,
    StepResultError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    StructuredOutputError,
)
from ._facade import Agency, agency
from ._frame import CallsiteLocation, Frame
from ._results import ErrorInfo, Interrupt, RunResult, RunStatus
from ._store import DEFAULT_STORE_URL, MemoryStore, RunRecord, SqliteStore, Store, open_store
from ._threads import (
    Message,
    MessageThread,
    QueuedMessage,
    ThreadInfo,
    ThreadStore,
    ThreadStoreData,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_STORE_URL",
    "AbortSignal",
    "Agency",
    "AgencyCancelledError",
    "AgencyError",
    "BranchState",
    "CallsiteLocation",
    "CheckpointError",
    "EntryImportError",
    "ErrorInfo",
    "Frame",
    "GuardApproveError",
    "GuardExceededError",
    "HandlerRecursionError",
    "Interrupt",
    "InvalidArgumentError",
    "LockReentryError",
    "LockTimeoutError",
    "MemoryStore",
    "Message",
    "MessageThread",
    "NondeterminismError",
    "OutsideFrameError",
    "QueuedMessage",
    "RestoreSignal",
    "ResultSerializationError",
    "RunConflictError",
    "RunFailedError",
    "RunNotFoundError",
    "RunPaused",
    "RunPausedError",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "RuntimeContext",
    "SqliteStore",
    "StepResultError",
    "Store",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "StructuredOutputError",
    "ThreadInfo",
    "ThreadStore",
    "ThreadStoreData",
    "__version__",
    "agency",
    "open_store",
]
