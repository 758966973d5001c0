import type { Database, SqlClient } from '@sluice/postgres/database';
import { systemClock, type Clock } from 'sluice/concurrency';
import type { Principal } from '../store/tokens.js';
import { tuning } from '../tuning.js';
import type { TenantLimits } from './policy.js';
import { MIN_SPAN_MS } from './retry-after.js';
import {
  decideByCounts,
  highestCounts,
  lockTenantAdmission,
  quotaUse,
  spendFigures,
  Tally,
  type SpendFigures,
} from './admission-counts.js';
import {
  decidedByCounts,
  existingLine,
  isHeld,
  lineOf,
  observe,
  withEstimate,
  type Admission,
  type Line,
  type Pending,
  type WithRun,
} from './admission-line.js';
import { errorFor, settledTransaction } from './admission-settle.js';
import { admitDecided, insertRuns } from './lifecycle.js';
import { newRunId, readCounters, reconcileCounters, type AdmissionCounters, type NewRun } from './store.js';
import type { Refusal } from './refusal.js';
import { inTurn } from './turns.js';

export type { Refusal } from './refusal.js';

export type { Admission, WithRun } from './admission-line.js';

/*
 * How admission stays exact and cheap. Figures: `npm run bench:server`, PostgreSQL 15, 32
 * clients, one tenant, requests/s as a fraction of a bare Fastify route's measured in the same
 * alternating rounds (the load generator shares the process, so its cost is on both sides).
 *
 *   Earlier session, 2-core box shared with other work (load 21 to 34):  admitted   refused
 *   lock and count per request (BEGIN, advisory lock, count(*) of the      0.16       0.38
 *   tenant's runs, INSERT, COMMIT; 0.13 and 0.37 on a quiet box)
 *   counter rows, one admission per transaction                            0.17       0.56
 *   counter rows, batches per tenant, refusals from a plain read           0.37       0.51
 *
 *   This code's steps, one full run each on a quiet box (load about 2):
 *   batches per tenant, but each caller waited for a turn of its own       0.17       0.71
 *   (batches of 1.8 runs; 38 of the 48 ms a caller waited were spent
 *   behind turns whose runs were long decided)
 *   one turn asked for at a time, taking every run waiting                 0.45       0.68
 *   + a batch the plain read decides is written by one statement           0.59       0.74
 *   + the requests of one event-loop turn gather into a batch, no          0.60       0.85
 *   AbortController or promise per request where none is needed, the      0.62       0.82
 *   statement inside BEGIN/COMMIT (this code; three runs)                  0.55       0.83
 *
 * The cost was never the count: it was a round trip (and a commit) per admission, and on this
 * machine's VM every round trip to the database costs the process about 100 µs in the system
 * call that wakes PostgreSQL. So a process gathers a tenant's admissions into batches (see
 * askTurn) and reads the counters once per batch, without a lock. A request whose cap is full
 * in that read is refused from it: the read started after the request arrived and the cap was
 * full at that moment, which is all a refusal claims. When the counts alone decide the whole
 * batch, it is decided from the same read and written by `sluice_admit`
 * (sql/034_admission_alone.sql): one statement sent on its own that takes the tenant's lock,
 * checks that no count has risen past what the batch allows, inserts and commits. Otherwise (a
 * quota, a spend limit, a held run's thread, a write beside the run, a count that rose, a
 * reconcile due) the batch is decided under the lock in a transaction. The counters are kept by
 * a trigger in the same transaction as every change of a run's status, so under the tenant's
 * admission lock (which promotion also takes) they are the true counts, and the cap is exact
 * across processes.
 *
 * When the process expects a batch's counts to fit (what the last read of the counters said,
 * plus what this process admitted since: `Line.expected`), the batch skips the read and goes
 * straight to that statement; when a count rose, nothing is written and the batch goes the way
 * above. The read that feeds the Retry-After history is then made beside the request, at most
 * once a second, not before it. A held run (streamed or inline: its caller waits for the first
 * text) so takes one round trip before its provider request.
 *
 * A statement sent alone commits whether or not its answer comes back. Until sql/034 a queued
 * batch's statement ran inside BEGIN ... COMMIT for that reason: a connection cut while the
 * statement waited for the lock rolled it back, where alone it would commit a run whose caller
 * was told "failed" and would try again. Now a lost answer is settled before anything is
 * answered (runs/admission-settle.ts): the batch is fenced so that a statement still waiting
 * writes nothing, and what it wrote is read. The transaction cost two round trips more and held
 * the tenant's lock across the COMMIT's (bench:queues, enqueue at 32 clients, in 5 s probes in
 * turns: 1,322 and 1,432 requests/s alone against 952 and 1,082 in the transaction).
 */

