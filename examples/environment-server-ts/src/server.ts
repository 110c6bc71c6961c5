// An rljob.v1.EnvironmentService in TypeScript: the calculator task's environment (the same task as
// rljob_workers.tasks.calculator:Calculator) behind the Episode stream and Info, with grpc.health.v1
// and server reflection. The protos are loaded at start-up from rljob's proto/ folder with
// @grpc/proto-loader: there is no generated code.
//
// The contract (proto/rljob/v1/environment_service.proto) as this server keeps it:
//   - an episode is one Episode stream: `start` first (its task holds the row's `answer`), answered
//     with an empty observation (the prompt alone starts the episode); then one `action` per model turn;
//   - a turn `calc(a+b)` is a tool call: answered with the sum as a `tool` message, not done;
//   - any other turn is the final answer: done, with final_reward 1 when it is the sum, else 0;
//   - a stream that breaks the protocol (an action before its start, a second start, a task without
//     `answer`) gets an answer with an ENVIRONMENT_FAILURE error naming the episode, never a reward of 0;
//   - while draining (SIGTERM), a new episode's start is answered with an ENVIRONMENT_FAILURE error, so the
//     controller restarts that episode elsewhere; episodes in flight play to their end.
//
// Usage: node dist/server.js [--port 50055] [--host 0.0.0.0] [--proto-dir ../../proto]
// Locked by the environment (src/lock.ts): with RLJOB_TOKEN_FILE, calls must carry `authorization: Bearer <token>`
// (the job's remote environment sends it from its tokenSecret or tokenFile); with RLJOB_TLS_CERT and
// RLJOB_TLS_KEY the port speaks TLS (the job's `tls: true`, its `caFile` the CA that signed the certificate). As
// a `kind: image` environment in rljob's pods it follows the image contract: the job's token from the file
// RLJOB_TOKEN_FILE names (the operator sets it; no TLS there), its port from RLJOB_ENVIRONMENT_PORT. With
// RLJOB_STEP_LATENCY_SECONDS set, each tool step waits that long first (a sandbox or a search stands in).

import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { ReflectionService } from "@grpc/reflection";
import { HealthImplementation } from "grpc-health-check";

import { Lock, LockError, lockFromEnv } from "./lock";
import { reflectable } from "./reflection";

const SERVICE = "rljob.v1.EnvironmentService";
const NAME = "calculator";
const VERSION = "0.1.0";
const MAX_TURNS = 4;
const MAX_EPISODES = 256;
const DRAIN_SECONDS = 30;
const CALL = /^\s*calc\((\d+)\+(\d+)\)\s*$/;
const EOS_MARKERS = ["</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>"];
const TOOL = {
  name: "calc",
  description: "Add two numbers: calc(a+b).",
  parameters_json: JSON.stringify({
    type: "object",
    properties: { expression: { type: "string" } },
    required: ["expression"],
  }),
};

type ErrorKind = "ENVIRONMENT_ERROR_KIND_INVALID_ACTION" | "ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE";

interface EpisodeRequest {
  kind?: "start" | "action";
  start?: { episode_id: string; task: Record<string, unknown> | null; seed: string; prompt: string };
  action?: { text: string; token_ids: number[]; turn: number };
}

interface EpisodeResponse {
  observation?: { text?: string; messages?: { role: string; content: string }[] };
  reward?: number;
  done?: boolean;
  final_reward?: number;
  metrics?: Record<string, number>;
  error?: { kind: ErrorKind; message: string };
  tool?: string;
}

const state: { draining: boolean; episodes: number } = { draining: false, episodes: 0 };

// ---- the environment ---------------------------------------------------------------------------

/** One episode of the calculator task: the sum it wants, and the turns so far. */
class Episode {
  turns = 0;

  constructor(
    readonly id: string,
    readonly answer: string,
  ) {}

  step(action: string): EpisodeResponse {
    this.turns += 1;
    const call = CALL.exec(action);
    if (call) {
      const total = Number(call[1]) + Number(call[2]);
      return { observation: { messages: [{ role: "tool", content: String(total) }] }, tool: "calc" };
    }
    const correct = stripCompletion(action) === this.answer;
    return { done: true, final_reward: correct ? 1 : 0, metrics: { turns: this.turns } };
  }
}

/** The turn cut at its first end-of-sequence marker, whitespace stripped. */
function stripCompletion(text: string): string {
  for (const marker of EOS_MARKERS) {
    text = text.split(marker, 1)[0];
  }
  return text.trim();
}

/** Struct values arrive as plain JS values (proto-loader's google.protobuf.Struct is {fields: {...}}). */
function structField(task: Record<string, unknown> | null | undefined, name: string): string | undefined {
  const fields = (task?.fields ?? {}) as Record<string, { kind?: string; [k: string]: unknown }>;
  const value = fields[name];
  if (value === undefined) return undefined;
  const inner = value.kind ? value[value.kind] : undefined;
  return inner === undefined || inner === null ? undefined : String(inner);
}

