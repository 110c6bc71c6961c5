// An rljob.v1.RewardService in TypeScript: an exact-match arithmetic reward behind the Score stream,
// ScoreBatch and Info, with grpc.health.v1 and server reflection. The protos are loaded at start-up
// from rljob's proto/ folder with @grpc/proto-loader: there is no generated code.
//
// The contract (proto/rljob/v1/reward_service.proto) as this server keeps it:
//   - every sample gets exactly one answer with its sample_id, as soon as it is scored;
//   - a sample that cannot be scored (no `answer` field) gets an error of class FUNCTION, never a 0;
//   - an empty sample_id, or one already in flight on the stream, gets an INVALID error on the
//     stream, and fails a whole ScoreBatch call with INVALID_ARGUMENT naming the sample;
//   - a sample it declines unscored is answered, per sample, with a TRANSIENT error whose `refusal`
//     says why: REFUSAL_REASON_RESOURCE_EXHAUSTED past MAX_IN_FLIGHT samples in flight on the stream,
//     REFUSAL_REASON_DRAINING while draining (callers re-send on that field, never on the message);
//   - scores are 0 or 1, inside Info's [min_score, max_score].
//
// Usage: node dist/server.js [--port 50052] [--host 0.0.0.0] [--proto-dir ../../proto]
// Locked by the environment (src/lock.ts): with RLJOB_TOKEN_FILE, calls must carry `authorization: Bearer <token>`
// (the job's remote reward sends it from its tokenSecret or tokenFile); with RLJOB_TLS_CERT and RLJOB_TLS_KEY the
// port speaks TLS (the job's `tls: true`, its `caFile` the CA that signed the certificate).

import * as path from "node:path";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { ReflectionService } from "@grpc/reflection";
import { HealthImplementation } from "grpc-health-check";

import { Lock, LockError, lockFromEnv } from "./lock";

const SERVICE = "rljob.v1.RewardService";
const FUNCTION_NAME = "exact-match";
const VERSION = "0.1.0";
const MAX_IN_FLIGHT = 64;
const MAX_BATCH_SIZE = 256;
const DRAIN_SECONDS = 30;
const EOS_MARKERS = ["</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>"];

type ErrorClass = "ERROR_CLASS_INVALID" | "ERROR_CLASS_FUNCTION" | "ERROR_CLASS_TRANSIENT";
type RefusalReason = "REFUSAL_REASON_DRAINING" | "REFUSAL_REASON_RESOURCE_EXHAUSTED";

/** google.protobuf.Value as proto-loader decodes it (oneofs: true): the set field named in `kind`. */
interface ProtoValue {
  kind?: "nullValue" | "numberValue" | "stringValue" | "boolValue" | "structValue" | "listValue";
  numberValue?: number;
  stringValue?: string;
  boolValue?: boolean;
  structValue?: { fields?: Record<string, ProtoValue> };
  listValue?: { values?: ProtoValue[] };
}

type Json = null | number | string | boolean | Json[] | { [key: string]: Json };

interface RewardSample {
  sample_id: string;
  prompt_id: string;
  prompt: string;
  completion: string;
  fields: Record<string, string>;
  // The same fields with their JSON types (numbers, lists, objects); rljob's driver sends both.
  values?: Record<string, ProtoValue>;
}

interface SampleScore {
  sample_id: string;
  score: number;
  components: Record<string, number>;
  error?: { error_class: ErrorClass; message: string; function: string; refusal?: RefusalReason };
  latency_seconds: number;
}

interface ScoreRequest {
  sample?: RewardSample | null;
}

interface ScoreResponse {
  score: SampleScore;
}

interface ScoreBatchRequest {
  samples: RewardSample[];
}

/** A sample this function cannot score; becomes that sample's error. */
class ScoreFailure extends Error {
  constructor(
    readonly errorClass: ErrorClass,
    message: string,
  ) {
    super(message);
  }
}

const state: { draining: boolean } = { draining: false };

// ---- the reward -------------------------------------------------------------------------------

/** The completion cut at its first end-of-sequence marker, whitespace stripped. */
function stripCompletion(completion: string): string {
  let text = completion;
  for (const marker of EOS_MARKERS) {
    text = text.split(marker, 1)[0];
  }
  return text.trim();
}

