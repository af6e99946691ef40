"""agency_runtime: durable, budgeted, multi-turn LLM agents.

The public surface is the :data:`agency` namespace plus the data shapes and exceptions
re-exported here. Importing this package is cheap: litellm is imported lazily, on the first
LLM call.
"""

from ._core._cancel import AbortSignal
from ._core._context import BranchState, RuntimeContext
from ._core._frame import CallsiteLocation, Frame
from ._core._threads import (
    Message,
    MessageThread,
    QueuedMessage,
    ThreadInfo,
    ThreadStore,
    ThreadStoreData,
)
from ._errors import (
    AgencyCancelledError,
    AgencyError,
    CheckpointError,
    EntryImportError,
    EntryNotAllowedError,
    GuardApproveError,
    GuardExceededError,
    HandlerRecursionError,
    InterruptAnswerError,
    InvalidArgumentError,
    JournalCorruptError,
    LLMCallError,
    LockReentryError,
    LockTimeoutError,
    NondeterminismError,
    OutsideFrameError,
    RestoreSignal,
    ResultSerializationError,
    RunConflictError,
    RunFailedError,
    RunInterruptedError,
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
from ._guards import CostGuard, TimeGuard
from ._interrupts import Handler, HandlerDecision, approve, pass_, propagate, reject
from ._locks import HeldLock
from ._memory._agent import MemoryConfig
from ._memory._conversation import ConversationMemory, MemoryItem, SaveReceipt
from ._scope import ResumableScope, ResumableScopeOpts
from ._store import DEFAULT_STORE_URL, MemoryStore, RunRecord, SqliteStore, Store, open_store
from ._types import (
    Checkpoint,
    ErrorInfo,
    Interrupt,
    InterruptAnswer,
    InterruptResponse,
    Journal,
    JournalEntry,
    MemoryRecord,
    RunResult,
    RunStatus,
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
    "Checkpoint",
    "CheckpointError",
    "ConversationMemory",
    "CostGuard",
    "EntryImportError",
    "EntryNotAllowedError",
    "ErrorInfo",
    "Frame",
    "GuardApproveError",
    "GuardExceededError",
    "Handler",
    "HandlerDecision",
    "HandlerRecursionError",
    "HeldLock",
    "Interrupt",
    "InterruptAnswer",
    "InterruptAnswerError",
    "InterruptResponse",
    "InvalidArgumentError",
    "Journal",
    "JournalCorruptError",
    "JournalEntry",
    "LLMCallError",
    "LockReentryError",
    "LockTimeoutError",
    "MemoryConfig",
    "MemoryItem",
    "MemoryRecord",
    "MemoryStore",
    "Message",
    "MessageThread",
    "NondeterminismError",
    "OutsideFrameError",
    "QueuedMessage",
    "RestoreSignal",
    "ResultSerializationError",
    "ResumableScope",
    "ResumableScopeOpts",
    "RunConflictError",
    "RunFailedError",
    "RunInterruptedError",
    "RunNotFoundError",
    "RunPaused",
    "RunPausedError",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "RuntimeContext",
    "SaveReceipt",
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
    "TimeGuard",
    "__version__",
    "agency",
    "approve",
    "open_store",
    "pass_",
    "propagate",
    "reject",
]
