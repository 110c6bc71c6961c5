"""A user's environment class behind one protocol: `reset(task)` then `step(action)` until done.

A class is loaded by `module.path:Class` and instantiated once per episode. Its methods may be sync (run in
a thread, so that the replica's other episodes go on) or async. What they return is read leniently, so that
common shapes work as they are:

- `reset(task)` (or `reset(task, seed=...)` when it takes a seed) returns the first observation, or a
  gymnasium-style `(observation, info)`;
- `step(action)` gets the turn's text (and `token_ids=`, the turn's ids exactly as sampled, when it takes them);
- `step(action)` returns `(observation, reward, done)`, `(observation, reward, done, info)` or gymnasium's
  `(observation, reward, terminated, truncated, info)`; `info` may carry `tool` (the tool the turn called),
  `final_reward` and `metrics` (a dict of numbers);
- an observation is text, one chat message `{role, content}`, or a list of them.

Raising `InvalidAction` ends the episode as an invalid action; any other exception as an environment failure.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rljob.v1 import environment_service_pb2 as pb
from rljob_workers.common.daemon_pool import DaemonThreadPool
from rljob_workers.common.field_values import from_struct


class EnvironmentConfigError(ValueError):
    """An environment class that cannot be used; the message names the class."""


class InvalidAction(Exception):
    """Raised by an environment's `step` for an action it cannot go on from."""


class MalformedAnswer(ValueError):
    """What an environment returned cannot be read (the message says what)."""


def load_class(ref: str) -> type:
    """Import ``module.path:Class``; errors name the path."""
    module_path, sep, attr = ref.partition(":")
    if not sep or not module_path or not attr:
        raise EnvironmentConfigError(f"{ref!r} is not of the form module.path:Class")
    try:
        module = importlib.import_module(module_path)
    except Exception as exc:  # any import-time failure of user code is a config error
        detail = f"{type(exc).__name__}: {exc}"
        raise EnvironmentConfigError(f"cannot import module {module_path!r} of {ref!r}: {detail}") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise EnvironmentConfigError(f"module {module_path!r} has no class {attr!r} ({ref!r})")
    for method in ("reset", "step"):
        if not callable(getattr(cls, method, None)):
            raise EnvironmentConfigError(f"{ref!r} has no {method}() method")
    return cls


def check_args(cls: type, ref: str, args: Mapping[str, Any]) -> None:
    """spec.environment.args fit the class's constructor (else one line naming the field and the class)."""
    try:
        inspect.signature(cls).bind(**args)
    except TypeError as exc:
        raise EnvironmentConfigError(f"spec.environment.args do not fit {ref!r}: {exc}") from None
    except ValueError:  # a constructor without a signature (a builtin's): let the first episode say
        pass


def _tool(entry: Mapping[str, Any]) -> pb.Tool:
    function = entry.get("function", entry)  # OpenAI's {"type": "function", "function": {...}} or the inner part
    return pb.Tool(
        name=str(function["name"]),
        description=str(function.get("description", "")),
        parameters_json=json.dumps(function.get("parameters", {"type": "object", "properties": {}})),
    )


def describe(cls: type, ref: str) -> pb.EnvironmentServiceInfoResponse:
    """The Info of an environment class, from its optional attributes `name`, `version`, `tools`, `max_turns`
    and `stop`."""
    try:
        tools = [_tool(entry) for entry in getattr(cls, "tools", ()) or ()]
    except (KeyError, TypeError, AttributeError) as exc:
        shape = "a list of {name, description, parameters}"
        raise EnvironmentConfigError(f"{ref!r}: tools must be {shape}: {exc}") from exc
    return pb.EnvironmentServiceInfoResponse(
        name=str(getattr(cls, "name", cls.__name__)),
        version=str(getattr(cls, "version", "")),
        tools=tools,
        max_turns=int(getattr(cls, "max_turns", 0) or 0),
        stop=[str(s) for s in getattr(cls, "stop", ()) or ()],
    )


def observation(value: Any) -> pb.Observation:
    """Text, one {role, content} message or a list of them, as an Observation."""
    if value is None:
        return pb.Observation()
    if isinstance(value, str):
        return pb.Observation(text=value)
    messages = [value] if isinstance(value, Mapping) else value
    if isinstance(messages, list | tuple) and all(isinstance(m, Mapping) for m in messages):
        try:
            return pb.Observation(
                messages=[pb.EnvironmentMessage(role=str(m["role"]), content=str(m["content"])) for m in messages]
            )
        except KeyError as exc:
            raise MalformedAnswer(f"an observation message has no {exc.args[0]!r}") from None
    raise MalformedAnswer(f"an observation is text or {{role, content}} messages, not {type(value).__name__}")


def _number(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise MalformedAnswer(f"{what} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise MalformedAnswer(f"{what} is {number}")
    return number


def step_response(result: Any) -> pb.EpisodeResponse:
    """What `step` returned, as an EpisodeResponse."""
    info: Mapping[str, Any] = {}
    if isinstance(result, tuple) and len(result) == 5:  # gymnasium: terminated, truncated
        obs, reward, terminated, truncated, info = result
        done = bool(terminated) or bool(truncated)
    elif isinstance(result, tuple) and len(result) in (3, 4):
        obs, reward, done = result[:3]
        info = result[3] if len(result) == 4 else {}
        done = bool(done)
    else:
        raise MalformedAnswer(f"step() returned {type(result).__name__}, not (observation, reward, done[, info])")
    info = info or {}
    if not isinstance(info, Mapping):
        raise MalformedAnswer(f"step()'s info is a {type(info).__name__}, not a dict")
    metrics = {str(k): _number(v, f"metric {k!r}") for k, v in dict(info.get("metrics", {})).items()}
    return pb.EpisodeResponse(
        observation=pb.Observation() if done and obs is None else observation(obs),
        reward=_number(reward, "the turn's reward"),
        done=done,
        final_reward=_number(info.get("final_reward", 0.0), "the final reward"),
        metrics=metrics,
        tool=str(info.get("tool", "") or ""),
    )


def _takes(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# The environment's synchronous methods run here: a step that never returns (its deadline answers for it) must
# not hold the replica's process at exit (see common.daemon_pool).
THREADS = DaemonThreadPool(64, thread_name_prefix="environment")


async def _in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(THREADS, functools.partial(fn, *args, **kwargs))


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await _in_thread(fn, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


@dataclass
class Episode:
    """One episode of an environment class: its instance, driven by the server's stream."""

    cls: type
    args: Mapping[str, Any] = field(default_factory=dict)  # spec.environment.args
    turns: int = 0
    instance: Any = field(default=None, init=False)

    async def reset(self, start: pb.EpisodeStart) -> pb.EpisodeResponse:
        self.instance = await _in_thread(self.cls, **self.args)
        task = from_struct(start.task) if start.task else {}
        reset = self.instance.reset
        result = await (_call(reset, task, seed=start.seed) if _takes(reset, "seed") else _call(reset, task))
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping):
            result = result[0]  # gymnasium: (observation, info)
        return pb.EpisodeResponse(observation=observation(result))

    async def step(self, action: pb.Action) -> pb.EpisodeResponse:
        self.turns += 1
        step = self.instance.step
        if _takes(step, "token_ids"):
            return step_response(await _call(step, action.text, token_ids=list(action.token_ids)))
        return step_response(await _call(step, action.text))

    async def close(self) -> None:
        close = getattr(self.instance, "close", None)
        if callable(close):
            await _call(close)
