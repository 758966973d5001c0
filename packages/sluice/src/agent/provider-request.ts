import { randomUUID } from 'node:crypto';
import {
  createAssistantMessageEventStream,
  isContextOverflow,
  streamSimple,
  type Api,
  type AssistantMessage,
  type AssistantMessageEventStream,
  type Context,
  type Model,
  type SimpleStreamOptions,
} from '@mariozechner/pi-ai';
import { ConcurrencyTimeoutError, TurnError } from '../concurrency/errors.js';
import { RunTimeoutError } from './errors.js';
import type { ConcurrencyEvent } from '../concurrency/events.js';
import { acquireSlot, type HeldSlot } from '../concurrency/slot.js';
import type { Credential } from '../models/model.js';
import { observeResponses } from '../models/response-observer.js';
import type { RunScope } from './scope.js';

/** Our own retries of transient provider failures. Each retry is a new request with a new slot. */
export interface RetryOptions {
  /** @default 3 */
  maxRetries?: number;
  /** First backoff; doubles each time, with full jitter. @default 500 */
  baseDelayMs?: number;
  /** @default 30000 */
  maxDelayMs?: number;
}

export interface ProviderRequestOptions {
  readonly scope: RunScope;
  readonly credentials: readonly Credential[];
  readonly retry: Required<RetryOptions>;
  /** Longest one provider request may take once sent. */
  readonly turnTimeoutMs: number | undefined;
  /** Where a failure that ends the run is recorded, for `run()` to throw. */
  readonly fail: (error: Error) => void;
  /** The provider says the context is too long: returns a smaller context to retry with. */
  readonly onOverflow?: (context: Context) => Promise<Context>;
  /** Called once per provider request actually sent (tests, metrics). */
  readonly onRequest?: (info: { requestId: string; attempt: number; credential: number }) => void;
}

const transientPattern =
  /ECONNRESET|ECONNREFUSED|EPIPE|socket hang up|terminated|Connection error|fetch failed|other side closed|overloaded/i;

function errorMessageOf(model: Model<Api>, text: string, stopReason: 'error' | 'aborted'): AssistantMessage {
  return {
    role: 'assistant',
    content: [],
    api: model.api,
    provider: model.provider,
    model: model.id,
    usage: {
      input: 0,
      output: 0,
      cacheRead: 0,
      cacheWrite: 0,
      totalTokens: 0,
      cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
    },
    stopReason,
    errorMessage: text,
    timestamp: Date.now(),
  };
}

function retryAfterMs(value: string | undefined): number | undefined {
  if (!value) return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const date = Date.parse(value);
  return Number.isNaN(date) ? undefined : Math.max(0, date - Date.now());
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });

/**
 * The stream function pi-agent-core calls once per assistant turn. Every attempt (the first
 * request, each retry, each credential fallback) takes its own slot before it is sent and
 * gives it back when its response has finished, failed or been cancelled, before the loop
 * can run a tool. The slot is never held during a retry's backoff.
 */
