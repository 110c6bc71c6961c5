"""The `rljob` command line. Heavy imports (torch, ray) happen inside the subcommands that need them."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from rljob_api import RLJobInvalid
from rljob_workers.common.grpc_env import use_grpc_process_env

REPO_ROOT = Path(__file__).resolve().parents[3]


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate RLJob files; print every broken rule with its field (--deep: and the set-up checks)."""
    from rljob_api import resolve_algorithm
    from rljob_api.spec import clear_text_tokens
    from rljob_workers.driver.errors import SetupError
    from rljob_workers.driver.run.code_path import put_code_on_path
    from rljob_workers.driver.run.gpu_fit import check_colocate_fits
    from rljob_workers.driver.run.plan import load_job_file, plan_job
    from rljob_workers.driver.run.preflight import prepare, rule_conventions

    failed = 0
    for path in args.files:
        try:
            job = load_job_file(path)
            fits = True
            if args.deep:  # its functions and classes import as `rljob run` would import them
                try:
                    put_code_on_path(path, job.spec.code)
                except NotADirectoryError as exc:
                    raise SetupError(str(exc)) from None
                prepare(plan_job(job, job_file=path, rollout_python=args.rollout_python))
                fits = check_colocate_fits(job, gpu_bytes=args.gpu_memory)
        except (RLJobInvalid, SetupError) as exc:
            print(exc, file=sys.stderr)
            failed += 1
        else:
            checked = "; its model, data, rewards and engines check out" if args.deep else ""
            print(f"{path}: valid RLJob {job.metadata.name!r}{checked}")
            for warning in clear_text_tokens(job):
                print(f"{path}: {warning}", file=sys.stderr)
            if not fits:
                print("  spec.colocate: its memory was not checked: no GPU here (--gpu-memory SIZE checks it)")
            for line in rule_conventions(job) if args.deep else ():
                print(f"  {line}")
            # What each preset-decided setting resolves to: the algorithm as the workers will run it.
            print("  " + resolve_algorithm(job.spec.algorithm, job.spec.rollout.sampling.max_new_tokens).summary())
    return 1 if failed else 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Regenerate the CRD, its chart copy and the field reference from the schema."""
    from rljob_api.generate import write_generated

    for path in write_generated(args.root):
        print(path.relative_to(args.root))
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    """Make the tiny local model and dataset of a built-in task (no download)."""
    from rljob_workers.models.tiny import make_tiny_model
    from rljob_workers.tasks.arithmetic import chat_row, held_out_problems, make_problems, write_jsonl

    out = make_tiny_model(args.out, task=args.task, seed=args.seed)
    print(f"model ready at {out}")
    if args.task == "calculator":
        _write_calculator_data(args)
        return 0
    # Prompts drawn apart from the model's warm-up data (its own seed); the chat task's as messages.
    problems = make_problems(args.prompts, seed=10_000 + args.seed)
    rows = (lambda ps: list(map(chat_row, ps))) if args.task == "arithmetic-chat" else list
    if args.data is not None:
        path = write_jsonl(args.data, rows(problems))
        print(f"{args.prompts} prompts at {path}")
    if args.eval_data is not None:  # none of them among the training prompts, in an order of its own seed
        held_out = held_out_problems(args.eval_prompts, seed=20_000 + args.seed, train=problems)
        print(f"{args.eval_prompts} held-out eval prompts at {write_jsonl(args.eval_data, rows(held_out))}")
    return 0


def _write_calculator_data(args: argparse.Namespace) -> None:
    from rljob_workers.tasks import calculator
    from rljob_workers.tasks.arithmetic import write_jsonl

    problems = calculator.make_problems(args.prompts, seed=10_000 + args.seed)
    if args.data is not None:
        print(f"{args.prompts} prompts at {write_jsonl(args.data, problems)}")
    if args.eval_data is not None:  # none of them among the training prompts
        seen = {p["prompt"] for p in problems}
        drawn = calculator.make_problems(args.eval_prompts + len(seen), seed=20_000 + args.seed)
        rows = [p for p in drawn if p["prompt"] not in seen][: args.eval_prompts]
        print(f"{args.eval_prompts} held-out eval prompts at {write_jsonl(args.eval_data, rows)}")


def cmd_run(args: argparse.Namespace) -> int:
    """Run an RLJob on this machine: all pools local, on Ray."""
    from rljob_workers.driver.errors import SetupError
    from rljob_workers.driver.run.code_path import code_message, put_code_on_path
    from rljob_workers.driver.run.command import run_command
    from rljob_workers.driver.run.plan import load_job_file, plan_job

    try:
        job = load_job_file(args.file)
        # In a driver pod the job file is the operator's: the user's code is on the pod's PYTHONPATH (spec.code)
        if not args.cluster:
            folders = put_code_on_path(args.file, job.spec.code)
            print(code_message(folders, job.spec.code), flush=True)
        plan = plan_job(
            job,
            job_file=args.file,
            output=args.output,
            steps=args.steps,
            resume=args.resume,
            cluster=args.cluster,
            display=not args.no_display,
            metrics_port=args.metrics_port,
            stop_timeout=args.stop_timeout,
            rollout_python=args.rollout_python,
        )
    except (RLJobInvalid, SetupError, NotADirectoryError) as exc:
        print(exc, file=sys.stderr)
        return 2
    return run_command(plan)


def cmd_status(args: argparse.Namespace) -> int:
    """Print the status of a running controller (its ControlService)."""
    from rljob_workers.driver.commands.status import print_status

    return print_status(args.address, token_file=args.token_file, secret=args.secret, namespace=args.namespace)


def cmd_export(args: argparse.Namespace) -> int:
    """Export a checkpoint's policy as a Hugging Face model folder (safetensors, tokenizer, chat template)."""
    from rljob_workers.driver.commands.export import run_export

    return run_export(args.checkpoint, args.out, args.dtype, args.tokenizer)


