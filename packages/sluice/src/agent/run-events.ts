import type { AgentEvent } from '@mariozechner/pi-agent-core';
import type { ConcurrencyEventListener } from '../concurrency/events.js';
import { fail } from './options.js';

/**
 * A tool call of a run starting (with the arguments the model gave), and ending (`isError` when
 * it threw, timed out or was refused; `result`: the text of its result, cut to 4,000 characters).
 */
export type ToolEvent =
  | { type: 'started'; toolCallId: string; name: string; args: unknown }
  | { type: 'completed'; toolCallId: string; name: string; isError: boolean; result: string };

/** Characters of a tool's result text a `completed` event carries: enough to show, not a payload. */
const RESULT_TEXT_CHARS = 4_000;

/** The text parts of a tool result (`{ content: [{ type: 'text', text }] }`), joined and cut. */
function resultText(result: unknown): string {
  const content = (result as { content?: unknown } | null | undefined)?.content;
  if (!Array.isArray(content)) return '';
  const text = content
    .filter((c): c is { type: 'text'; text: string } => c?.type === 'text' && typeof c.text === 'string')
    .map((c) => c.text)
    .join('');
  return text.length > RESULT_TEXT_CHARS ? text.slice(0, RESULT_TEXT_CHARS) : text;
}

/** What a caller can hear of one run. */
export interface RunEvents {
  onConcurrency?: ConcurrencyEventListener;
  /** Each text delta of every assistant turn, as it streams (what `stream()` yields). */
  onText?: (delta: string) => void;
  /** A tool call of this run starting and ending (not those of child agents). */
  onTool?: (event: ToolEvent) => void;
}

/** Checks `events` before the run starts, so a misspelt listener is not silently never called. */
export function checkRunEvents(events: unknown): RunEvents {
  if (events === undefined) return {};
  if (typeof events !== 'object' || events === null || Array.isArray(events))
    fail('events', 'an object', events);
  for (const key of ['onConcurrency', 'onText', 'onTool'] as const) {
    const listener = (events as Record<string, unknown>)[key];
    if (listener !== undefined && typeof listener !== 'function')
      fail(`events.${key}`, 'a function', listener);
  }
  return events as RunEvents;
}

/** Calls a listener; what it throws is dropped, as a listener cannot break a run. */
function tell<T>(listener: ((value: T) => void) | undefined, value: T): void {
  if (!listener) return;
  try {
    listener(value);
  } catch {
    // ignored on purpose
  }
}

/**
 * Passes the loop's events on to a run's listeners: text deltas to `onText` (and to the
 * `stream()` queue, when there is one), tool calls to `onTool`. It sees only the events of the
 * run's own loop; a child agent's run has its own loop and its own listeners.
 */
export function forwardRunEvents(
  events: RunEvents,
  streamText: ((delta: string) => void) | undefined,
): (event: AgentEvent) => void {
  return (event) => {
    switch (event.type) {
      case 'message_update':
        if (event.assistantMessageEvent.type === 'text_delta') {
          const { delta } = event.assistantMessageEvent;
          streamText?.(delta);
          tell(events.onText, delta);
        }
        return;
      case 'tool_execution_start':
        tell(events.onTool, {
          type: 'started',
          toolCallId: event.toolCallId,
          name: event.toolName,
          args: event.args as unknown,
        });
        return;
      case 'tool_execution_end':
        tell(events.onTool, {
          type: 'completed',
          toolCallId: event.toolCallId,
          name: event.toolName,
          isError: event.isError,
          result: resultText(event.result),
        });
        return;
      default:
        return;
    }
  };
}
