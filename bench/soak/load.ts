/**
 * The soak's clients: several tenants sending every kind of run the server takes, each call
 * logged as the client saw it (the run it was given, the final state it was told, the status
 * or the network error), which the checker holds against the database afterwards.
 */
import WebSocket from 'ws';
import type { Random } from './random.js';
import type { Balancer, SoakServer } from './servers.js';

export const kinds = [
  'inline',
  'queued',
  'deferred',
  'scheduled',
  'streamed',
  'thread',
  'websocket',
] as const;
export type Kind = (typeof kinds)[number];

export interface Call {
  kind: Kind;
  tenant: string;
  token: string;
  server: string;
  sentAt: number;
  endedAt: number;
  /** The HTTP status; undefined after a network error (or on a WebSocket). */
  status?: number;
  /** The run the server answered with: the call was accepted. */
  runId?: string;
  /** The final state the client was told (inline answer, stream's or frame's last event). */
  final?: string;
  /** The error code of a refusal, an error frame's code, or the network error (`network:…`). */
  error?: string;
  /** The limit a refusal named (`max_concurrent_per_user`, `max_queued_runs`, …). */
  limit?: string;
  callback: boolean;
}

export interface Tenant {
  name: string;
  secret: string;
  threads: string[];
}

export interface LoadOptions {
  random: Random;
  balancer: Balancer;
  tenants: readonly Tenant[];
  receiverUrl: string;
  /** Clients sending at once. */
  clients: number;
  /** Stops sending new calls when aborted; calls in flight finish. */
  signal: AbortSignal;
}

const api = '/api/client/v1';
const terminal = new Set(['run.completed', 'run.failed', 'run.canceled', 'run.requires_action']);
const finalOf = (event: string) =>
  ({ 'run.completed': 'succeeded', 'run.failed': 'failed', 'run.canceled': 'canceled' })[event] ?? event;

/** Runs the clients until `signal` aborts; resolves with every call once the last one ended. */
export async function runLoad(options: LoadOptions): Promise<Call[]> {
  const calls: Call[] = [];
  let n = 0;
  const client = async () => {
    while (!options.signal.aborted) {
      const server = options.balancer.choose((k) => options.random.int(0, k - 1));
      if (!server) {
        await sleep(100);
        continue;
      }
      const tenant = options.random.pick(options.tenants);
      const kind = options.random.pick(kinds);
      const token = `soak-${++n}-${kind}`;
      const callback = (kind === 'queued' || kind === 'deferred') && options.random.next() < 0.5;
      calls.push(await send(kind, server, tenant, token, callback, options));
      await sleep(options.random.int(0, 50));
    }
  };
  await Promise.all(Array.from({ length: options.clients }, client));
  return calls;
}

async function send(
  kind: Kind,
  server: SoakServer,
  tenant: Tenant,
  token: string,
  callback: boolean,
  options: LoadOptions,
): Promise<Call> {
  const call: Call = {
    kind,
    tenant: tenant.name,
    token,
    server: server.name,
    sentAt: Date.now(),
    endedAt: 0,
    callback,
  };
  try {
    if (kind === 'websocket') await overWebSocket(call, server, tenant);
    else if (kind === 'streamed') await streamed(call, server, tenant, token);
    else await posted(call, server, tenant, bodyOf(kind, token, tenant, callback, options), kind);
  } catch (error) {
    call.error ??= networkError(error);
  }
  call.endedAt = Date.now();
  return call;
}

function bodyOf(kind: Kind, token: string, tenant: Tenant, callback: boolean, options: LoadOptions): object {
  const callbackUrl = callback ? { callback_url: `${options.receiverUrl}/callback` } : {};
  switch (kind) {
    case 'inline':
      return { input: token, wait: true };
    case 'queued':
      return { input: token, wait: false, ...callbackUrl };
    case 'deferred':
      return { input: token, class: 'deferred', ...callbackUrl };
    case 'scheduled':
      return { input: token, wait: false, delay_seconds: options.random.int(1, 3) };
    case 'thread':
      return { input: token, wait: true, thread_id: options.random.pick(tenant.threads) };
    default:
      throw new Error(`no body for ${kind}`);
  }
}

