// The lock on a server a job calls (docs/security.md): the job's bearer token and TLS, read from the environment
// variables rljob names for every such server, whatever its language:
//   RLJOB_TOKEN_FILE  the file holding the job's token: every call but a health check must carry
//                     `authorization: Bearer <token>`, or it is refused UNAUTHENTICATED;
//   RLJOB_TLS_CERT    the server's certificate chain (PEM) and
//   RLJOB_TLS_KEY     its private key (PEM): with both, the port speaks TLS only.
// None set, the server is open, and says so. The same file in examples/reward-server-ts and
// examples/environment-server-ts (a test keeps them equal): copy it into a server of your own as it is.

import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";

import * as grpc from "@grpc/grpc-js";

export const TOKEN_FILE_ENV = "RLJOB_TOKEN_FILE";
export const TLS_CERT_ENV = "RLJOB_TLS_CERT";
export const TLS_KEY_ENV = "RLJOB_TLS_KEY";
// Probes (the kubelet's grpc probe, grpcurl health checks) carry no credential.
const OPEN_PREFIX = "/grpc.health.v1.Health/";
// A refused client stream is read (and dropped) for at most this long or this many messages before the refusal.
const REFUSAL_READ_MS = 1000;
const REFUSAL_READ_MESSAGES = 1024;

/** What the server starts with: its port's credentials, the interceptors that check the token, and a line
 * saying what callers need. */
export interface Lock {
  credentials: grpc.ServerCredentials;
  interceptors: grpc.ServerInterceptor[];
  summary: string;
}

/** A lock that cannot be used; the message names the variable or file. */
export class LockError extends Error {}

/** The lock the environment names (see the top of this file). */
export function lockFromEnv(env: NodeJS.ProcessEnv = process.env): Lock {
  const tokenFile = env[TOKEN_FILE_ENV] || undefined;
  const cert = env[TLS_CERT_ENV] || undefined;
  const key = env[TLS_KEY_ENV] || undefined;
  if ((cert === undefined) !== (key === undefined)) {
    const [given, missing] = cert === undefined ? [TLS_KEY_ENV, TLS_CERT_ENV] : [TLS_CERT_ENV, TLS_KEY_ENV];
    throw new LockError(`${given} is set but ${missing} is not: TLS needs the certificate and its key`);
  }
  const token = tokenFile === undefined ? undefined : readToken(tokenFile);
  const credentials = cert && key ? tlsCredentials(cert, key) : grpc.ServerCredentials.createInsecure();
  const interceptors = token === undefined ? [] : [tokenCheck(token)];
  return { credentials, interceptors, summary: summary(tokenFile, cert) };
}

/** What a caller needs, in a few words, for the server's start-up line. */
function summary(tokenFile: string | undefined, cert: string | undefined): string {
  const needs = tokenFile === undefined ? "" : `calls need the job's token (from '${tokenFile}')`;
  const tls = cert === undefined ? "" : `TLS ('${cert}')`;
  if (needs && tls) return `${needs}; ${tls}`;
  if (needs) return `${needs}; no TLS`;
  if (tls) return `${tls}; no token: anyone who reaches the port may call it`;
  return `open: no token, no TLS (lock it with ${TOKEN_FILE_ENV}, ${TLS_CERT_ENV} and ${TLS_KEY_ENV})`;
}

function readToken(path: string): string {
  let token: string;
  try {
    token = readFileSync(path, "utf8").trim();
  } catch (err) {
    throw new LockError(`${TOKEN_FILE_ENV}: cannot read job token file '${path}': ${(err as Error).message}`);
  }
  if (!token) throw new LockError(`${TOKEN_FILE_ENV}: job token file '${path}' is empty`);
  return token;
}

/** TLS credentials from PEM files, checked to be a certificate and its own key (grpc-js would fail only at the
 * first handshake). */
function tlsCredentials(certFile: string, keyFile: string): grpc.ServerCredentials {
  const read = (path: string, variable: string) => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new LockError(`${variable}: cannot read '${path}': ${(err as Error).message}`);
    }
  };
  const cert = read(certFile, TLS_CERT_ENV);
  const key = read(keyFile, TLS_KEY_ENV);
  try {
    createSecureContext({ cert, key });
  } catch (err) {
    const why = (err as Error).message;
    const files = `${TLS_CERT_ENV} '${certFile}' and ${TLS_KEY_ENV} '${keyFile}'`;
    throw new LockError(`${files} are not a PEM certificate chain and its private key: ${why}`);
  }
  return grpc.ServerCredentials.createSsl(null, [{ cert_chain: cert, private_key: key }], false);
}

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}

/** Why a call with `metadata` is refused, or "" to let it through. */
function refusal(metadata: grpc.Metadata, path: string, expected: Buffer): string {
  const sent = metadata.get("authorization")[0];
  if (sent === undefined) return `${path}: no job token (authorization: Bearer <token>)`;
  return timingSafeEqual(digest(String(sent)), expected) ? "" : `${path}: wrong job token`;
}

/** Lets a call through only with `authorization: Bearer <token>` (compared in constant time); health stays open.
 * A refused client stream is read to its end first (dropped, bounded in time and count): gRPC Python's asyncio
 * client reports INTERNAL, not the status, when a server ends a call while the client is still writing
 * (grpc/grpc#36066). */
export function tokenCheck(token: string): grpc.ServerInterceptor {
  const expected = digest(`Bearer ${token}`);
  return (method, call) => {
    if (method.path.startsWith(OPEN_PREFIX)) return new grpc.ServerInterceptingCall(call);
    let why = "";
    let read = 0;
    let sent = false;
    let timer: NodeJS.Timeout | undefined;
    const refuse = () => {
      if (sent) return;
      sent = true;
      clearTimeout(timer);
      call.sendStatus({ code: grpc.status.UNAUTHENTICATED, details: why });
    };
    const listener = new grpc.ServerListenerBuilder()
      .withOnReceiveMetadata((metadata, next) => {
        why = refusal(metadata, method.path, expected);
        if (!why) return next(metadata);
        if (!method.requestStream) return refuse();
        timer = setTimeout(refuse, REFUSAL_READ_MS);
        call.startRead();
      })
      .withOnReceiveMessage((message, next) => {
        if (!why) return next(message);
        read += 1;
        if (read >= REFUSAL_READ_MESSAGES) return refuse();
        call.startRead();
      })
      .withOnReceiveHalfClose((next) => (why ? refuse() : next()))
      .withOnCancel(() => clearTimeout(timer))
      .build();
    const responder = new grpc.ResponderBuilder().withStart((next) => next(listener)).build();
    return new grpc.ServerInterceptingCall(call, responder);
  };
}
