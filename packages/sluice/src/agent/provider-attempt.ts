import {
  streamSimple,
  type Api,
  type AssistantMessage,
  type AssistantMessageEvent,
  type Context,
  type Model,
  type SimpleStreamOptions,
} from '@mariozechner/pi-ai';
import { context as otelContext } from '@opentelemetry/api';
import type { ProviderRateLimits, ReleaseDetails, TokenCounts } from '../concurrency/capacity-types.js';
import type { ConcurrencyEvent } from '../concurrency/events.js';
import { agedRateLimits } from '../concurrency/rate-limit-age.js';
import { rateLimitsFromHeaders } from '../concurrency/rate-limit-headers.js';
import { acquireSlot, type HeldSlot } from '../concurrency/slot.js';
import { observeResponses } from '../models/response-observer.js';
import { providerWaitMs, type FailedAttempt } from './retry.js';
import type { RunScope } from './scope.js';
import { LinkedAbort, timer } from './signals.js';
import type { RequestTrace } from './tracing.js';

/** One attempt's end: the final message and what the wire said about it. */
export interface Attempt {
  readonly final: AssistantMessage;
  /** The last HTTP response's status; undefined when no response came (a failed connection). */
  readonly status: number | undefined;
  readonly headers: FailedAttempt['headers'];
  /** The provider's rate-limit figures, from the last response's headers. */
  readonly limits: ProviderRateLimits | undefined;
  /** When those headers came (the run's clock): a streamed answer ends well after them. */
  readonly limitsAt: number | undefined;
  readonly turnTimedOut: boolean;
}

/**
 * Retries the provider SDK makes by itself, inside the attempt's slot, of a connection that
 * failed before any response (a reset, a refused connection, a dropped socket): the request
 * never reached the provider's accounting, so it is the same request, not a new one. Every
 * HTTP answer is left to our own policy (see `observeResponses`). Two, as the SDKs' default.
 */
const sdkConnectionRetries = 2;

/** What one attempt is sent with. */
export interface AttemptRequest {
  readonly scope: RunScope;
  readonly model: Model<Api>;
  readonly context: Context;
  readonly streamOptions: SimpleStreamOptions;
  /** Longest the attempt may take once sent. */
  readonly turnTimeoutMs: number | undefined;
  /** Gets the response's stream events as they come, except its end. */
  readonly forward: (event: AssistantMessageEvent) => void;
}

/**
 * Waits for the attempt's slot, within what is left of the run's budget (none without a
 * limiter), and records the wait on the attempt's span. Rejects as `acquireSlot` does.
 */
export async function waitForSlot(
  scope: RunScope,
  requestId: string,
  span: RequestTrace,
  tokens: TokenCounts | undefined,
): Promise<HeldSlot<string> | undefined> {
  const waitStart = scope.clock.now();
  try {
    return await takeSlot(scope, requestId, tokens);
  } finally {
    span.slotWaited(scope.clock.now() - waitStart);
  }
}

/**
 * Sends the attempt on its slot and gives the slot back when the response has finished,
 * failed or been cancelled: before the loop sees the end of the response, so before any tool
 * of the turn runs. Ends the attempt's span.
 */
export async function sendOnSlot(
  request: AttemptRequest,
  slot: HeldSlot<string> | undefined,
  span: RequestTrace,
): Promise<Attempt> {
  let attempt: Attempt | undefined;
  try {
    attempt = await otelContext.with(span.context, () => streamAttempt(request, slot));
    span.answered(attempt.final, attempt.status);
  } finally {
    span.end();
    await slot?.release(
      attempt ? releaseOutcome(attempt.final) : 'failed',
      attempt && releaseDetails(attempt, request.scope.clock.now()),
    );
  }
  return attempt;
}

/**
 * What the limiter is told when the slot goes back: the tokens the response reported (all its
 * input, cached or not, as providers count prompts against their limits), and the provider's
 * status and rate-limit figures. Without a reported usage (a refused or failed request) the
 * estimate stays charged; without a response, the provider said nothing. A failed answer's
 * wait is the one our retry honours: its headers', else one its message names ("try again in
 * 300ms"), so the limiter pauses exactly as long as the run waits.
 */
function releaseDetails(attempt: Attempt, now: number): ReleaseDetails {
  const u = attempt.final.usage;
  const failed = attempt.final.stopReason === 'error';
  const limits = attempt.limits && agedRateLimits(attempt.limits, now - (attempt.limitsAt ?? now));
  const retryAfterMs =
    limits?.retryAfterMs ??
    (failed
      ? providerWaitMs(
          { text: attempt.final.errorMessage ?? '', status: attempt.status, headers: attempt.headers },
          now,
        )
      : undefined);
  const input = (u?.input ?? 0) + (u?.cacheRead ?? 0) + (u?.cacheWrite ?? 0);
  const output = u?.output ?? 0;
  return {
    ...(input + output > 0 ? { usage: { input, output } } : {}),
    ...(attempt.status === undefined
      ? {}
      : {
          provider: { status: attempt.status, retryAfterMs, limits },
        }),
  };
}

function releaseOutcome(final: AssistantMessage): 'completed' | 'failed' | 'cancelled' {
  return final.stopReason === 'error' ? 'failed' : final.stopReason === 'aborted' ? 'cancelled' : 'completed';
}

/** A slot for one attempt, within what is left of the run's budget; none without a limiter. */
function takeSlot(
  scope: RunScope,
  requestId: string,
  tokens: TokenCounts | undefined,
): Promise<HeldSlot<string> | undefined> {
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
    tokens,
  });
}

/** Sends one attempt and streams it on; ends when its response does. */
async function streamAttempt(request: AttemptRequest, slot: HeldSlot<string> | undefined): Promise<Attempt> {
  const { scope, turnTimeoutMs } = request;
  const abort = new LinkedAbort([scope.signal, slot?.signal]);
  let turnTimedOut = false;
  const turnTimer = timer(scope.clock, turnTimeoutMs, () => {
    turnTimedOut = true;
    abort.abort(new Error(`turnTimeoutMs (${turnTimeoutMs} ms) passed`));
  });
  let status: number | undefined;
  let headers: FailedAttempt['headers'];
  let limits: ProviderRateLimits | undefined;
  let limitsAt: number | undefined;
  // Status and headers of every response, error responses included; the last one counts.
  const observe = (s: number, h: Headers) => {
    status = s;
    headers = {
      retryAfterMs: h.get('retry-after-ms') ?? undefined,
      retryAfter: h.get('retry-after') ?? undefined,
    };
    limitsAt = scope.clock.now();
    limits = rateLimitsFromHeaders(h, limitsAt);
  };
  try {
    const inner = observeResponses(observe, () =>
      streamSimple(request.model, request.context, {
        ...request.streamOptions,
        signal: abort.signal,
        maxRetries: sdkConnectionRetries,
      }),
    );
    let final: AssistantMessage | undefined;
    for await (const event of inner) {
      if (event.type === 'done') final = event.message;
      else if (event.type === 'error') final = event.error;
      else request.forward(event);
    }
    final ??= await inner.result();
    return { final, status, headers, limits, limitsAt, turnTimedOut };
  } finally {
    turnTimer.clear();
    abort.dispose();
  }
}
