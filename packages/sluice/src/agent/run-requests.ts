import type { StreamFn } from '@mariozechner/pi-agent-core';
import {
  createAssistantMessageEventStream,
  type Api,
  type AssistantMessage,
  type Context,
  type Model,
  type TextContent,
} from '@mariozechner/pi-ai';
import {
  sendProviderRequest,
  type ProviderOutcome,
  type ProviderRequestOptions,
} from './provider-request.js';

/** The text of an assistant message. */
export function textOf(message: AssistantMessage | undefined): string {
  if (!message) return '';
  return message.content
    .filter((c): c is TextContent => c.type === 'text')
    .map((c) => c.text)
    .join('');
}

/**
 * The provider requests of one run: the stream function pi-agent-core calls once per turn, and
 * the requests whose answer the run uses itself (summaries). It keeps what they add up to:
 * the requests sent and the failure of the turn that ended the run, taken from each request's
 * outcome, the one place a failure is reported.
 */
export class RunRequests {
  readonly #options: ProviderRequestOptions;
  #sent = 0;
  #failure: Error | undefined;

  constructor(options: ProviderRequestOptions) {
    this.#options = options;
  }

  /** Provider requests sent so far, retries, credential moves and summaries included. */
  get sent(): number {
    return this.#sent;
  }

  /** Why the turn that ended the run failed; undefined when no turn failed. */
  get failure(): Error | undefined {
    return this.#failure;
  }

  /** The stream function for pi-agent-core's loop: one turn, its events as they come. */
  readonly stream: StreamFn = (model, context, streamOptions) => {
    const out = createAssistantMessageEventStream();
    void sendProviderRequest(this.#options, model, context, streamOptions, (event) => out.push(event)).then(
      (outcome) => {
        this.#count(outcome);
        // The loop stops after the first failed turn, so there is only ever one.
        this.#failure ??= outcome.failure;
        const { message } = outcome;
        out.push(
          message.stopReason === 'error' || message.stopReason === 'aborted'
            ? { type: 'error', reason: message.stopReason, error: message }
            : { type: 'done', reason: message.stopReason, message },
        );
        out.end(message);
      },
    );
    return out;
  };

  /** Sends a request whose text the run uses itself; throws its failure, or the run's cancellation. */
  async text(model: Model<Api>, context: Context): Promise<string> {
    const outcome = await sendProviderRequest(this.#options, model, context, undefined);
    this.#count(outcome);
    if (outcome.failure) throw outcome.failure;
    if (outcome.message.stopReason === 'aborted') throw this.#options.scope.signal.reason;
    return textOf(outcome.message);
  }

  #count(outcome: ProviderOutcome): void {
    this.#sent += outcome.sent;
  }
}