/** Admissions one transaction takes at most (`tuning.admissionBatch`). */
export const MAX_BATCH = tuning.admissionBatch;
/** How often a process sets a tenant's counters to the true counts (`tuning.admissionReconcileMs`). */
export const RECONCILE_EVERY_MS = tuning.admissionReconcileMs;

/**
 * Admits a run or refuses it before anything is written. The run joins its tenant's next batch;
 * a tenant has at most two batches in the database at once per process (see `inTurn`), so a
 * burst from one tenant ties up two pooled connections, and a stuck lock makes admission fail
 * with 503 after the lock timeout rather than hang.
 */
export async function admitRun(
  db: Database,
  who: Principal,
  run: NewRun,
  limits: TenantLimits,
  lockWaitMs = 15_000,
  clock: Clock = systemClock,
  withRun?: WithRun,
): Promise<Admission> {
  const line = lineOf(db, who.tenant);
  // Named now, so that a caller told the outcome is unknown is told its own run's id.
  const named = run.id === undefined ? { ...run, id: newRunId() } : run;
  return new Promise<Admission>((resolve, reject) => {
    line.queue.push({ who, run: named, limits, withRun, resolve, reject });
    askTurn(db, who.tenant, line, lockWaitMs, clock);
  });
}

/**
 * Makes sure a turn is coming for the runs waiting in the line: at most one turn waits at a
 * time, and when it comes it takes every run that arrived meanwhile. A caller waits for its
 * run's outcome, never for a turn of its own: with a turn per caller, each turn found only the
 * one or two runs that came since the last, and callers queued behind turns whose runs were
 * long decided (batches of 1.8 and 38 ms of the 48 an admission took, in the figures above).
 */
function askTurn(db: Database, tenant: string, line: Line, lockWaitMs: number, clock: Clock): void {
  if (line.turnAsked || line.queue.length === 0) return;
  line.turnAsked = true;
  let started = false;
  inTurn(
    db,
    tenant,
    lockWaitMs,
    async () => {
      started = true;
      // Requests whose bytes came in the same turn of the event loop join this batch: one read
      // serves them all (refusals: 0.72 -> 0.79 of the bare route's requests/s, in one run each).
      await new Promise((resolve) => setImmediate(resolve));
      line.turnAsked = false;
      const batch = line.queue.splice(0, MAX_BATCH);
      // More than a batch waits: the next turn is asked for now, and comes when a lane is free.
      askTurn(db, tenant, line, lockWaitMs, clock);
      if (batch.length > 0) await admitBatch(db, tenant, line, batch, clock, lockWaitMs);
    },
    clock,
  ).catch((error: unknown) => {
    // A batch that failed has told its runs. A turn that never came (a stuck lock) leaves every
    // run that waited for it to give up as the lock wait says.
    if (started) return;
    line.turnAsked = false;
    for (const item of line.queue.splice(0)) item.reject(error);
  });
}

/**
 * Whether a held run may start before its admission answers (runs/early-start.ts): admission
 * will try to write it without a read first (no quota, spend, thread or extra write, counters
 * not due to be set right), the counts this process expects admit it, with every run waiting
 * in its tenant's line before it, and the last read covered its project. What this process
 * expects errs high for its own runs (runs that ended are not taken off until the next read),
 * so a tenant or project it has seen at its cap starts nothing early. It errs low by what other
 * processes admitted since its last read (at most a second old while it admits): a run started
 * early then is refused by the statement, and its provider request cut.
 */
export function mayStartEarly(
  db: Database,
  who: Principal,
  run: NewRun,
  limits: TenantLimits,
  clock: Clock = systemClock,
): boolean {
  const line = existingLine(db, who.tenant);
  if (!line?.expected || line.queue.length > MAX_BATCH) return false;
  // A project the last read did not cover counts 0 in `expected`: not known to have room.
  if (
    !line.readProjects.has(who.project) ||
    line.queue.some((item) => !line.readProjects.has(item.who.project))
  )
    return false;
  if (line.reconciledAt === undefined || clock.now() - line.reconciledAt >= RECONCILE_EVERY_MS) return false;
  const item = { who, run, limits };
  if (!isHeld(item) || !decidedByCounts(item)) return false;
  return decideByCounts(line.expected.copy(), [...line.queue, item]).every((over) => over === undefined);
}

/** The estimate for a refusal of the per-user cap: how long the tenant's default-class runs stay. */
export function userRetryAfterMs(db: Database, tenant: string): number {
  return lineOf(db, tenant).history.estimate('active');
}

