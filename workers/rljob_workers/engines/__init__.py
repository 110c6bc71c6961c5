"""Inference engines behind one `Engine` protocol (`base`), looked up by name in a registry.

The registry maps `engine: hf|vllm|sglang` to a loader that imports its module only when a job
asks for it, so the base never imports an engine and importing this package never imports
vllm or sglang. Both the rollout server and the genrm judge make their engines here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rljob_api.workercfg import RolloutWorkerConfig
    from rljob_workers.engines.base import Engine

# engine name -> "module:factory"; the factory takes a RolloutWorkerConfig and returns an Engine.
_REGISTRY: dict[str, str] = {
    "hf": "rljob_workers.engines.hf:HFEngine.from_config",
    "vllm": "rljob_workers.engines.vllm:VLLMEngine",
    "sglang": "rljob_workers.engines.sglang:SGLangEngine",
}


def register(name: str, factory: str) -> None:
    """Make `engine: name` load `factory` ("module:attr[.attr]"), imported at first use."""
    _REGISTRY[name] = factory


def engine_names() -> list[str]:
    return sorted(_REGISTRY)


def loader(name: str) -> Callable[[RolloutWorkerConfig], Engine]:
    """The factory of engine `name`, importing its module now (ImportError names a missing extra)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown engine {name!r}; expected {', '.join(engine_names())}")
    module_name, _, attr = _REGISTRY[name].partition(":")
    target: object = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target  # type: ignore[return-value]


def make_engine(config: RolloutWorkerConfig) -> Engine:
    """The engine `config.engine` names, loaded from `config.model_path` (blocking: run it off the event loop)."""
    return loader(config.engine)(config)
