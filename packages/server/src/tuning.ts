import { HOUR, MINUTE, SECOND } from './units.js';

/**
 * The server's internal tunables: fixed here, not settings (the defaults a deployment may
 * change are `settingDefaults` in settings.ts). Each says why it has its value.
 */
export const tuning = Object.freeze({
  /** How often a process looks at its own running runs for cancels and losses (NOTIFY usually comes first). */
  watchMs: 500,
  /** How often an idle queue worker looks for work when no notification came. */
  idlePollMs: 500,
  /**
   * On a store no other process writes (Store.solo: embedded PGlite), the polls that stand in
   * for other processes' work are this many times further apart: the idle workers' poll, the
   * callback outbox's and the idle promotion pass. Every change there is this process's own and
   * notifies it; and each poll's statement holds the event loop, which PGlite runs on, stalling
   * every request in flight (a gateway's above all).
   */
  soloPollFactor: 10,
  /** A queue worker whose claims fail backs off to at most this (with jitter), not to silence. */
  maxClaimBackoffMs: 10 * SECOND,
  /** Writing a run's end while the database is away: first retry after this, doubling... */
  persistRetryMs: 100,
  /** ...to at most this, until peers would declare the run lost. */
  maxPersistRetryMs: 2 * SECOND,
  /** How often due scheduled runs are moved to their queues: a quarter second late at most... */
  promoteMs: 250,
  /**
   * ...while any run waits for its time. With none, a pass every this long: a run scheduled on
   * this process brings the next pass forward at once, one scheduled on another is promoted by
   * that process (or by this one this late, if that one died).
   */
  promoteIdleMs: 2 * SECOND,
  /**
   * A heartbeat this late (or half the stale time, when that is longer) stops this process's
   * claims and makes it not ready: short enough that a heartbeat held by a stalled connection
   * stops claims long before peers declare the process lost at the default stale time (20 s),
   * long enough that an event loop held up on a loaded machine does not.
   */
  heartbeatLateFloorMs: 2 * SECOND,
  /** How long after its start a run of this process may still be on its way into the executor. */
  orphanGraceMs: 10 * SECOND,
  /** How often a caller waiting for a busy thread tries it again when no notification came. */
  threadRetryMs: 1 * SECOND,
  /** How long a WebSocket may go without answering a ping before it is dropped (its places freed). */
  wsPingEveryMs: 30 * SECOND,
  /** How often old schedule ticks are pruned, and how long they are kept (webhook replays look them up). */
  pruneTicksEveryMs: 1 * HOUR,
  keepTicksMs: 7 * 24 * HOUR,
  /** How often nodes that stopped heartbeating long ago are removed from the node table. */
  pruneNodesEveryMs: 1 * HOUR,
  /**
   * A session idle inside a transaction is ended by PostgreSQL after two thirds of the statement
   * timeout, this at least: a client gone silent mid-transaction (a stalled connection) frees its
   * locks before peers waiting on them reach their own lock timeout (the statement timeout), and
   * an event loop held up for a few seconds between two statements does not lose its transaction.
   */
  idleInTransactionFloorMs: 5 * SECOND,
  /** An idle socket is closed after the longest held call plus this. */
  heldSocketSlackMs: 1 * MINUTE,
  /** A server started beside its database (compose, a pod) keeps trying to reach it this long. */
  storeConnectGiveUpMs: 1 * MINUTE,
  /** Admissions one transaction takes at most: one INSERT of this many rows stays a short statement. */
  admissionBatch: 128,
  /**
   * How often a process sets a tenant's counters to the true counts (under the lock, before a
   * batch), and how often upkeep looks for deferred running counts that drifted
   * (runs/admission-counts.ts reconcileDrifted): a counter that drifted heals in a minute.
   */
  admissionReconcileMs: 1 * MINUTE,
  /** Rows one pass of upkeep (promotion, expiry) moves at most, so a pass stays a short transaction. */
  upkeepBatch: 500,
  /**
   * How long a run's event may wait in memory before it is stored: the deltas of that span go
   * in one row and one INSERT. Readers on other processes lag by about this much.
   */
  streamFlushMs: 25,
  /** Events gathered (of all runs of a process) that are written at once instead. */
  streamFlushEvents: 256,
  /** Events a process keeps while the database is away; past it the oldest are dropped. */
  streamMaxPendingEvents: 50_000,
  /** How often a reader of a run's events looks on its own while NOTIFY arrives... */
  streamPollMs: 2 * SECOND,
  /** ...and while it does not (no LISTEN session: a transaction pooler, a restarted database). */
  streamPollUnheardMs: 250,
  /** How long a settled run's stream may lack its last event before a reader makes it from the row. */
  streamGraceMs: 1 * SECOND,
  /** How often upkeep deletes the events of runs past SLUICE_STREAM_RETENTION_MS. */
  pruneStreamsEveryMs: 30 * SECOND,
  /**
   * How often upkeep deletes gateway_usage rows older than the longest quota period (a month):
   * each statement reads at most upkeepBatch rows, and a pass goes on while they are all old (a
   * row is needed only while a window holds it).
   */
  pruneGatewayUsageEveryMs: 10 * MINUTE,
});