async function admitBatch(
  db: Database,
  tenant: string,
  line: Line,
  batch: Pending[],
  clock: Clock,
  lockWaitMs: number,
) {
  try {
    const outcomes = await decideBatch(db, tenant, line, batch, clock, lockWaitMs);
    batch.forEach((item, i) => item.resolve(outcomes[i]!));
  } catch (error) {
    // A run the database refuses as data (classes 22 and 23) or as too large (54) must not fail
    // the runs batched with it: each is tried alone then, and only the bad one fails.
    if (batch.length > 1 && /^(2[23]|54)/.test(String((error as { code?: unknown }).code))) {
      for (const item of batch)
        await admitBatch(db, tenant, line, [item], clock, lockWaitMs).catch(() => undefined);
      return;
    }
    for (const item of batch) item.reject(errorFor(error, item.run.id));
    // Passed on, so the turn knows whether the lock was the cause (see `inTurn`).
    throw error;
  }
}

async function decideBatch(
  db: Database,
  tenant: string,
  line: Line,
  batch: Pending[],
  clock: Clock,
  lockWaitMs: number,
): Promise<Admission[]> {
  const outcomes: (Admission | undefined)[] = batch.map(() => undefined);
  const projects = [...new Set(batch.map((item) => item.who.project))];
  // When the counters are due to be set right, every request goes to the locked read: a counter
  // that drifted up must not refuse the tenant from plain reads for ever.
  const reconcileDue =
    line.reconciledAt === undefined || clock.now() - line.reconciledAt >= RECONCILE_EVERY_MS;
  if (!reconcileDue && batch.every(decidedByCounts) && line.expected) {
    const admitted = await admitFromExpected(db, tenant, line, batch, projects, clock, lockWaitMs);
    if (admitted) return admitted;
  }
  // A plain read first. Where quota or spend apply, they are checked (and reported) before the
  // caps, so those requests always go to the locked read.
  const read = ++line.reads;
  const seen = await readCounters(db, tenant, projects);
  observe(line, seen, projects, clock, read);
  const plain = new Tally(seen);
  if (!reconcileDue && batch.every(decidedByCounts)) {
    const fast = await admitFromRead(db, tenant, line, batch, seen, ['', ...projects], lockWaitMs, clock);
    if (fast) return fast;
  }
  if (!reconcileDue)
    batch.forEach((item, i) => {
      if (item.limits.runQuota || item.limits.spend) return;
      const over = plain.over(item);
      if (over) outcomes[i] = { ok: false, refusal: withEstimate(line, over) };
    });
  if (outcomes.every((o) => o !== undefined)) return outcomes;

  return settledTransaction(db, lockWaitMs, clock, async (tx) => {
    await lockTenantAdmission(tx, tenant);
    const now = clock.now();
    if (line.reconciledAt === undefined || now - line.reconciledAt >= RECONCILE_EVERY_MS) {
      await reconcileCounters(tx, tenant);
      line.reconciledAt = now;
    }
    const locked = ++line.reads;
    const counters = await readCounters(tx, tenant, projects);
    observe(line, counters, projects, clock, locked);
    const tally = new Tally(counters);
    // What this batch admits is counted in what the process expects next.
    const expected = line.expected;
    const limits = batch[0]!.limits;
    let quotaUsed = limits.runQuota ? await quotaUse(tx, tenant, limits.runQuota.windowMs) : 0;
    const spend = limits.spend ? await spendFigures(tx, tenant, limits.spend.windowMs) : undefined;
    const admitted: Pending[] = [];
    for (const [i, item] of batch.entries()) {
      if (outcomes[i] !== undefined) continue;
      const refusal = await check(tx, item, tally, quotaUsed, spend);
      if (refusal) {
        outcomes[i] = { ok: false, refusal: withEstimate(line, refusal) };
        continue;
      }
      admitted.push(item);
      tally.add(item);
      expected?.add(item);
      quotaUsed++;
      if (spend) spend.active++;
    }
    if (admitted.length === 0) return { outcome: outcomes as Admission[], written: [] };
    const rows = await insertRuns(
      tx,
      admitted.map(({ who, run }) => ({ who, run })),
    );
    for (const [j, item] of admitted.entries()) await item.withRun?.(tx, rows[j]!);
    let next = 0;
    batch.forEach((item, i) => {
      if (outcomes[i] === undefined) outcomes[i] = { ok: true, run: rows[next++]! };
    });
    return { outcome: outcomes as Admission[], written: rows.map((row) => row.id) };
  });
}