def gpu_memory(text: str) -> int:
    """--gpu-memory's bytes; argparse names the option and the text it refuses."""
    from rljob_api.colocate_fit import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_rollout_python(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rollout-python",
        default=os.environ.get("RLJOB_ROLLOUT_PYTHON") or None,
        metavar="PYTHON",
        help="interpreter of the rollout replicas: an engine's own runtime (runtimes/vllm.sh prints vLLM's); "
        "default $RLJOB_ROLLOUT_PYTHON, else this one",
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """`rljob run`'s arguments."""
    parser.add_argument("file", type=Path, help="RLJob YAML file")
    add_rollout_python(parser)
    parser.add_argument("--output", type=Path, default=None, help="run directory (default rljob-runs/<name>)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--steps", type=int, default=None, help="override algorithm.totalSteps")
    parser.add_argument("--no-display", action="store_true", help="plain log lines instead of the live display")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 picks a free one)")
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=60.0,
        help="seconds a SIGINT/SIGTERM stop may take to finish the step and write its checkpoint before the run "
        "stops at once (a second signal stops at once too); the run then exits with 128 + the signal's number",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="drive an existing Ray cluster (in a KubeRay driver pod): connect with address auto, serve the "
        "ControlService and metrics on all interfaces at the workers' fixed ports (control 50051, metrics 9400)",
    )


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """`rljob export`'s arguments."""
    parser.add_argument(
        "checkpoint", type=Path, help="a checkpoint's step-NNNNNN folder, or the checkpoint folder (its latest step)"
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (new or empty)")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="the weights' dtype (default: as the checkpoint stores them, float32)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="where the tokenizer is if the checkpoint lacks it (the job's model folder)",
    )


def add_validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, help="RLJob YAML files")
    p.add_argument(
        "--deep",
        action="store_true",
        help="also run rljob run's set-up checks: model folder, data rows, reward imports and signatures, engines",
    )
    p.add_argument(
        "--gpu-memory",
        type=gpu_memory,
        default=None,
        metavar="SIZE",
        help="with --deep, check a colocated job (spec.colocate) against GPUs of SIZE (e.g. 24GiB), not the ones here",
    )
    add_rollout_python(p)


def add_make_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task",
        default="arithmetic",
        help="built-in task: arithmetic, arithmetic-chat (a chat template; --data writes messages rows), or "
        "calculator (a tool to call: examples/calculator.yaml)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, default=None, help="also write the task's prompts (JSON lines) here")
    p.add_argument("--prompts", type=int, default=4096, help="number of prompts with --data")
    p.add_argument(
        "--eval-data", type=Path, default=None, help="also write a held-out eval split (no prompt of --data's) here"
    )
    p.add_argument("--eval-prompts", type=int, default=100, help="number of prompts with --eval-data")


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("address", help="host:port of the controller's ControlService")
    p.add_argument("--token-file", type=Path, default=None, help="the job's token (rljob run writes <output>/token)")
    p.add_argument("--secret", default=None, help="read the token from this Secret (<job>-token) with the kubeconfig")
    p.add_argument("--namespace", default="default", help="namespace of --secret")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rljob", description="LLM reinforcement learning, one RLJob at a time.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {}

    def add(name: str, fn: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        commands[name] = fn
        p = sub.add_parser(name, help=(fn.__doc__ or "").strip().splitlines()[0])
        p.set_defaults(fn=fn)
        return p

    add_validate_arguments(add("validate", cmd_validate))
    add("generate", cmd_generate).add_argument("--root", type=Path, default=REPO_ROOT, help="repository root")
    add_make_model_arguments(add("make-model", cmd_make_model))
    add_run_arguments(add("run", cmd_run))
    add_export_arguments(add("export", cmd_export))
    add_status_arguments(add("status", cmd_status))
    return parser


def main(argv: list[str] | None = None) -> int:
    use_grpc_process_env()  # before grpc's first import, which no import above makes
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


def command() -> NoReturn:
    """The `rljob` command: `main`, then out without the interpreter's teardown, whose collections walk
    every object torch, transformers and Ray made, seconds of CPU to free memory the OS takes back
    anyway. Everything a command writes is closed by then; only the streams
    and log handlers are flushed here."""
    rc = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    command()
