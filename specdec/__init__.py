"""specdec: speculative decoding with pluggable drafters, tree builders, verifiers and backends.

``import specdec`` loads neither torch nor mlx; backends import their framework when asked for.
"""

from specdec.errors import (
    CacheError,
    CorruptFileError,
    IncompatibleDrafterError,
    InvalidInputError,
    MissingDependencyError,
    ModelLoadError,
    PluginOutputError,
    SpecdecError,
    TargetBusyError,
    TrainingInterrupted,
    TrainingOutputError,
    UnknownPluginError,
)
from specdec.capabilities import DrafterCaps, VerifierCaps
from specdec.serving.engine import Engine, EngineClosedError, QueueFullError, RequestFailedError
from specdec.generation.api import generate, stream
from specdec.generation.components import decode_plan
from specdec.generation.loading import load
from specdec.plugins.hookspecs import hookimpl
from specdec.plugins.registry import PluginRegistry, default_registry
from specdec.decode.requests import Request
from specdec.types import (
    Accepted,
    Draft,
    DraftContext,
    DraftTree,
    GenerationResult,
    GenerationStats,
    PromptOutput,
    SamplingConfig,
    StepResult,
    TargetOutput,
    Verdict,
)

__version__ = "0.1.0"

__all__ = [
    "Accepted",
    "DrafterCaps",
    "Engine",
    "EngineClosedError",
    "QueueFullError",
    "RequestFailedError",
    "PromptOutput",
    "Request",
    "VerifierCaps",
    "CacheError",
    "CorruptFileError",
    "ModelLoadError",
    "PluginOutputError",
    "TargetBusyError",
    "TrainingInterrupted",
    "TrainingOutputError",
    "Draft",
    "DraftContext",
    "DraftTree",
    "GenerationResult",
    "GenerationStats",
    "IncompatibleDrafterError",
    "InvalidInputError",
    "MissingDependencyError",
    "PluginRegistry",
    "SamplingConfig",
    "SpecdecError",
    "StepResult",
    "TargetOutput",
    "UnknownPluginError",
    "Verdict",
    "decode_plan",
    "default_registry",
    "generate",
    "hookimpl",
    "load",
    "stream",
]
