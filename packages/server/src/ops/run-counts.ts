import type { Database } from '@sluice/postgres/database';
import { systemClock } from 'sluice/concurrency';

/** Runs of one tenant in one class and status. */
export interface RunCount {
  readonly tenant: string;
  readonly class: string;
  readonly status: string;
  readonly count: number;
}

export interface RunCountsOptions {
  /**
   * How long the counts of ended runs (succeeded, failed, canceled) are kept before they are
   * counted again. @default 60 seconds
   */
  finalMaxAgeMs?: number;
  /** Time source of that cache (ms). @default the system clock's */
  now?: () => number;
}

const LIVE = `('scheduled', 'queued', 'running', 'requires_action')`;
const FINAL = `('succeeded', 'failed', 'canceled')`;

/*
 * Two queries, because the two sets cost differently. Runs still in play are few (the caps bound
 * them) and sit in the partial index agent_runs_live (sql/030_ops.sql), so counting them on every
 * read is an index-only scan of a small index: under 1 ms beside a million ended runs. Ended runs
 * are never deleted: counting them reads every one (about 2 s for a million on a busy 2-core
 * machine; an index on (status, class, tenant) only halved that, for a write on every run), so
 * that count is cached and taken again at most every `finalMaxAgeMs`.
 */
const liveSql = `SELECT tenant, class, status, count(*)::int AS count FROM agent_runs
  WHERE status IN ${LIVE} GROUP BY tenant, class, status`;
const finalSql = `SELECT tenant, class, status, count(*)::int AS count FROM agent_runs
  WHERE status IN ${FINAL} GROUP BY tenant, class, status`;

/**
 * Runs per tenant, class and status across every process on the database. Reads that arrive
 * while a count is under way share it, so a burst of scrapes and dashboards costs one query.
 */
export class RunCounts {
  readonly #db: Database;
  readonly #finalMaxAgeMs: number;
  readonly #now: () => number;
  #live: Promise<RunCount[]> | undefined;
  #final: { at: number; rows: Promise<RunCount[]> } | undefined;

  constructor(db: Database, options: RunCountsOptions = {}) {
    this.#db = db;
    this.#finalMaxAgeMs = options.finalMaxAgeMs ?? 60_000;
    this.#now = options.now ?? systemClock.now;
  }

  async read(): Promise<RunCount[]> {
    const live = (this.#live ??= this.#query(liveSql).finally(() => (this.#live = undefined)));
    const now = this.#now();
    if (!this.#final || now - this.#final.at >= this.#finalMaxAgeMs) {
      const rows = this.#query(finalSql);
      const entry = { at: now, rows };
      this.#final = entry;
      // A failed count is not kept: the next read tries again.
      rows.catch(() => {
        if (this.#final === entry) this.#final = undefined;
      });
    }
    const [a, b] = await Promise.all([live, this.#final!.rows]);
    return [...a, ...b];
  }

  /** Forgets the cached counts of ended runs: the next read counts them again. */
  expire(): void {
    this.#final = undefined;
  }

  async #query(sql: string): Promise<RunCount[]> {
    return (await this.#db.query<RunCount>(sql)).rows;
  }
}