/**
 * A batch the expected counts let in, written without a read first, by the one statement of
 * admitDecided. Undefined when the expected counts refuse one of them or the statement found a
 * count risen (nothing is written then), and the batch is decided from a read. The read that
 * feeds the Retry-After history is started beside the answer, at most once a second.
 */
async function admitFromExpected(
  db: Database,
  tenant: string,
  line: Line,
  batch: Pending[],
  projects: string[],
  clock: Clock,
  lockWaitMs: number,
): Promise<Admission[] | undefined> {
  // Counts the batch into what is expected: when it is not admitted so, a read resets it.
  if (decideByCounts(line.expected!, batch).some((over) => over !== undefined)) return undefined;
  const highest = highestCounts(batch, ['', ...projects]);
  const rows = await admitDecided(db, tenant, highest, batch, lockWaitMs, clock);
  if (!rows) return undefined;
  if (line.observedAt === undefined || clock.now() - line.observedAt >= MIN_SPAN_MS) {
    line.observedAt = clock.now();
    const read = ++line.reads;
    void readCounters(db, tenant, projects).then(
      (counters) => observe(line, counters, projects, clock, read),
      () => undefined,
    );
  }
  return rows.map((run) => ({ ok: true, run }));
}

/**
 * The whole batch decided from the plain read and written by one statement that holds the
 * tenant's lock only to check that no count rose since the read (see admitDecided). Undefined
 * when one did: the batch is then decided again under the lock.
 */
async function admitFromRead(
  db: Database,
  tenant: string,
  line: Line,
  batch: Pending[],
  seen: Map<string, AdmissionCounters>,
  projects: string[],
  lockWaitMs: number,
  clock: Clock,
): Promise<Admission[] | undefined> {
  // Decided as under the lock (see decideBatch), from the counts the plain read saw.
  const outcomes: (Admission | undefined)[] = decideByCounts(new Tally(seen), batch).map((over) =>
    over ? { ok: false, refusal: withEstimate(line, over) } : undefined,
  );
  const admitted = batch.filter((_, i) => outcomes[i] === undefined);
  if (admitted.length === 0) return outcomes as Admission[];
  const highest = highestCounts(admitted, projects);
  const rows = await admitDecided(db, tenant, highest, admitted, lockWaitMs, clock);
  if (!rows) return undefined;
  for (const item of admitted) line.expected?.add(item);
  let next = 0;
  return outcomes.map((outcome) => outcome ?? { ok: true, run: rows[next++]! });
}

/** Quota, spend, caps and the held run's thread, in that order, for one run of the batch. */
async function check(
  tx: SqlClient,
  item: Pending,
  tally: Tally,
  quotaUsed: number,
  spend: SpendFigures | undefined,
): Promise<Refusal | undefined> {
  const { limits, run } = item;
  // Only admitted runs are rows, so a refused call costs no quota.
  if (limits.runQuota && quotaUsed >= limits.runQuota.limit) {
    return { kind: 'quota', class: run.class, limitValue: limits.runQuota.limit, used: quotaUsed };
  }
  if (limits.spend && spend) {
    // Spend counts every run that ended in the window, whatever its state, and reserves for each
    // run still active the mean cost of the window's finished runs: a tenant just under its limit
    // cannot start its whole cap of runs at once. With no finished run to estimate from, a run's
    // cost is unknown: one run at a time then. The overshoot is bounded by the active runs' cost
    // above that mean.
    const reserved = spend.active * (spend.mean ?? 0);
    const unknownCost = spend.mean === null && spend.active > 0;
    if (unknownCost || spend.spent + reserved >= limits.spend.limitUsd) {
      return {
        kind: 'spend',
        class: run.class,
        limitUsd: limits.spend.limitUsd,
        spentUsd: spend.spent,
        reservedUsd: reserved,
      };
    }
  }
  const over = tally.over(item);
  if (over) return over;
  if (run.mode === 'inline' && run.threadId !== undefined) {
    // The thread was taken before admission, under a lease: it must still be this run's, or two
    // runs would hold it. Renewed here, it lasts until the executor renews it.
    const kept = await tx.query(
      `UPDATE threads SET lock_expires_at = greatest(lock_expires_at, clock_timestamp() + $3::float8 * interval '1 millisecond')
       WHERE id = $1::text AND active_run_id = $2::text AND lock_expires_at > clock_timestamp() RETURNING id`,
      [run.threadId, run.id, run.threadLeaseMs ?? 60_000],
    );
    if (kept.rows.length === 0) return { kind: 'thread', threadId: run.threadId };
  }
  return undefined;
}