export function createProviderRequest(options: ProviderRequestOptions) {
  const { scope, retry } = options;
  const emit = (event: ConcurrencyEvent) => {
    for (const listener of scope.listeners) {
      try {
        listener(event);
      } catch {
        // A listener cannot break a run.
      }
    }
  };

  return (
    model: Model<Api>,
    context: Context,
    streamOptions?: SimpleStreamOptions,
  ): AssistantMessageEventStream => {
    const out = createAssistantMessageEventStream();
    let started = false;
    const finish = (message: AssistantMessage) => {
      out.push(
        message.stopReason === 'error' || message.stopReason === 'aborted'
          ? { type: 'error', reason: message.stopReason, error: message }
          : { type: 'done', reason: message.stopReason, message },
      );
      out.end(message);
    };

    void (async () => {
      let credential = 0;
      let compacted = false;
      for (let attempt = 0; ; attempt++) {
        if (scope.signal.aborted)
          return finish(errorMessageOf(model, String(scope.signal.reason), 'aborted'));
        const requestId = randomUUID();
        let slot: HeldSlot<string> | undefined;
        const waitStart = Date.now();
        if (scope.limiter) {
          try {
            slot = await acquireSlot({
              limiter: scope.limiter,
              workload: scope.workload,
              signal: scope.signal,
              timeoutMs: scope.deadline === undefined ? undefined : scope.deadline - Date.now(),
              runId: scope.runId,
              rootRunId: scope.rootRunId,
              parentRunId: scope.parentRunId,
              requestId,
              onEvent: emit,
            });
          } catch (error) {
            // The provider is never called after a concurrency failure.
            if (scope.signal.reason instanceof RunTimeoutError) {
              // The budget ran out while waiting for a slot: that is a slot timeout.
              const timeout = new ConcurrencyTimeoutError({
                ...scopeFields(scope),
                requestId,
                waitMs: Date.now() - waitStart,
                timeoutMs: scope.deadline === undefined ? 0 : Math.max(0, scope.deadline - waitStart),
              });
              options.fail(timeout);
              return finish(errorMessageOf(model, timeout.message, 'error'));
            }
            if (scope.signal.aborted)
              return finish(errorMessageOf(model, String(scope.signal.reason), 'aborted'));
            options.fail(error as Error);
            return finish(errorMessageOf(model, (error as Error).message, 'error'));
          }
        }
        const signals = [scope.signal];
        if (slot) signals.push(slot.signal);
        if (options.turnTimeoutMs !== undefined) signals.push(AbortSignal.timeout(options.turnTimeoutMs));
        const requestSignal = AbortSignal.any(signals);
        let status: number | undefined;
        let retryAfter: string | undefined;
        options.onRequest?.({ requestId, attempt, credential });
        // Status and retry-after of every response, error responses included.
        const observe = (s: number, headers: Headers) => {
          status = s;
          const ms = headers.get('retry-after-ms');
          retryAfter = ms !== null ? String(Number(ms) / 1000) : (headers.get('retry-after') ?? undefined);
        };
        const inner = observeResponses(observe, () =>
          streamSimple(model, context, {
            ...streamOptions,
            apiKey: options.credentials[credential]?.apiKey ?? streamOptions?.apiKey,
            signal: requestSignal,
            // HTTP retries inside the SDK would hide provider failures from the slot
            // accounting; ours below are new requests with new slots.
            maxRetries: 0,
          }),
        );
        let final: AssistantMessage | undefined;
        for await (const event of inner) {
          if (event.type === 'done') final = event.message;
          else if (event.type === 'error') final = event.error;
          else if (event.type === 'start') {
            // A retry starts a new response; the loop already has the partial one.
            if (!started) out.push(event);
            started = true;
          } else out.push(event);
        }
        final ??= await inner.result();
        // The slot goes back before the loop sees the end of the response, so before any tool runs.
        const outcome =
          final.stopReason === 'error'
            ? 'failed'
            : final.stopReason === 'aborted'
              ? 'cancelled'
              : 'completed';
        await slot?.release(outcome);

        if (final.stopReason !== 'error' && final.stopReason !== 'aborted') return finish(final);
        if (slot?.signal.aborted) {
          options.fail(slot.signal.reason as Error);
          return finish(errorMessageOf(model, (slot.signal.reason as Error).message, 'error'));
        }
        if (scope.signal.aborted) return finish({ ...final, stopReason: 'aborted' });
        if (final.stopReason === 'aborted') {
          // Only the turn timeout is left to have cut this request.
          const error = new TurnError(
            `Provider request took longer than turnTimeoutMs (${options.turnTimeoutMs} ms)`,
            {
              ...scopeFields(scope),
              retryable: false,
            },
          );
          options.fail(error);
          return finish({ ...final, stopReason: 'error', errorMessage: error.message });
        }

        if (!compacted && options.onOverflow && isContextOverflow(final, model.contextWindow)) {
          // Once per turn: summarise and send again, as a new request with a new slot.
          compacted = true;
          try {
            context = await options.onOverflow(context);
          } catch (error) {
            options.fail(error as Error);
            return finish({ ...final, errorMessage: (error as Error).message });
          }
          attempt--;
          continue;
        }
        const text = final.errorMessage ?? 'provider error';
        // The SDKs put the HTTP status first in their error messages ("429 Too many requests").
        status ??= /^(\d{3})\b/.exec(text) ? Number(/^(\d{3})\b/.exec(text)![1]) : undefined;
        // The headers of an error response do not reach us through pi-ai; providers often
        // repeat the wait in the message ("Please try again in 2.5s", "retry after 3").
        const hinted = /(?:try again in|retry[- ]after)[^0-9]*(\d+(?:\.\d+)?)\s*(ms|s)?/i.exec(text);
        if (hinted && retryAfter === undefined) {
          retryAfter = String(hinted[2] === 'ms' ? Number(hinted[1]) / 1000 : Number(hinted[1]));
        }
        const authFailure = status === 401 || status === 403;
        const rateLimited = status === 429;
        const transient =
          rateLimited ||
          status === 408 ||
          status === 409 ||
          (status !== undefined && status >= 500) ||
          transientPattern.test(text);
        // Credential fallback first: an authentication failure or a rate limit on this key.
        if ((authFailure || rateLimited) && credential + 1 < options.credentials.length) {
          credential++;
          attempt--;
          continue;
        }
        if (!transient || attempt >= retry.maxRetries) {
          const error = new TurnError(
            `Provider request failed${status ? ` with HTTP ${status}` : ''}: ${text}`,
            {
              ...scopeFields(scope),
              requestId,
              status,
              retryable: transient,
            },
          );
          options.fail(error);
          return finish({ ...final, errorMessage: error.message });
        }
        const backoff = Math.random() * Math.min(retry.maxDelayMs, retry.baseDelayMs * 2 ** attempt);
        const delay = retryAfterMs(retryAfter) ?? backoff;
        if (scope.deadline !== undefined && Date.now() + delay >= scope.deadline) {
          const error = new TurnError(
            `Provider request failed and the run's budget ends before a retry: ${text}`,
            {
              ...scopeFields(scope),
              requestId,
              status,
              retryable: true,
            },
          );
          options.fail(error);
          return finish({ ...final, errorMessage: error.message });
        }
        try {
          await sleep(delay, scope.signal);
        } catch {
          return finish({ ...final, stopReason: 'aborted' });
        }
      }
    })().catch((error: unknown) => {
      options.fail(error instanceof Error ? error : new Error(String(error)));
      finish(errorMessageOf(model, String(error), 'error'));
    });
    return out;
  };
}

function scopeFields(scope: RunScope) {
  return {
    limiter: scope.limiter?.name ?? 'none',
    workload: scope.workload,
    runId: scope.runId,
    rootRunId: scope.rootRunId,
    parentRunId: scope.parentRunId,
  };
}
