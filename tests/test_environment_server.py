"""The EnvironmentService served from a Python class (`serve_environment` and the pool's replica): episodes
over a real gRPC stream on loopback, sync, async and gymnasium shapes, every kind of error, Info and
reflection."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rljob.v1 import environment_service_pb2 as pb
from rljob.v1 import environment_service_pb2_grpc as pb_grpc
from rljob_workers.environment.server import start_environment_server

from conftest import REPO


async def _episode(
    ref: str, task: dict, actions: list[str], **kwargs
) -> tuple[list[pb.EpisodeResponse], pb.EnvironmentServiceInfoResponse]:
    running, _ = await start_environment_server(ref, **kwargs)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            info = await stub.Info(pb.EnvironmentServiceInfoRequest())
            call = stub.Episode()
            start = pb.EpisodeStart(episode_id="e0-1/0", seed=7)
            start.task.update(task)
            answers = []
            await call.write(pb.EpisodeRequest(start=start))
            answers.append(await call.read())
            for turn, text in enumerate(actions, start=1):
                await call.write(pb.EpisodeRequest(action=pb.Action(text=text, turn=turn)))
                answer = await call.read()
                answers.append(answer)
                if answer.done or answer.HasField("error"):
                    break
            call.cancel()
            return answers, info
    finally:
        await running.stop(None)


def test_the_calculator_answers_a_tool_call_then_scores_the_answer():
    answers, info = asyncio.run(
        _episode(
            "rljob_workers.tasks.calculator:Calculator",
            {"prompt": "123+456", "answer": "579"},
            ["calc(123+456)", "579"],
        )
    )
    assert info.name == "calculator" and [t.name for t in info.tools] == ["calc"] and list(info.stop) == [")"]
    assert json.loads(info.tools[0].parameters_json)["type"] == "object"
    start, call, answer = answers
    assert start.observation.text == "" and not start.done
    assert [(m.role, m.content) for m in call.observation.messages] == [("tool", "579")] and call.tool == "calc"
    assert answer.done and answer.final_reward == 1.0


def test_a_wrong_answer_scores_0_and_the_seed_reaches_reset():
    answers, _ = asyncio.run(_episode("env_classes:Countdown", {"turns": 2}, ["a", "bbb"]))
    start, first, last = answers
    assert start.observation.text == "seed 7"
    assert (first.observation.text, first.reward, first.done) == (" 1 left ", 0.25, False)
    assert (last.reward, last.done, last.final_reward, dict(last.metrics)) == (0.5, True, 1.0, {"length": 3.0})


def test_an_async_gymnasium_environment_ends_on_truncated():
    answers, _ = asyncio.run(_episode("env_classes:AsyncGym", {}, ["x"]))
    assert answers[0].observation.text == "go"
    assert answers[1].done and answers[1].reward == 1.0


@pytest.mark.parametrize(
    ("action", "kind", "says"),
    [
        ("invalid", pb.ENVIRONMENT_ERROR_KIND_INVALID_ACTION, "cannot go on from that"),
        ("nan", pb.ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE, "the turn's reward is nan"),
        ("shape", pb.ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE, "step() returned int"),
        ("boom", pb.ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE, "RuntimeError: the sandbox died"),
        ("slow", pb.ENVIRONMENT_ERROR_KIND_TIMEOUT, "no answer within 0.5s"),
    ],
)
def test_every_bad_step_is_a_typed_error_of_the_episode(action, kind, says):
    answers, _ = asyncio.run(_episode("env_classes:Broken", {}, [action], step_timeout_seconds=0.5))
    error = answers[-1].error
    assert error.kind == kind and says in error.message and "Broken" in error.message


def test_serve_environment_serves_a_class_in_one_line_with_reflection(tmp_path):
    code = (
        "from rljob_workers.environment import serve_environment; "
        "serve_environment('rljob_workers.tasks.calculator:Calculator', port=0, host='127.0.0.1')"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "serving on 127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1])

        async def listed() -> list[str]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = reflection_pb2_grpc.ServerReflectionStub(channel)
                call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
                return [s.name async for r in call for s in r.list_services_response.service]

        assert "rljob.v1.EnvironmentService" in asyncio.run(listed())
    finally:
        server.terminate()
        assert server.wait(10) == 0


def test_a_replica_at_its_episode_limit_takes_the_next_episode_the_moment_the_client_ended_one():
    """The client frees an episode's slot when the episode ends (its last answer read, or its budget spent) and
    cancels the stream; it may start the next at once, before the cancel reaches the replica. That episode waits
    for the slot; it is not refused (RESOURCE_EXHAUSTED) and restarted for nothing (seen on the real node)."""

    async def back_to_back(episodes: int) -> list[str]:
        running, _ = await start_environment_server("rljob_workers.tasks.calculator:Calculator", max_episodes=1)
        refused = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.EnvironmentServiceStub(channel)
                for i in range(episodes):
                    call = stub.Episode()
                    start = pb.EpisodeStart(episode_id=f"e0-{i}/0", seed=i)
                    start.task.update({"answer": "3"})
                    try:
                        await call.write(pb.EpisodeRequest(start=start))
                        await call.read()
                        if i % 2:  # an episode that ends done, then one the client ends (its budget spent)
                            await call.write(pb.EpisodeRequest(action=pb.Action(text="3", turn=1)))
                            assert (await call.read()).done
                    except grpc.aio.AioRpcError as exc:
                        refused.append(f"episode {i}: {exc.code().name} {exc.details()}")
                    call.cancel()
        finally:
            await running.stop(None)
        return refused

    assert asyncio.run(back_to_back(40)) == []
