"""agency_runtime: durable, budgeted, multi-turn LLM agents.

The public surface is the :data:`agency` namespace plus the data shapes, protocols and
exceptions re-exported here — exactly the names the README lists under *Public names* (a
test holds the two equal). Everything else is private (modules with a leading underscore).
Importing this package is cheap: litellm is imported lazily, on the first call that needs it,
and so are memory and the store backends, on first use (:data:`_LAZY`); no pydantic schema
is built until a model is first used, and asyncio is not imported (trio programs need none).
"""

from typing import TYPE_CHECKING

from ._boundary._worker import Worker
from ._clock import Clock
from ._core._cancel import AbortSignal
from ._core._context import RuntimeContext
from ._core._frame import CallsiteLocation
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
    ChildRunRejectedError,
    EntryImportError,
    EntryNotAllowedError,
    EntryResultError,
    EventLoopRunningError,
    EventTimeoutError,
    GuardApproveError,
    GuardExceededError,
    HandlerRecursionError,
    InterruptAnswerError,
    InvalidArgumentError,
    JournalCorruptError,
    LLMCallError,
    LockReentryError,
    LockTimeoutError,
    NoModelError,
    NondeterminismError,
    NotInRunError,
    OutsideFrameError,
    ProviderError,
    RestoreSignal,
    ResultSerializationError,
    RunConflictError,
    RunFailedError,
    RunFinishedError,
    RunInterruptedError,
    RunNotFoundError,
    RunPaused,
    RunPausedError,
    RunWaitTimeoutError,
    ScheduleNotFoundError,
    StepFailedError,
    StepResultError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    StructuredOutputError,
    ToolRoundsExceededError,
)
from ._facade import agency
from ._guards import CostGuard, TimeGuard
from ._interrupts import Handler, HandlerDecision, approve, pass_, propagate, reject
from ._lazy import lazy_names
from ._llm._mcp import McpServer
from ._llm._model import Model
from ._llm._registry import register_provider, unregister_provider
from ._llm._stream import LLMStream
from ._llm._tools import Tool
from ._locks import HeldLock
from ._policies import Retry
from ._scope import ResumableScope, ResumableScopeOpts
from ._store import (
    DEFAULT_STORE_URL,
    DocumentStore,
    EventLog,
    LockTable,
    MemoryIndex,
    RunLog,
    RunQueue,
    ScheduleTable,
    Store,
    open_store,
)
from ._types import (
    Checkpoint,
    DeferredModel,
    ErrorInfo,
    Interrupt,
    InterruptResponse,
    JournalEntry,
    RunEvent,
    RunRecord,
    RunResult,
    RunStatus,
    Schedule,
)

if TYPE_CHECKING:
    from ._llm._provider import (
        ChatProvider,
        ChatRequest,
        ChatResponse,
        EmbedRequest,
        EmbedResponse,
        StreamEnd,
        TextDelta,
        ToolCall,
        ToolSpec,
        Usage,
    )
    from ._memory import ConversationMemory, MemoryConfig, MemoryItem, SaveReceipt
    from ._store import MemoryStore, PostgresStore, SqliteStore

_LAZY = {
    **dict.fromkeys(
        (
            "ChatProvider",
            "ChatRequest",
            "ChatResponse",
            "EmbedRequest",
            "EmbedResponse",
            "StreamEnd",
            "TextDelta",
            "ToolCall",
            "ToolSpec",
            "Usage",
        ),
        "._llm._provider",
    ),
    **dict.fromkeys(
        ("ConversationMemory", "MemoryConfig", "MemoryItem", "SaveReceipt"), "._memory"
    ),
    "MemoryStore": "._store._memory",
    "PostgresStore": "._store._postgres",
    "SqliteStore": "._store._sqlite",
}
"""Public names whose modules load on first use, not with ``import agency_runtime``: the
provider seam's shapes (the first LLM call, or a provider, needs them), memory (agent and
conversation memory, which most runs never turn on) and the store backends (a store URL
names one, and most processes only ever use one)."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)


__version__ = "0.1.0"

__all__ = [
    "DEFAULT_STORE_URL",
    "AbortSignal",
    "AgencyCancelledError",
    "AgencyError",
    "CallsiteLocation",
    "ChatProvider",
    "ChatRequest",
    "ChatResponse",
    "Checkpoint",
    "CheckpointError",
    "ChildRunRejectedError",
    "Clock",
    "ConversationMemory",
    "CostGuard",
    "DeferredModel",
    "DocumentStore",
    "EmbedRequest",
    "EmbedResponse",
    "EntryImportError",
    "EntryNotAllowedError",
    "EntryResultError",
    "ErrorInfo",
    "EventLog",
    "EventLoopRunningError",
    "EventTimeoutError",
    "GuardApproveError",
    "GuardExceededError",
    "Handler",
    "HandlerDecision",
    "HandlerRecursionError",
    "HeldLock",
    "Interrupt",
    "InterruptAnswerError",
    "InterruptResponse",
    "InvalidArgumentError",
    "JournalCorruptError",
    "JournalEntry",
    "LLMCallError",
    "LLMStream",
    "LockReentryError",
    "LockTable",
    "LockTimeoutError",
    "McpServer",
    "MemoryConfig",
    "MemoryIndex",
    "MemoryItem",
    "MemoryStore",
    "Message",
    "MessageThread",
    "Model",
    "NoModelError",
    "NondeterminismError",
    "NotInRunError",
    "OutsideFrameError",
    "PostgresStore",
    "ProviderError",
    "QueuedMessage",
    "RestoreSignal",
    "ResultSerializationError",
    "ResumableScope",
    "ResumableScopeOpts",
    "Retry",
    "RunConflictError",
    "RunEvent",
    "RunFailedError",
    "RunFinishedError",
    "RunInterruptedError",
    "RunLog",
    "RunNotFoundError",
    "RunPaused",
    "RunPausedError",
    "RunQueue",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "RunWaitTimeoutError",
    "RuntimeContext",
    "SaveReceipt",
    "Schedule",
    "ScheduleNotFoundError",
    "ScheduleTable",
    "SqliteStore",
    "StepFailedError",
    "StepResultError",
    "Store",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "StreamEnd",
    "StructuredOutputError",
    "TextDelta",
    "ThreadInfo",
    "ThreadStore",
    "ThreadStoreData",
    "TimeGuard",
    "Tool",
    "ToolCall",
    "ToolRoundsExceededError",
    "ToolSpec",
    "Usage",
    "Worker",
    "__version__",
    "agency",
    "approve",
    "open_store",
    "pass_",
    "propagate",
    "register_provider",
    "reject",
    "unregister_provider",
]
