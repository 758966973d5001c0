import { randomUUID } from 'node:crypto';
import {
  isContextOverflow,
  type Api,
  type AssistantMessage,
  type AssistantMessageEvent,
  type Context,
  type Model,
  type SimpleStreamOptions,
} from '@mariozechner/pi-ai';
import { ConcurrencyError, TurnError } from '../concurrency/errors.js';
import type { HeldSlot } from '../concurrency/slot.js';
import type { Credential } from '../models/model.js';
import { assistantMessage } from './conversation.js';
import type { ResolvedRuntimeOptions } from './options.js';
import { sendOnSlot, waitForSlot, type Attempt } from './provider-attempt.js';
import { decideRetry } from './retry.js';
import { runFields, type RunScope } from './scope.js';
import { requestTokens } from './token-estimate.js';
import { sleep } from './signals.js';

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
  const request = new TurnRequest(options, model, context, streamOptions, onEvent);
  try {
    return await request.send();
  } catch (error) {
    return request.failed(asError(error));
  }
}

/**
 * One turn's request through its attempts. Each attempt ends in an outcome (an answer, a
 * cancellation, a failure) or in a reason to send again: a compacted context after an
 * overflow, the next credential, or a retry after its wait.
 */
class TurnRequest {
  readonly #options: ProviderRequestOptions;
  readonly #scope: RunScope;
  readonly #model: Model<Api>;
  readonly #streamOptions: SimpleStreamOptions | undefined;
  readonly #onEvent: (event: AssistantMessageEvent) => void;
  #context: Context;
  #sent = 0;
  #credential = 0;
  #retries = 0;
  #compacted = false;
  /** A retry starts a new response, but the loop already has the first one's start. */
  #started = false;

  constructor(
    options: ProviderRequestOptions,
    model: Model<Api>,
    context: Context,
    streamOptions: SimpleStreamOptions | undefined,
    onEvent: (event: AssistantMessageEvent) => void,
  ) {
    this.#options = options;
    this.#scope = options.scope;
    this.#model = model;
    this.#context = context;
    this.#streamOptions = streamOptions;
    this.#onEvent = onEvent;
  }

  async send(): Promise<ProviderOutcome> {
    for (;;) {
      if (this.#scope.signal.aborted) return this.#cancelled();
      const ended = await this.#attempt();
      if ('outcome' in ended) return ended.outcome;
      const outcome = await this.#afterFailure(ended.attempt, ended.requestId, ended.slot);
      if (outcome) return outcome;
    }
  }

  /** One attempt: its slot, its request, and the slot given back. */
  async #attempt(): Promise<
    { outcome: ProviderOutcome } | { attempt: Attempt; requestId: string; slot: HeldSlot<string> | undefined }
  > {
    const scope = this.#scope;
    const requestId = randomUUID();
    const span = scope.trace.startRequest(requestId, this.#sent);
    let slot: HeldSlot<string> | undefined;
    try {
      // Estimated only when a limiter will charge it.
      const tokens = scope.limiter
        ? requestTokens(this.#context, this.#model, this.#streamOptions, scope.outputTokens)
        : undefined;
      slot = await waitForSlot(scope, requestId, span, tokens);
    } catch (error) {
      span.end();
      // The provider is never called after a concurrency failure. A budget that ran out
      // during the wait is one too: acquireSlot reports it as a timeout.
      if (error instanceof ConcurrencyError || !scope.signal.aborted)
        return { outcome: this.failed(asError(error)) };
      return { outcome: this.#cancelled() };
    }
    this.#sent++;
    const apiKey = this.#options.credentials[this.#credential]?.apiKey ?? this.#streamOptions?.apiKey;
    const attempt = await sendOnSlot(
      {
        scope,
        model: this.#model,
        context: this.#context,
        streamOptions: { ...this.#streamOptions, apiKey },
        turnTimeoutMs: this.#options.turnTimeoutMs,
        forward: this.#forward,
      },
      slot,
      span,
    );
    const { final } = attempt;
    if (final.stopReason !== 'error' && final.stopReason !== 'aborted') {
      return { outcome: { message: final, sent: this.#sent } };
    }
    return { attempt, requestId, slot };
  }

  /** After a failed or cancelled attempt: the outcome, or undefined to send again. */
  async #afterFailure(
    attempt: Attempt,
    requestId: string,
    slot: HeldSlot<string> | undefined,
  ): Promise<ProviderOutcome | undefined> {
    const { final } = attempt;
    const scope = this.#scope;
    if (slot?.signal.aborted) return this.failed(slot.signal.reason as Error, final);
    if (scope.signal.aborted) return this.#cancelled(final);
    if (attempt.turnTimedOut) {
      const error = new TurnError(
        `Provider request took longer than turnTimeoutMs (${this.#options.turnTimeoutMs} ms)`,
        { ...runFields(scope, requestId), retryable: false },
      );
      return this.failed(error, final);
    }
    if (!this.#compacted && this.#options.onOverflow && isContextOverflow(final, this.#model.contextWindow)) {
      // Once per turn: summarise and send again, as a new request with a new slot.
      this.#compacted = true;
      try {
        this.#context = await this.#options.onOverflow(this.#context);
      } catch (error) {
        return this.failed(error as Error, final);
      }
      return undefined;
    }
    return this.#retryOrFail(attempt, requestId);
  }

  /** What the retry policy says of a failed attempt: move on, wait and retry, or fail. */
  async #retryOrFail(attempt: Attempt, requestId: string): Promise<ProviderOutcome | undefined> {
    const { final } = attempt;
    const scope = this.#scope;
    const decision = decideRetry(
      { text: final.errorMessage ?? 'provider error', status: attempt.status, headers: attempt.headers },
      {
        retries: this.#retries,
        credential: this.#credential,
        credentials: this.#options.credentials.length,
        now: scope.clock.now(),
        deadline: scope.deadline,
        random: Math.random(),
      },
      this.#options.retry,
    );
    switch (decision.kind) {
      case 'next-credential':
        this.#credential++;
        return undefined;
      case 'fail':
        return this.failed(
          new TurnError(decision.message, {
            ...runFields(scope, requestId),
            status: decision.status,
            retryable: decision.retryable,
          }),
          final,
        );
      case 'retry':
        this.#retries++;
        if (decision.delayMs > 0) {
          try {
            await sleep(scope.clock, decision.delayMs, scope.signal);
          } catch {
            return this.#cancelled(final);
          }
        }
        return undefined;
      default:
        return decision satisfies never;
    }
  }

  readonly #forward = (event: AssistantMessageEvent): void => {
    if (event.type === 'start') {
      if (this.#started) return;
      this.#started = true;
    }
    this.#onEvent(event);
  };

  /** The outcome of a failed request, on the attempt's message when there was one. */
  failed(failure: Error, base?: AssistantMessage): ProviderOutcome {
    return {
      message: { ...this.#base(base), stopReason: 'error', errorMessage: failure.message },
      failure,
      sent: this.#sent,
    };
  }

  #cancelled(base?: AssistantMessage): ProviderOutcome {
    return {
      message: {
        ...this.#base(base),
        stopReason: 'aborted',
        errorMessage: String(this.#scope.signal.reason),
      },
      sent: this.#sent,
    };
  }

  #base(base: AssistantMessage | undefined): AssistantMessage {
    return base ?? assistantMessage(this.#model, [], this.#scope.clock.now());
  }
}

function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error));
}
