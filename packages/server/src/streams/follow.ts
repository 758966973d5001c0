import type { SqlClient } from '@sluice/postgres/database';
import type { Clock } from 'sluice/concurrency';
import { isSettled, isFinal } from '../runs/states.js';
import { getRun, toApiRun, type RunRow } from '../runs/store.js';
import { expand, type StreamEvent } from './codec.js';
import type { EventFeed } from './feed.js';
import { isLastEvent, lacksLastEvent, lastEventOf } from './names.js';
import { eventsAfter, newestEvent } from './queries.js';

export interface FollowDeps {
  db: SqlClient;
  feed: EventFeed;
  clock: Clock;
  /** How long a reader waits for news before it looks anyway. */
  pollMs: () => number;
  /**
   * Marks the run watched (runs/watching.ts markWatched); readers of one run on a process
   * share the mark under way.
   */
  markWatched: (runId: string) => Promise<void>;
  /**
   * How long each wait lasts at most for `firstPollMs` after the reader marked the run watched
   * (one `pollMs` of the settings): a flush that began before the mark committed announces
   * nothing, and may land after the reader's reads.
   */
  firstPollMs: number;
  /**
   * How long after a run settled its stream may still lack its last event (or have a gap)
   * before the reader stops waiting for it: a run canceled while queued, or ended by a
   * process that died before its flush, has none stored, and the run row says how it ended.
   */
  graceMs: number;
}

/**
 * The events of a run after `after`, then as they are stored, until the event that ends its
 * stream. Ids are handed out in order without a gap while the run goes on (a flush of another
 * process may land after a later one). The last event of a run that settled without one
 * stored is made from its row, under the id after its newest stored event: every reader,
 * on every process, makes the same one.
 *
 * The reader first marks the run watched (runs/watching.ts), so that the process executing
 * it announces its events and its end by NOTIFY.
 */
export async function* followRun(
  deps: FollowDeps,
  tenant: string,
  runId: string,
  after: number,
  signal: AbortSignal,
): AsyncGenerator<StreamEvent> {
  let cursor = after;
  let settledAt: number | undefined;
  // Until the run is marked watched (a run found final needs no mark: nothing more will come).
  let shortUntil: number | undefined;
  while (!signal.aborted) {
    // The row first: a run seen final has its events stored already, the last one too when
    // its own process ended it (the statement that wrote the end stored them).
    let run = await getRun(deps.db, tenant, runId);
    if (!run) return;
    if (shortUntil === undefined && !isFinal(run.status)) {
      // The database is away when the mark fails: the reads say so.
      await deps.markWatched(runId).catch(() => undefined);
      shortUntil = deps.clock.now() + deps.pollMs();
      // Read again after the mark: what came before it is there, what comes after is announced.
      continue;
    }
    const rows = await eventsAfter(deps.db, runId, cursor);
    // The end was stored after the row was read: read it again for the answer the end carries.
    if (!isFinal(run.status) && rows.some((row) => row.events.some(([name]) => endsWithAnswer(name)))) {
      run = (await getRun(deps.db, tenant, runId)) ?? run;
    }
    const settled = isSettled(run.status);
    if (settled) settledAt ??= deps.clock.now();
    const lenient = settledAt !== undefined && deps.clock.now() - settledAt >= deps.graceMs;
    for (const event of unpack(rows, run, cursor)) {
      if (event.id <= cursor) continue;
      if (event.id !== cursor + 1 && !lenient) break;
      yield event;
      cursor = event.id;
      if (isLastEvent(event.event)) return;
    }
    if (settled) {
      const end = await lastOf(deps.db, run, cursor, lenient);
      if (end === 'done') return;
      if (end) {
        yield end;
        return;
      }
    }
    const left = settledAt === undefined ? Infinity : settledAt + deps.graceMs - deps.clock.now();
    // Short waits just after the mark, and for a settled run's last event (a pause's, or that of
    // a run ended elsewhere): the flush that writes it comes after the end took the run's mark
    // out, and announces nothing.
    const short = settledAt !== undefined || (shortUntil !== undefined && deps.clock.now() < shortUntil);
    const pollMs = short ? Math.min(deps.firstPollMs, deps.pollMs()) : deps.pollMs();
    await deps.feed.next(runId, Math.max(1, Math.min(pollMs, left)), signal);
  }
}

/**
 * For a settled run whose reader has nothing more to send: 'done' when its stream has ended
 * at or before `cursor`, the event to end it with once the grace is over, or undefined to
 * wait (a paused run's next events come when it is resumed).
 */
async function lastOf(
  db: SqlClient,
  run: RunRow,
  cursor: number,
  lenient: boolean,
): Promise<StreamEvent | 'done' | undefined> {
  const newest = await newestEvent(db, run.id);
  if (!lacksLastEvent(run.status, newest?.event)) {
    return isFinal(run.status) && cursor >= (newest?.id ?? 0) ? 'done' : undefined;
  }
  if (!lenient) return undefined;
  const id = (newest?.id ?? 0) + 1;
  if (cursor >= id) return 'done';
  return { id, event: lastEventOf(run.status), data: toApiRun(run) };
}

const endsWithAnswer = (name: string) => isLastEvent(name) && name !== 'run.requires_action';

/** The stored events after `cursor`, in id order. */
function unpack(rows: Awaited<ReturnType<typeof eventsAfter>>, run: RunRow, cursor: number): StreamEvent[] {
  const out: StreamEvent[] = [];
  for (const row of rows) {
    row.events.forEach((stored, i) => {
      const id = row.seq + i;
      if (id > cursor) out.push(expand(id, stored, run));
    });
  }
  return out.sort((a, b) => a.id - b.id);
}
