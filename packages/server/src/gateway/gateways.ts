import type { IncomingMessage, ServerResponse } from 'node:http';
import { SpanStatusCode, trace } from '@opentelemetry/api';
import {
  acquireSlot,
  ConcurrencyConfigError,
  ConcurrencyQueueFullError,
  ConcurrencyTimeoutError,
  rateLimitsFromHeaders,
  agedRateLimits,
  type Clock,
  type ConcurrencyEvent,
  type HeldSlot,
  type TokenCounts,
} from 'sluice/concurrency';
import type { GatewayAccounting } from './accounting.js';
import type { ResolvedGateway } from './config.js';
import { GatewayError, limiterFailed, noSlot } from './errors.js';
import { estimateTokens, parseBody } from './estimate.js';
import { pipeExchange, writeError, type ExchangeEnd } from './exchange.js';
import { upstreamHeaders } from './headers.js';
import type { GatewayMetrics } from './metrics.js';
import type { GatewayTraffic } from './traffic.js';
import { UpstreamPools } from './upstream.js';

const tracer = trace.getTracer('@sluice/server');

/** One caller's request to a gateway, as the route hands it over. */
export interface GatewayCall {
  readonly gateway: ResolvedGateway;
  readonly tenant: string;
  readonly requestId: string;
  readonly request: IncomingMessage;
  readonly response: ServerResponse;
  /** The upstream path and query (path.ts). */
  readonly path: string;
  readonly body: Buffer | undefined;
}

/** What a gateway request's log line says: figures and names, never a prompt, a header or a key. */
export interface GatewayLogLine {
  reqId: string;
  gateway: string;
  tenant: string;
  method: string;
  status: number;
  outcome: string;
  slotWaitMs?: number;
  upstreamMs?: number;
  inputTokens?: number;
  outputTokens?: number;
}

export interface GatewayParts {
  readonly accounting: GatewayAccounting;
  readonly metrics: GatewayMetrics;
  readonly traffic: GatewayTraffic;
  readonly clock: Clock;
  /** Hears the slot events of gateway requests (the slot counts and the wait histogram). */
  readonly onSlotEvent: (event: ConcurrencyEvent) => void;
  readonly log: (line: GatewayLogLine) => void;
  /** Failures of the gateway's own bookkeeping (a usage row that could not be written). */
  readonly warn: (message: string, error: unknown) => void;
}

/** An open request: what the drain waits for, and cuts when its time is up. */
interface Open {
  cut: () => void;
  ended: Promise<void>;
}

/**
 * The provider gateways of one server process: each request takes a place under its tenant's
 * cap, a slot of the gateway's limiter (POSTs: the model requests), then is piped to the
 * upstream, and gives both back when the response has ended. `settle` is the drain.
 */
export class Gateways {
  readonly #byName: ReadonlyMap<string, ResolvedGateway>;
  readonly #parts: GatewayParts;
  readonly #pools = new UpstreamPools();
  readonly #open = new Set<Open>();

  constructor(gateways: ReadonlyMap<string, ResolvedGateway>, parts: GatewayParts) {
    this.#byName = gateways;
    this.#parts = parts;
  }

  /** The gateway named `name`, by exact name only. */
  find(name: string): ResolvedGateway | undefined {
    return this.#byName.get(name);
  }

