import { isFinal, type RunStatus } from '../runs/states.js';

/** The events of a run, under their stream names (Server-Sent Events, WebSocket frames, the store). */
export type RunStreamEvent =
  'run.created' | 'run.started' | 'message.delta' | 'tool.started' | 'tool.completed' | LastEvent;

// A run that pauses for approvals ends its stream too: `run.requires_action` carries the
// pending calls, and the rest of the run is had by resuming it.
const lastEvents = {
  succeeded: 'run.completed',
  failed: 'run.failed',
  canceled: 'run.canceled',
  requires_action: 'run.requires_action',
} as const;

/** An event that ends a stream. */
export type LastEvent = (typeof lastEvents)[keyof typeof lastEvents];

const lastNames = new Set<string>(Object.values(lastEvents));
const runShaped = new Set<string>(['run.created', 'run.started', ...lastNames]);

/** The event that ends a stream of a run in `status`; `run.failed` for a run whose end is unknown. */
export const lastEventOf = (status: RunStatus | string): LastEvent =>
  lastEvents[status as keyof typeof lastEvents] ?? 'run.failed';

export const isLastEvent = (event: string): event is LastEvent => lastNames.has(event);

/** Events whose data is the run document (the others carry `run_id` and their own fields). */
export const isRunShaped = (event: string): boolean => runShaped.has(event);

/**
 * Whether a stream whose newest event is `newest` still lacks the event that ends it, for a run
 * that now stands in `status`: a final run ends with a final event (a run canceled while paused
 * has `run.requires_action` before its `run.canceled`), a paused one with `run.requires_action`.
 */
export function lacksLastEvent(status: RunStatus, newest: string | undefined): boolean {
  if (isFinal(status))
    return newest === undefined || !isLastEvent(newest) || newest === 'run.requires_action';
  if (status === 'requires_action') return newest !== 'run.requires_action';
  return false;
}
