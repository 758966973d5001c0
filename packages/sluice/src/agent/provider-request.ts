import { randomUUID } from 'node:crypto';
import {
  isContextOverflow,
  streamSimple,
  type Api,
  type AssistantMessage,
  type AssistantMessageEvent,
  type Context,
  type Model,
  type SimpleStreamOptions,
} from '@mariozechner/pi-ai';
import { context as otelContext } from '@opentelemetry/api';
import { ConcurrencyError, TurnError } from '../concurrency/errors.js';
import type { ConcurrencyEvent } from '../concurrency/events.js';
import { acquireSlot, type HeldSlot } from '../concurrency/slot.js';
import type { Credential } from '../models/model.js';
import { observeResponses } from '../models/response-observer.js';
import { assistantMessage } from './conversation.js';
import type { ResolvedRuntimeOptions } from './options.js';
import { decideRetry, type FailedAttempt } from './retry.js';
import { runFields, type RunScope } from './scope.js';
import { LinkedAbort, sleep, timer } from './signals.js';

export interface ProviderRequestOptions {
  readonly scope: RunScope;
  readonly credentials: readonly Credential[];
  readonly retry: ResolvedRuntimeOptions['retry'];
  /** Longest one provider request may take once sent. */
  readonly turnTimeoutMs: number | undefined;
  /** The provider says the context is too long: returns a smaller context to send instead. */
  readonly onOverflow?: ((context: Context) => Promise<Context>) | undefined;
}

/**
 * How a turn's provider request ended: the assistant message the agent loop gets, and, when
 * the run must fail, why. Exactly one of three shapes:
 * - answered: `message.stopReason` is `stop`, `length` or `toolUse`, no `failure`;
 * - cancelled by the run's signal: `stopReason` is `aborted`, no `failure` (the run rejects
 *   with its signal's reason);
 * - failed: `stopReason` is `error`, `errorMessage` is `failure.message`.
 */
export interface ProviderOutcome {
  readonly message: AssistantMessage;
  readonly failure?: Error | undefined;
  /** Requests actually sent: retries, credential moves and resends after compaction count. */
  readonly sent: number;
}

/** One attempt's end: the final message and what the wire said about it. */
interface Attempt {
  readonly final: AssistantMessage;
  readonly status: number | undefined;
  readonly headers: FailedAttempt['headers'];
  readonly turnTimedOut: boolean;
}

/**
 * Sends one turn's provider request. Every attempt (the first request, each retry, each
 * credential move, the resend after compaction) takes its own slot before it is sent and gives
 * it back when its response has finished, failed or been cancelled, so before the loop can run
 * a tool; no slot is held during a retry's wait. Never rejects: every end is an outcome.
 *
 * `onEvent` gets the response's stream events as they come (text deltas, tool calls), except
 * the end, which is the outcome.
 */
export async function sendProviderRequest(
  options: ProviderRequestOptions,
  model: Model<Api>,
  context: Context,
  streamOptions: SimpleStreamOptions | undefined,
  onEvent: (event: AssistantMessageEvent) => void = () => undefined,
): Promise<ProviderOutcome> {
  const { scope } = options;
  const { clock } = scope;
  let sent = 0;
  const failed = (failure: Error, base?: AssistantMessage): ProviderOutcome => ({
    message: {
      ...(base ?? assistantMessage(model, [], clock.now())),
      stopReason: 'error',
      errorMessage: failure.message,
    },
    failure,
    sent,
  });
  const cancelled = (base?: AssistantMessage): ProviderOutcome => ({
    message: {
      ...(base ?? assistantMessage(model, [], clock.now())),
      stopReason: 'aborted',
      errorMessage: String(scope.signal.reason),
    },
    sent,
  });

  // A retry starts a new response, but the loop already has the first one's start.
  let started = false;
  const forward = (event: AssistantMessageEvent) => {
    if (event.type === 'start') {
      if (started) return;
      started = true;
    }
    onEvent(event);
  };

  try {
    let credential = 0;
    let retries = 0;
    let compacted = false;
    for (;;) {
      if (scope.signal.aborted) return cancelled();
      const requestId = randomUUID();
      const span = scope.trace.startRequest(requestId, sent);
      let slot: HeldSlot<string> | undefined;
      let final: AssistantMessage;
      let attempt: Attempt;
      try {
        const waitStart = clock.now();
        try {
          slot = await takeSlot(scope, requestId);
        } finally {
          span.slotWaited(clock.now() - waitStart);
        }
      } catch (error) {
        span.end();
        // The provider is never called after a concurrency failure. A budget that ran out
        // during the wait is one too: acquireSlot reports it as a timeout.
        if (error instanceof ConcurrencyError || !scope.signal.aborted) {
          return failed(error instanceof Error ? error : new Error(String(error)));
        }
        return cancelled();
      }
      try {
        sent++;
        const apiKey = options.credentials[credential]?.apiKey ?? streamOptions?.apiKey;
        attempt = await otelContext.with(span.context, () =>
          streamAttempt(options, model, context, { ...streamOptions, apiKey }, slot, forward),
        );
        final = attempt.final;
        span.answered(final, attempt.status);
      } finally {
        span.end();
      }
      // The slot goes back before the loop sees the end of the response, so before any tool runs.
      await slot?.release(
        final.stopReason === 'error' ? 'failed' : final.stopReason === 'aborted' ? 'cancelled' : 'completed',
      );

      if (final.stopReason !== 'error' && final.stopReason !== 'aborted') return { message: final, sent };
      if (slot?.signal.aborted) return failed(slot.signal.reason as Error, final);
      if (scope.signal.aborted) return cancelled(final);
      if (attempt.turnTimedOut) {
        const error = new TurnError(
          `Provider request took longer than turnTimeoutMs (${options.turnTimeoutMs} ms)`,
          { ...runFields(scope, requestId), retryable: false },
        );
        return failed(error, final);
      }

      if (!compacted && options.onOverflow && isContextOverflow(final, model.contextWindow)) {
        // Once per turn: summarise and send again, as a new request with a new slot.
        compacted = true;
        try {
          context = await options.onOverflow(context);
        } catch (error) {
          return failed(error as Error, final);
        }
        continue;
      }

      const decision = decideRetry(
        { text: final.errorMessage ?? 'provider error', status: attempt.status, headers: attempt.headers },
        {
          retries,
          credential,
          credentials: options.credentials.length,
          now: clock.now(),
          deadline: scope.deadline,
          random: Math.random(),
        },
        options.retry,
      );
      switch (decision.kind) {
        case 'next-credential':
          credential++;
          continue;
        case 'fail':
          return failed(
            new TurnError(decision.message, {
              ...runFields(scope, requestId),
              status: decision.status,
              retryable: decision.retryable,
            }),
            final,
          );
        case 'retry':
          retries++;
          if (decision.delayMs > 0) {
            try {
              await sleep(clock, decision.delayMs, scope.signal);
            } catch {
              return cancelled(final);
            }
          }
          continue;
        default:
          return decision satisfies never;
      }
    }
  } catch (error) {
    return failed(error instanceof Error ? error : new Error(String(error)));
  }
}