function failure(message: string): EpisodeResponse {
  return { error: { kind: "ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE", message } };
}

// ---- the service -------------------------------------------------------------------------------

function episode(call: grpc.ServerDuplexStream<EpisodeRequest, EpisodeResponse>): void {
  let current: Episode | undefined;
  let counted = false;
  const release = () => {
    if (counted) state.episodes -= 1;
    counted = false;
  };
  call.on("data", async (request: EpisodeRequest) => {
    if (request.action && STEP_LATENCY_MS > 0) await sleep(STEP_LATENCY_MS); // a step, not a start
    call.write(answer(request));
  });
  call.on("end", () => {
    release();
    call.end();
  });
  call.on("cancelled", release);
  call.on("error", release); // the controller went away: nobody is left to answer

  function answer(request: EpisodeRequest): EpisodeResponse {
    if (request.kind === "start" && request.start) {
      const id = request.start.episode_id || "(no id)";
      if (current) return failure(`episode ${current.id}: a second start (${id}) on its stream`);
      if (state.draining) return failure(`episode ${id}: environment server draining`);
      const sum = structField(request.start.task, "answer");
      if (sum === undefined) return failure(`episode ${id}: its task has no answer field`);
      current = new Episode(id, sum.trim());
      state.episodes += 1;
      counted = true;
      return { observation: { text: "" } };
    }
    if (request.kind === "action" && request.action) {
      if (!current) return failure("an action before the episode's start");
      return current.step(request.action.text ?? "");
    }
    return failure(`episode ${current?.id ?? "(not started)"}: a request with neither start nor action`);
  }
}

function info(_call: grpc.ServerUnaryCall<object, object>, callback: grpc.sendUnaryData<object>): void {
  callback(null, {
    name: NAME,
    version: VERSION,
    tools: [TOOL],
    max_turns: MAX_TURNS,
    stop: [")"], // a tool call's end ends the model's turn
    max_episodes: MAX_EPISODES,
  });
}

// ---- start and drain ---------------------------------------------------------------------------

const STEP_LATENCY_MS = Number(process.env.RLJOB_STEP_LATENCY_SECONDS ?? "0") * 1000;

/** The lock the environment names; a lock that cannot be used ends the process, naming the variable or file. */
function locked(): Lock {
  try {
    return lockFromEnv();
  } catch (err) {
    if (!(err instanceof LockError)) throw err;
    console.error(err.message);
    process.exit(2);
  }
}

function loadProtos(protoDir: string): protoLoader.PackageDefinition {
  return protoLoader.loadSync(["rljob/v1/environment_service.proto"], {
    includeDirs: [protoDir],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
}

function main(): void {
  const defaultProtoDir = process.env.RLJOB_PROTO_DIR ?? path.resolve(__dirname, "../../../proto");
  const { values } = parseArgs({
    options: {
      port: { type: "string", default: process.env.RLJOB_ENVIRONMENT_PORT ?? "50055" },
      host: { type: "string", default: "0.0.0.0" },
      "proto-dir": { type: "string", default: defaultProtoDir },
    },
  });
  const definition = loadProtos(values["proto-dir"]!);
  const proto = grpc.loadPackageDefinition(definition) as unknown as {
    rljob: { v1: { EnvironmentService: grpc.ServiceClientConstructor } };
  };
  const lock = locked();
  const health = new HealthImplementation({ "": "SERVING", [SERVICE]: "SERVING" });
  const server = new grpc.Server({ interceptors: lock.interceptors });
  server.addService(proto.rljob.v1.EnvironmentService.service, { Episode: episode, Info: info });
  health.addToServer(server);
  new ReflectionService(reflectable(definition)).addToServer(server);

  const address = `${values.host}:${values.port}`;
  server.bindAsync(address, lock.credentials, (err, port) => {
    if (err) {
      console.error(`cannot bind ${address}: ${err.message}`);
      process.exit(1);
    }
    console.log(`environment '${NAME}' serving on ${values.host}:${port}\n  ${lock.summary}`);
  });

  const drain = () => {
    // Refuse new episodes, let those in flight finish, then exit; give up after DRAIN_SECONDS.
    state.draining = true;
    health.setStatus("", "NOT_SERVING");
    health.setStatus(SERVICE, "NOT_SERVING");
    setTimeout(() => server.forceShutdown(), DRAIN_SECONDS * 1000).unref();
    server.tryShutdown(() => process.exit(0));
  };
  process.once("SIGTERM", drain);
  process.once("SIGINT", drain);
}

main();
