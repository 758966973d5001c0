import type { Database } from '@sluice/postgres/database';
import { dropNewThread, keepOpenedThread, type NewThread } from '../threads/store.js';
import type { Executor } from './executor.js';
import { RunRefusedError } from './refused.js';
import type { RunRow } from './store.js';

// The thread a front makes for a request (AG-UI's first use of a client's thread id, a
// Responses chain's first follow-up): removed when the request is refused, opened again when
// another request's refusal removed it under this one. Used by submission.ts.

/**
 * Runs a request's admission; when it throws (a refusal, bad input), the thread the front
 * created for the request is removed before the error goes on. The one place every front's
 * refusal undoes what the front created.
 */
export async function undoingThread<T>(
  deps: { db: Database },
  request: { newThread?: NewThread },
  admit: () => Promise<T>,
): Promise<T> {
  try {
    return await admit();
  } catch (error) {
    if (request.newThread) await dropNewThread(deps.db, request.newThread).catch(() => undefined);
    throw error;
  }
}

/** A thread a front opens for a request: `created` when opening it made it (see `RunRequest.newThread`). */
export interface OpenedThread {
  id: string;
  created?: NewThread;
  /** Set by `onOpenedThread` on a thread this request found made: opens it again (`RunRequest.reopenThread`). */
  reopen?: () => Promise<OpenedThread | undefined>;
}

/** How often a request whose thread another request's refusal removed opens it again. */
const REOPENS = 3;

/**
 * Submits a request on a thread the front opens itself (AG-UI's first use of a client's thread
 * id, a Responses chain's first follow-up). Two such requests can come at once: the one that
 * made the thread removes it when it is refused (`undoingThread`), and the other, which found it
 * made, would then be told its thread is missing (a 404 for a thread id the client never sent).
 * So when the thread this request did not make is gone before its run took it, the thread is
 * opened again (made anew, by this request now) and the request goes on: an accepted request
 * never fails because another was refused. `open` gives undefined for a request with no thread.
 */
export async function onOpenedThread<T>(
  open: () => Promise<OpenedThread | undefined>,
  submit: (thread: OpenedThread | undefined) => Promise<T>,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    const opened = await open();
    const thread = opened && opened.created === undefined ? { ...opened, reopen: open } : opened;
    try {
      return await submit(thread);
    } catch (error) {
      const removed =
        thread !== undefined &&
        thread.created === undefined &&
        error instanceof RunRefusedError &&
        error.refusal.kind === 'thread_missing' &&
        error.refusal.threadId === thread.id;
      if (!removed || attempt >= REOPENS) throw error;
    }
  }
}

/**
 * A queued run admitted on a thread its request found made by another request: when that
 * request's refusal removed the thread meanwhile, the run is moved to the thread opened again
 * (see `keepOpenedThread`), else it would stay queued on a thread no claim can take.
 */
export async function keptOnThread(
  deps: { db: Database; executor: Pick<Executor, 'notify'> },
  request: { reopenThread?: () => Promise<OpenedThread | undefined> },
  run: RunRow,
): Promise<RunRow> {
  if (request.reopenThread === undefined || run.thread_id === null) return run;
  const threadId = await keepOpenedThread(deps.db, run.id, run.thread_id, request.reopenThread);
  if (threadId === run.thread_id) return run;
  deps.executor.notify(run.class);
  return { ...run, thread_id: threadId ?? null };
}