/** A slot for one attempt, within what is left of the run's budget; none without a limiter. */
function takeSlot(scope: RunScope, requestId: string): Promise<HeldSlot<string> | undefined> {
  if (!scope.limiter) return Promise.resolve(undefined);
  const emit = (event: ConcurrencyEvent) => {
    for (const listener of scope.listeners) {
      try {
        listener(event);
      } catch {
        // A listener cannot break a run.
      }
    }
  };
  return acquireSlot({
    limiter: scope.limiter,
    workload: scope.workload,
    key: scope.key,
    // Cancellation only: the budget goes in as `timeoutMs`, and acquireSlot alone decides
    // that a wait has timed out. Were the run's own deadline abort passed here too, its timer
    // and the limiter's would race to say `wait-cancelled` or `timed-out`.
    signal: scope.cancelSignal,
    timeoutMs: scope.deadline === undefined ? undefined : scope.deadline - scope.clock.now(),
    clock: scope.clock,
    runId: scope.runId,
    rootRunId: scope.rootRunId,
    parentRunId: scope.parentRunId,
    requestId,
    onEvent: emit,
  });
}

/** Sends one attempt and streams it on; ends when its response does. */
async function streamAttempt(
  options: ProviderRequestOptions,
  model: Model<Api>,
  context: Context,
  streamOptions: SimpleStreamOptions,
  slot: HeldSlot<string> | undefined,
  forward: (event: AssistantMessageEvent) => void,
): Promise<Attempt> {
  const { scope } = options;
  const request = new LinkedAbort([scope.signal, slot?.signal]);
  let turnTimedOut = false;
  const turnTimer = timer(scope.clock, options.turnTimeoutMs, () => {
    turnTimedOut = true;
    request.abort(new Error(`turnTimeoutMs (${options.turnTimeoutMs} ms) passed`));
  });
  let status: number | undefined;
  let headers: FailedAttempt['headers'];
  // Status and wait headers of every response, error responses included.
  const observe = (s: number, h: Headers) => {
    status = s;
    headers = {
      retryAfterMs: h.get('retry-after-ms') ?? undefined,
      retryAfter: h.get('retry-after') ?? undefined,
    };
  };
  try {
    const inner = observeResponses(observe, () =>
      streamSimple(model, context, {
        ...streamOptions,
        signal: request.signal,
        // HTTP retries inside the SDK would hide provider failures from the slot accounting;
        // ours are new requests with new slots.
        maxRetries: 0,
      }),
    );
    let final: AssistantMessage | undefined;
    for await (const event of inner) {
      if (event.type === 'done') final = event.message;
      else if (event.type === 'error') final = event.error;
      else forward(event);
    }
    final ??= await inner.result();
    return { final, status, headers, turnTimedOut };
  } finally {
    turnTimer.clear();
    request.dispose();
  }
}