/** A google.protobuf.Value as plain JSON. */
function fromValue(value: ProtoValue): Json {
  switch (value.kind) {
    case "numberValue":
      return value.numberValue ?? 0;
    case "stringValue":
      return value.stringValue ?? "";
    case "boolValue":
      return value.boolValue ?? false;
    case "structValue":
      return Object.fromEntries(Object.entries(value.structValue?.fields ?? {}).map(([k, v]) => [k, fromValue(v)]));
    case "listValue":
      return (value.listValue?.values ?? []).map(fromValue);
    default:
      return null;
  }
}

/** The sample's fields with their JSON types where the sender gave them (`values`), else as text (`fields`). */
function typedFields(sample: RewardSample): Record<string, Json> {
  const values = sample.values ?? {};
  if (Object.keys(values).length > 0) {
    return Object.fromEntries(Object.entries(values).map(([k, v]) => [k, fromValue(v)]));
  }
  return { ...(sample.fields ?? {}) };
}

/** 1 when the completion is the `answer` field (text or a number), or one of the `accepted` list's, else 0. */
function exactMatch(sample: RewardSample): number {
  const fields = typedFields(sample);
  const answer = fields.answer;
  if (answer === undefined || answer === null) {
    const names = Object.keys(fields).join(", ") || "none";
    throw new ScoreFailure(
      "ERROR_CLASS_FUNCTION",
      `reward function '${FUNCTION_NAME}': sample '${sample.sample_id}' has no answer field (fields: ${names})`,
    );
  }
  const accepted = Array.isArray(fields.accepted) ? fields.accepted.map((a) => String(a).trim()) : [];
  const completion = stripCompletion(sample.completion ?? "");
  return completion === String(answer).trim() || accepted.includes(completion) ? 1 : 0;
}

async function scoreSample(sample: RewardSample): Promise<SampleScore> {
  const start = process.hrtime.bigint();
  const seconds = () => Number(process.hrtime.bigint() - start) / 1e9;
  try {
    const value = exactMatch(sample);
    const components = { [FUNCTION_NAME]: value };
    return { sample_id: sample.sample_id, score: value, components, latency_seconds: seconds() };
  } catch (err) {
    const message = `reward function '${FUNCTION_NAME}' failed on sample '${sample.sample_id}': ${err}`;
    const failure = err instanceof ScoreFailure ? err : new ScoreFailure("ERROR_CLASS_FUNCTION", message);
    return errorScore(sample.sample_id, failure.errorClass, failure.message, seconds());
  }
}

/** The answer for a sample declined unscored: a TRANSIENT error whose `refusal` says why. */
function refusedScore(sampleId: string, reason: RefusalReason, why: string): SampleScore {
  const score = errorScore(sampleId, "ERROR_CLASS_TRANSIENT", `sample '${sampleId}' refused: ${why}`);
  return { ...score, error: { ...score.error!, refusal: reason } };
}

function errorScore(sampleId: string, errorClass: ErrorClass, message: string, latency = 0): SampleScore {
  return {
    sample_id: sampleId,
    score: 0,
    components: {},
    error: { error_class: errorClass, message, function: FUNCTION_NAME },
    latency_seconds: latency,
  };
}

// ---- the service ------------------------------------------------------------------------------

/** The answer for a sample this stream will not score, or undefined to score it. */
function refusal(sample: RewardSample, inFlight: Set<string>): SampleScore | undefined {
  const id = sample.sample_id ?? "";
  if (!id) return errorScore(id, "ERROR_CLASS_INVALID", "sample has an empty sample_id");
  if (inFlight.has(id)) {
    return errorScore(id, "ERROR_CLASS_INVALID", `sample '${id}' is already in flight on this stream`);
  }
  if (state.draining) return refusedScore(id, "REFUSAL_REASON_DRAINING", "reward server draining");
  if (inFlight.size >= MAX_IN_FLIGHT) {
    const why = `${inFlight.size} samples already in flight (max_in_flight ${MAX_IN_FLIGHT})`;
    return refusedScore(id, "REFUSAL_REASON_RESOURCE_EXHAUSTED", why);
  }
  return undefined;
}

