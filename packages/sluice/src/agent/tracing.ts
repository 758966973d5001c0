import {
  context,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Span,
} from '@opentelemetry/api';
import type { AssistantMessage } from '@mariozechner/pi-ai';
import type { RunUsage } from './results.js';

/**
 * Spans of a run, through `@opentelemetry/api` only: without an SDK registered in the process
 * every call below is the API's no-op, so the runtime costs nothing more and loads nothing else.
 * With one, a run is drawn as
 *
 *   sluice.agent.run
 *     └ sluice.turn                  one per assistant turn
 *         ├ sluice.provider.request  one per attempt; `sluice.slot_wait_ms` is its slot wait
 *         └ sluice.tool.call         name, call id, outcome; a child agent's run nests here
 *
 * The parents are passed explicitly, not read from the active context: pi-agent-core calls the
 * stream function and the tools from its own loop, whose async context is the run's, never the
 * turn's. Spans carry identifiers, names, counts and times, never a prompt, an answer or a tool's
 * arguments, and a failure is recorded by its error's name only (a provider's message may quote
 * the input).
 */
const tracer = trace.getTracer('sluice');

/** The `error.type` of a failure: its class name, never its message. */
function errorType(error: unknown): string {
  if (error instanceof Error) return error.name;
  return typeof error;
}

function fail(span: Span, error: unknown): void {
  const type = errorType(error);
  span.setAttribute('error.type', type);
  span.setStatus({ code: SpanStatusCode.ERROR, message: type });
}

/** What a run's span is named after; the prompt is not among it. */
export interface RunTraceInit {
  readonly runId: string;
  readonly rootRunId: string;
  readonly parentRunId: string | undefined;
  readonly limiter: string | undefined;
  readonly workload: string | undefined;
  readonly model: { readonly provider: string; readonly id: string };
}

/** The spans of one attempt at a provider request. */
export interface RequestTrace {
  /** The context to send the request in, so an instrumented HTTP client nests its spans here. */
  readonly context: Context;
  slotWaited(ms: number): void;
  answered(message: AssistantMessage, status: number | undefined): void;
  end(): void;
}

/** The spans of one run: its own, the open turn's, and the requests and tool calls under it. */
export class RunTrace {
  readonly #span: Span;
  readonly #context: Context;
  readonly #model: RunTraceInit['model'];
  readonly #common: Attributes;
  #turn: { span: Span; context: Context } | undefined;
  #turns = 0;

  /** Opens the run's span under the caller's active span (a server's run, a parent's tool call). */
  constructor(init: RunTraceInit) {
    this.#model = init.model;
    this.#common = {
      'sluice.limiter': init.limiter ?? 'none',
      ...(init.workload === undefined ? {} : { 'sluice.workload': init.workload }),
    };
    this.#span = tracer.startSpan('sluice.agent.run', {
      kind: SpanKind.INTERNAL,
      attributes: {
        'sluice.agent.run_id': init.runId,
        'sluice.agent.root_run_id': init.rootRunId,
        ...(init.parentRunId === undefined ? {} : { 'sluice.agent.parent_run_id': init.parentRunId }),
        'gen_ai.system': init.model.provider,
        'gen_ai.request.model': init.model.id,
        ...this.#common,
      },
    });
    this.#context = trace.setSpan(context.active(), this.#span);
  }

  /** The open turn's context, else the run's: where a request or a tool call hangs. */
  get #current(): Context {
    return this.#turn?.context ?? this.#context;
  }

  turnStarted(): void {
    this.#endTurn(undefined);
    const span = tracer.startSpan(
      'sluice.turn',
      { attributes: { 'sluice.turn.index': this.#turns++ } },
      this.#context,
    );
    this.#turn = { span, context: trace.setSpan(this.#context, span) };
  }

  turnEnded(message: AssistantMessage | undefined): void {
    this.#endTurn(message);
  }

  #endTurn(message: AssistantMessage | undefined): void {
    const turn = this.#turn;
    if (!turn) return;
    this.#turn = undefined;
    if (message) {
      turn.span.setAttribute('sluice.stop_reason', message.stopReason);
      if (message.stopReason === 'error') turn.span.setStatus({ code: SpanStatusCode.ERROR });
    }
    turn.span.end();
  }

  /** Opens an attempt's span, before its slot is asked for, so the wait is inside it. */
  startRequest(requestId: string, attempt: number): RequestTrace {
    const span = tracer.startSpan(
      'sluice.provider.request',
      {
        kind: SpanKind.CLIENT,
        attributes: {
          'sluice.request_id': requestId,
          'sluice.attempt': attempt,
          'gen_ai.system': this.#model.provider,
          'gen_ai.request.model': this.#model.id,
          ...this.#common,
        },
      },
      this.#current,
    );
    return {
      context: trace.setSpan(this.#current, span),
      slotWaited: (ms) => span.setAttribute('sluice.slot_wait_ms', ms),
      answered: (message, status) => {
        span.setAttribute('sluice.stop_reason', message.stopReason);
        if (status !== undefined) span.setAttribute('http.response.status_code', status);
        if (message.usage) {
          span.setAttribute('gen_ai.usage.input_tokens', message.usage.input);
          span.setAttribute('gen_ai.usage.output_tokens', message.usage.output);
        }
        if (message.stopReason === 'error') span.setStatus({ code: SpanStatusCode.ERROR });
      },
      end: () => span.end(),
    };
  }

  /**
   * Runs one tool call inside its span, so a child agent started by the tool nests under it.
   * The outcome is `ok`, `error`, or `cancelled` when the run was cancelled meanwhile.
   */
  async toolCall<T>(
    name: string,
    callId: string,
    cancelled: () => boolean,
    call: () => Promise<T>,
  ): Promise<T> {
    const span = tracer.startSpan(
      'sluice.tool.call',
      { attributes: { 'sluice.tool.name': name, 'sluice.tool.call_id': callId } },
      this.#current,
    );
    try {
      const value = await context.with(trace.setSpan(this.#current, span), call);
      span.setAttribute('sluice.tool.outcome', 'ok');
      return value;
    } catch (error) {
      span.setAttribute('sluice.tool.outcome', cancelled() ? 'cancelled' : 'error');
      fail(span, error);
      throw error;
    } finally {
      span.end();
    }
  }

  /** Closes the run's span (and a turn left open by a failure). */
  end(outcome: { error: unknown } | RunUsage): void {
    this.#endTurn(undefined);
    this.#span.setAttribute('sluice.turns', this.#turns);
    if ('error' in outcome) fail(this.#span, outcome.error);
    else {
      this.#span.setAttribute('sluice.requests', outcome.requests);
      this.#span.setAttribute('gen_ai.usage.total_tokens', outcome.totalTokens);
    }
    this.#span.end();
  }
}
