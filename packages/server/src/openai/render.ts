import type { RunRow } from '../runs/store.js';

/**
 * Runs shown as the OpenAI API's objects. A response (or chat completion) is a run: its id is
 * the run's id, so it is the same thing in the runs API, with its class and thread.
 */

/** What a run created through the Responses endpoint was asked with (stored with the run). */
export interface ResponseRequest {
  model: string;
  instructions: string | null;
  background: boolean;
  service_tier: string;
  previous_response_id: string | null;
}

type ResponseStatus = 'queued' | 'in_progress' | 'completed' | 'failed' | 'cancelled' | 'incomplete';

/** Failures that cut a run short rather than failing it: the Responses API calls those incomplete. */
const cutShort = new Set(['timeout', 'max_duration_exceeded', 'interrupted']);

export function responseStatus(run: RunRow): ResponseStatus {
  switch (run.status) {
    case 'scheduled':
    case 'queued':
      return 'queued';
    case 'running':
      return 'in_progress';
    // Paused for a person: it will not go on by itself, so it is not in progress. It goes on
    // (queued, then in progress) once resumed through the runs API.
    case 'requires_action':
      return 'incomplete';
    case 'succeeded':
      return 'completed';
    case 'canceled':
      return 'cancelled';
    case 'failed':
      return run.error && cutShort.has(run.error.type) ? 'incomplete' : 'failed';
  }
}

const textOf = (run: RunRow): string | undefined => {
  const output = run.output as { text?: unknown } | null | undefined;
  return typeof output?.text === 'string' ? output.text : undefined;
};

/**
 * Token counts as the OpenAI objects give them. The run's `input` leaves out prompt tokens read
 * from the provider's cache, its `totalTokens` counts them: the prompt is everything but the
 * output, the cached part is the difference, and the total adds up.
 */
function tokens(run: RunRow): { input: number; cached: number; output: number } | null {
  const usage = run.usage as { input?: unknown; output?: unknown; totalTokens?: unknown } | null;
  if (!usage) return null;
  const count = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? v : 0);
  const output = count(usage.output);
  const input = Math.max(count(usage.input), count(usage.totalTokens) - output);
  return { input, cached: input - count(usage.input), output };
}

/** The id of a run's one output message. */
export const messageIdOf = (runId: string) => `msg_${runId.slice(4)}`;

/** The message item of a response's answer, complete or (while streaming) with the text so far. */
export function outputMessage(runId: string, text: string, status: 'in_progress' | 'completed') {
  return {
    id: messageIdOf(runId),
    type: 'message' as const,
    status,
    role: 'assistant' as const,
    content:
      status === 'in_progress' && text === ''
        ? []
        : [{ type: 'output_text' as const, text, annotations: [], logprobs: [] }],
  };
}

/** Why a response is incomplete: the run's cut-short failure, or `requires_action` while it waits for a person. */
function incompleteDetails(run: RunRow, status: ResponseStatus): { reason: string } | null {
  if (status !== 'incomplete') return null;
  if (run.status === 'requires_action') return { reason: 'requires_action' };
  return run.error ? { reason: run.error.type } : null;
}

export function toResponse(run: RunRow) {
  const asked = (run.api_request ?? {}) as Partial<ResponseRequest>;
  const status = responseStatus(run);
  const text = textOf(run);
  const counts = tokens(run);
  return {
    id: run.id,
    object: 'response' as const,
    created_at: Math.floor(run.created_at),
    status,
    background: asked.background ?? false,
    completed_at: status === 'completed' && run.finished_at !== null ? Math.floor(run.finished_at) : null,
    error:
      status === 'failed' && run.error
        ? { code: 'server_error', message: `${run.error.type}: ${run.error.message}` }
        : null,
    incomplete_details: incompleteDetails(run, status),
    // What the person is asked, as the runs API shows it (the Responses API has no field of its own for it).
    ...(run.status === 'requires_action' && run.required_action
      ? { required_action: run.required_action }
      : {}),
    instructions: asked.instructions ?? null,
    metadata: (run.metadata as Record<string, unknown> | null) ?? {},
    model: asked.model ?? `agent:${run.agent}`,
    output: text === undefined ? [] : [outputMessage(run.id, text, 'completed')],
    output_text: text ?? '',
    parallel_tool_calls: true,
    previous_response_id: asked.previous_response_id ?? null,
    service_tier: asked.service_tier ?? (run.class === 'deferred' ? 'flex' : 'default'),
    store: true,
    temperature: null,
    text: { format: { type: 'text' } },
    tool_choice: 'auto',
    tools: [],
    top_p: null,
    truncation: 'disabled',
    // Absent rather than null until there is usage: the client types it as an object or nothing.
    ...(counts && {
      usage: {
        input_tokens: counts.input,
        input_tokens_details: { cached_tokens: counts.cached },
        output_tokens: counts.output,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: counts.input + counts.output,
      },
    }),
  };
}
export type ApiResponse = ReturnType<typeof toResponse>;

export function toChatCompletion(run: RunRow, model: string) {
  const counts = tokens(run);
  const text = textOf(run);
  return {
    id: run.id,
    object: 'chat.completion' as const,
    created: Math.floor(run.created_at),
    model,
    choices:
      text === undefined
        ? []
        : [
            {
              index: 0,
              message: { role: 'assistant' as const, content: text, refusal: null, annotations: [] },
              finish_reason: 'stop' as const,
              logprobs: null,
            },
          ],
    usage: counts && {
      prompt_tokens: counts.input,
      completion_tokens: counts.output,
      total_tokens: counts.input + counts.output,
      prompt_tokens_details: { cached_tokens: counts.cached },
    },
    service_tier: run.class === 'deferred' ? 'flex' : 'default',
    system_fingerprint: null,
  };
}
