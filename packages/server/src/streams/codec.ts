import type { RunRow } from '../runs/store.js';
import { isLastEvent, isRunShaped, type RunStreamEvent } from './names.js';

/** One event of a run as a stream carries it: `id` orders the run's events from 1 (`run.created`). */
export interface StreamEvent {
  id: number;
  event: RunStreamEvent;
  data: Record<string, unknown>;
}

/** An event as stored: [name, data], its id given by its place in the row (see sql/018_run_events.sql). */
export type StoredEvent = [RunStreamEvent, Record<string, unknown>];

/**
 * What is kept of an event: the run document without `input` and `output` (the run row holds
 * them, and an input may be megabytes), the other events without `run_id`. `expand` puts back
 * what was left out, so a replayed event is the one the live stream sent.
 */
export function compact(event: RunStreamEvent, data: Record<string, unknown>): StoredEvent {
  if (isRunShaped(event)) {
    const { input: _input, output: _output, ...rest } = data;
    return [event, rest];
  }
  const { run_id: _runId, ...rest } = data;
  return [event, rest];
}

/** An event read back, for `run` (a full row: input and output). */
export function expand(id: number, stored: StoredEvent, run: RunRow): StreamEvent {
  const [event, data] = stored;
  if (!isRunShaped(event)) return { id, event, data: { run_id: run.id, ...data } };
  const { id: runId, object, agent, class: runClass, status, ...rest } = data;
  // The answer is there once the run ended; a started or paused run has none yet.
  const output = isLastEvent(event) && event !== 'run.requires_action' ? (run.output ?? null) : null;
  return {
    id,
    event,
    data: { id: runId, object, agent, class: runClass, status, input: run.input, output, ...rest },
  };
}