  get names(): string[] {
    return [...this.#byName.keys()];
  }

  /** Requests open now (waiting for a slot or exchanging with the upstream). */
  get open(): number {
    return this.#open.size;
  }

  /** Forwards one request and answers it; never rejects (every failure is an answer or a cut). */
  async forward(call: GatewayCall): Promise<void> {
    const { gateway, tenant, response } = call;
    const { traffic, metrics } = this.#parts;
    let finished!: () => void;
    const open: Open = { cut: () => undefined, ended: new Promise((resolve) => (finished = resolve)) };
    this.#open.add(open);
    traffic.opened(tenant, gateway.name);
    const gone = new AbortController();
    const onClose = () => {
      if (!response.writableFinished) {
        gone.abort(new Error('the caller left'));
        open.cut();
      }
    };
    response.once('close', onClose);
    open.cut = () => gone.abort(new Error('the server is draining'));
    let end: ExchangeEnd = { outcome: 'failed', status: 500, headers: undefined, usage: undefined };
    let slotWaitMs: number | undefined;
    let upstreamMs: number | undefined;
    try {
      const outcome = await this.#run(call, gone.signal, open);
      end = outcome.end;
      slotWaitMs = outcome.slotWaitMs;
      upstreamMs = outcome.upstreamMs;
    } catch (error) {
      const refusal = error instanceof GatewayError ? error : undefined;
      if (!refusal) this.#parts.warn('gateway request failed', error);
      const answer = refusal ?? new GatewayError(500, 'internal_error', 'internal error');
      if (!gone.signal.aborted) writeError(response, gateway.api, answer, call.requestId);
      end = {
        outcome: gone.signal.aborted ? 'cancelled' : 'failed',
        status: answer.status,
        headers: undefined,
        usage: undefined,
      };
    } finally {
      response.removeListener('close', onClose);
      this.#open.delete(open);
      finished();
    }
    metrics.answered(gateway.name, end.status);
    traffic.answered(tenant, gateway.name, end.status, end.usage, true);
    this.#parts.log({
      reqId: call.requestId,
      gateway: gateway.name,
      tenant,
      method: call.request.method ?? '',
      status: end.status,
      outcome: end.outcome,
      slotWaitMs,
      upstreamMs,
      inputTokens: end.usage?.input,
      outputTokens: end.usage?.output,
    });
  }

  async #run(call: GatewayCall, gone: AbortSignal, open: Open) {
    const { gateway, tenant } = call;
    const { accounting, clock } = this.#parts;
    const place = await accounting.takePlace(tenant);
    let slot: HeldSlot<string> | undefined;
    try {
      if (accounting.counted(tenant, gateway)) await accounting.checkPeriod(tenant);
      const model = call.request.method === 'POST';
      const tokens = model ? estimateTokens(parseBody(call.body)) : undefined;
      const waitStarted = clock.now();
      if (model) slot = await this.#slot(call, tokens!, gone);
      const slotWaitMs = model ? clock.now() - waitStarted : undefined;
      if (gone.aborted) {
        await slot?.release('cancelled');
        return { end: cancelledBeforeUpstream, slotWaitMs };
      }
      const span = tracer.startSpan('sluice.gateway.upstream', {
        attributes: {
          'sluice.gateway': gateway.name,
          'sluice.gateway.api': gateway.api,
          'sluice.tenant': tenant,
          'http.request.method': call.request.method ?? '',
          'sluice.slot.wait_ms': slotWaitMs ?? 0,
          'sluice.slot.held': slot !== undefined,
        },
      });
      const sentAt = performance.now();
      let end: ExchangeEnd;
      // A kept-alive socket the upstream closed meanwhile fails before any answer: once more on a new one.
      for (let attempt = 0; ; attempt++) {
        const request = {
          method: call.request.method ?? 'GET',
          path: call.path,
          headers: upstreamHeaders(
            gateway,
            call.request.headers,
            call.body?.length ?? (model ? 0 : undefined),
          ),
          body: call.body,
        };
        const piped = pipeExchange(
          (handler) => this.#pools.dispatch(gateway, request, handler),
          call.response,
          {
            api: gateway.api,
            requestId: call.requestId,
            lost: slot?.signal,
            now: () => clock.now(),
            ...(attempt === 0 ? { staleRetry: true } : {}),
          },
        );
        open.cut = piped.cut;
        if (gone.aborted) piped.cut();
        end = await piped.done;
        if (!end.stale) break;
      }
      const upstreamMs = performance.now() - sentAt;
      this.#parts.metrics.upstream(gateway.name, upstreamMs / 1000);
      span.setAttribute('http.response.status_code', end.status);
      span.setAttribute('sluice.gateway.outcome', end.outcome);
      if (end.outcome !== 'completed' || end.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
      span.end();
      await this.#release(slot, end);
      slot = undefined;
      if (accounting.counted(tenant, gateway))
        accounting
          .record(tenant, gateway, end.status, end.usage)
          .catch((error: unknown) => this.#parts.warn('gateway usage not recorded', error));
      return { end, slotWaitMs, upstreamMs };
    } finally {
      await slot?.release('failed');
      place.release();
    }
  }

  /** A slot of the gateway's limiter, keyed by the tenant; each way it can fail is an answer. */
  async #slot(call: GatewayCall, tokens: TokenCounts, gone: AbortSignal): Promise<HeldSlot<string>> {
    const { gateway, tenant } = call;
    try {
      return await acquireSlot({
        limiter: gateway.limiter,
        workload: gateway.workload,
        key: tenant,
        tokens,
        signal: gone,
        clock: this.#parts.clock,
        onEvent: this.#parts.onSlotEvent,
        requestId: call.requestId,
      });
    } catch (error) {
      if (gone.aborted) throw error;
      if (error instanceof ConcurrencyTimeoutError)
        throw noSlot(
          `No slot of limiter \`${error.limiter}\` came within ${error.timeoutMs} ms; retry later`,
          Math.max(1, Math.ceil(error.timeoutMs / 1000)),
        );
      if (error instanceof ConcurrencyQueueFullError)
        throw noSlot(
          `The queue of limiter \`${error.limiter}\` is full (${error.queued} waiting); retry later`,
          1,
        );
      if (error instanceof ConcurrencyConfigError)
        throw new GatewayError(400, 'invalid_request', error.message);
      throw limiterFailed(gateway.limiter.name);
    }
  }

  /** Gives the slot back with what the upstream said: the usage, its status, its rate-limit headers. */
  async #release(slot: HeldSlot<string> | undefined, end: ExchangeEnd): Promise<void> {
    if (!slot) return;
    // Read as of when the headers came, then aged to now: a stream ends long after them.
    const { clock } = this.#parts;
    const answeredAt = end.answeredAt ?? clock.now();
    const limits = end.headers
      ? agedRateLimits(
          rateLimitsFromHeaders(end.headers as Record<string, string>, answeredAt),
          clock.now() - answeredAt,
        )
      : undefined;
    await slot.release(end.outcome, {
      ...(end.usage ? { usage: end.usage } : {}),
      ...(end.headers
        ? {
            provider: {
              status: end.status,
              ...(limits ? { limits, retryAfterMs: limits.retryAfterMs } : {}),
            },
          }
        : {}),
    });
  }

  /**
   * The drain: waits for the open requests for at most `ms` (on the server's clock), then cuts
   * the ones left (their upstream requests stop, their callers' connections close).
   */
  async settle(ms: number): Promise<void> {
    if (this.#open.size === 0) return;
    const { clock } = this.#parts;
    let timer: ReturnType<Clock['setTimeout']> | undefined;
    const timeUp = new Promise<void>((resolve) => (timer = clock.setTimeout(resolve, ms)));
    const all = Promise.all([...this.#open].map((o) => o.ended)).then(() => undefined);
    await Promise.race([all, timeUp]);
    if (timer !== undefined) clock.clearTimeout(timer);
    for (const open of this.#open) open.cut();
    await all;
  }

  close(): void {
    for (const open of this.#open) open.cut();
    this.#pools.close();
  }
}

const cancelledBeforeUpstream: ExchangeEnd = {
  outcome: 'cancelled',
  status: 499,
  headers: undefined,
  usage: undefined,
};