const headersOf = (tenant: Tenant) => ({
  authorization: `Bearer ${tenant.secret}`,
  'content-type': 'application/json',
});

async function posted(
  call: Call,
  server: SoakServer,
  tenant: Tenant,
  body: object,
  kind: Kind,
): Promise<void> {
  const response = await fetch(`${server.url}${api}/agents/soak/runs`, {
    method: 'POST',
    headers: headersOf(tenant),
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  call.status = response.status;
  const reply = (await response.json().catch(() => ({}))) as {
    id?: string;
    status?: string;
    error?: { code?: string; type?: string; limit?: string };
  };
  if (response.status >= 200 && response.status < 300 && reply.id) {
    call.runId = reply.id;
    if (kind === 'inline' || kind === 'thread') {
      if (reply.status && ['succeeded', 'failed', 'canceled'].includes(reply.status))
        call.final = reply.status;
    }
  } else {
    call.error = reply.error?.code ?? reply.error?.type ?? `http_${response.status}`;
    call.limit = reply.error?.limit;
  }
}

async function streamed(call: Call, server: SoakServer, tenant: Tenant, token: string): Promise<void> {
  const response = await fetch(`${server.url}${api}/agents/soak/runs`, {
    method: 'POST',
    headers: headersOf(tenant),
    body: JSON.stringify({ input: token, stream: true }),
    signal: AbortSignal.timeout(60_000),
  });
  call.status = response.status;
  if (response.status !== 200 || !response.body) {
    const reply = (await response.json().catch(() => ({}))) as { error?: { code?: string; limit?: string } };
    call.error = reply.error?.code ?? `http_${response.status}`;
    call.limit = reply.error?.limit;
    return;
  }
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of response.body) {
    buffer += decoder.decode(chunk, { stream: true });
    let end: number;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = /^event: (.*)$/m.exec(block)?.[1];
      const data = /^data: (.*)$/m.exec(block)?.[1];
      if (!event || !data) continue;
      if (event === 'run.created') call.runId = (JSON.parse(data) as { id: string }).id;
      if (terminal.has(event)) call.final = finalOf(event);
    }
  }
  if (call.runId && !call.final) call.error = 'stream_ended_early';
}

/** One run over a WebSocket of its own: the run frame, then frames until the run's last. */
function overWebSocket(call: Call, server: SoakServer, tenant: Tenant): Promise<void> {
  return new Promise((resolve) => {
    const socket = new WebSocket(`${server.url.replace('http', 'ws')}${api}/ws`, {
      headers: { authorization: `Bearer ${tenant.secret}` },
    });
    const timer = setTimeout(() => socket.terminate(), 60_000);
    const done = (error?: string) => {
      clearTimeout(timer);
      if (error && !call.final) call.error ??= error;
      socket.terminate();
      resolve();
    };
    socket.on('unexpected-response', (_request, response) => {
      call.status = response.statusCode;
      done(`http_${response.statusCode}`);
    });
    socket.on('error', (error) => done(networkError(error)));
    socket.on('close', (code) => done(`closed_${code}`));
    socket.on('open', () => {
      call.status = 101;
      socket.send(JSON.stringify({ type: 'run', request_id: call.token, agent: 'soak', input: call.token }));
    });
    socket.on('message', (raw) => {
      const frame = JSON.parse(String(raw)) as {
        type: string;
        data?: { id?: string };
        error?: { code?: string; limit?: string };
      };
      if (frame.type === 'run.created') call.runId = frame.data?.id;
      else if (frame.type === 'error') {
        call.limit = frame.error?.limit;
        done(frame.error?.code ?? 'error_frame');
      } else if (terminal.has(frame.type)) {
        call.final = finalOf(frame.type);
        done();
      }
    });
  });
}

function networkError(error: unknown): string {
  // AbortSignal.timeout's DOMException: the call was held longer than the client waits.
  if ((error as Error).name === 'TimeoutError') return 'network:timeout';
  const cause = (error as { cause?: { code?: string } }).cause;
  return `network:${cause?.code ?? (error as { code?: string }).code ?? (error as Error).name ?? 'error'}`;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