function score(call: grpc.ServerDuplexStream<ScoreRequest, ScoreResponse>): void {
  const inFlight = new Set<string>();
  let readDone = false;
  const endIfDone = () => {
    if (readDone && inFlight.size === 0) call.end();
  };
  call.on("data", (request: ScoreRequest) => {
    const sample = request.sample ?? ({ sample_id: "", fields: {} } as unknown as RewardSample);
    const refused = refusal(sample, inFlight);
    if (refused) {
      call.write({ score: refused });
      return;
    }
    inFlight.add(sample.sample_id);
    void scoreSample(sample).then((result) => {
      inFlight.delete(sample.sample_id);
      if (!call.cancelled) call.write({ score: result });
      endIfDone();
    });
  });
  call.on("end", () => {
    readDone = true;
    endIfDone();
  });
  call.on("error", () => undefined); // the client went away: nobody is left to answer
}

function scoreBatch(
  call: grpc.ServerUnaryCall<ScoreBatchRequest, { scores: SampleScore[] }>,
  callback: grpc.sendUnaryData<{ scores: SampleScore[] }>,
): void {
  const samples = call.request.samples ?? [];
  const fail = (code: grpc.status, details: string) => callback({ code, details });
  if (state.draining) return fail(grpc.status.UNAVAILABLE, "reward server is draining");
  if (samples.length > MAX_BATCH_SIZE) {
    const details = `batch of ${samples.length} samples is over max_batch_size ${MAX_BATCH_SIZE}`;
    return fail(grpc.status.RESOURCE_EXHAUSTED, details);
  }
  const seen = new Set<string>();
  for (const [i, sample] of samples.entries()) {
    if (!sample.sample_id) return fail(grpc.status.INVALID_ARGUMENT, `samples[${i}] has an empty sample_id`);
    if (seen.has(sample.sample_id)) {
      return fail(grpc.status.INVALID_ARGUMENT, `samples[${i}]: duplicate sample_id '${sample.sample_id}'`);
    }
    seen.add(sample.sample_id);
  }
  Promise.all(samples.map(scoreSample)).then(
    (scores) => callback(null, { scores }),
    (err) => fail(grpc.status.INTERNAL, `reward server failed: ${err}`),
  );
}

function info(_call: grpc.ServerUnaryCall<object, object>, callback: grpc.sendUnaryData<object>): void {
  callback(null, {
    name: FUNCTION_NAME,
    version: VERSION,
    max_batch_size: MAX_BATCH_SIZE,
    max_in_flight: MAX_IN_FLIGHT,
    min_score: 0,
    max_score: 1,
    functions: [FUNCTION_NAME],
  });
}

// ---- start and drain --------------------------------------------------------------------------

function loadProtos(protoDir: string): protoLoader.PackageDefinition {
  return protoLoader.loadSync(["rljob/v1/reward_service.proto"], {
    includeDirs: [protoDir],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
}

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

function main(): void {
  const defaultProtoDir = process.env.RLJOB_PROTO_DIR ?? path.resolve(__dirname, "../../../proto");
  const { values } = parseArgs({
    options: {
      port: { type: "string", default: "50052" },
      host: { type: "string", default: "0.0.0.0" },
      "proto-dir": { type: "string", default: defaultProtoDir },
    },
  });
  const definition = loadProtos(values["proto-dir"]!);
  const proto = grpc.loadPackageDefinition(definition) as unknown as {
    rljob: { v1: { RewardService: grpc.ServiceClientConstructor } };
  };
  const lock = locked();
  const health = new HealthImplementation({ "": "SERVING", [SERVICE]: "SERVING" });
  const server = new grpc.Server({ interceptors: lock.interceptors });
  server.addService(proto.rljob.v1.RewardService.service, { Score: score, ScoreBatch: scoreBatch, Info: info });
  health.addToServer(server);
  new ReflectionService(definition).addToServer(server);

  const address = `${values.host}:${values.port}`;
  server.bindAsync(address, lock.credentials, (err, port) => {
    if (err) {
      console.error(`cannot bind ${address}: ${err.message}`);
      process.exit(1);
    }
    console.log(`reward '${FUNCTION_NAME}' serving on ${values.host}:${port}\n  ${lock.summary}`);
  });

  const drain = () => {
    // Refuse new work, let samples in flight finish, then exit; give up after DRAIN_SECONDS.
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
