import { refusalOf } from '../http/errors.js';
import { AdmissionOutcomeUnknown } from '../runs/admission-settle.js';
import type { RouteContext } from '../routes/context.js';
import { latestTick, nextTick } from './cron.js';
import { tuning } from '../tuning.js';
import { queueTriggerRun } from './runs.js';
import { TickWatch } from './tick-watch.js';
import {
  isUniqueViolation,
  pruneTicks,
  recordTick,
  dueTriggers,
  earliestTick,
  tickMade,
  type TriggerRow,
} from './store.js';

type Log = (level: 'info' | 'warn' | 'error', message: string, fields?: object) => void;

/** How often each process looks for ticks that have come (on a solo store, only when one may have: TickWatch). */
export const TICK_CHECK_MS = 1_000;
/** Due schedule triggers taken in one pass; more wait for the next pass, longest due first. */
const PASS_LIMIT = 10_000;
const { pruneTicksEveryMs: PRUNE_EVERY_MS, keepTicksMs: KEEP_TICKS_MS } = tuning;

/**
 * Makes the runs of schedule triggers. Every server process looks in its upkeep loop; a tick's
 * run is written with the tick's row in one transaction, so however many processes look at
 * once, each tick makes one run.
 *
 * After downtime only the latest tick that has come is made: the ticks missed before it are
 * skipped (a nightly report that missed three nights runs once, not three times at once).
 * Ticks from before the trigger existed are never made. A tick refused by a cap (the runs
 * API's 429) is recorded as refused and not retried: the next tick is the next try.
 */
export class TriggerTicker {
  #lastPrune = 0;

  constructor(
    private readonly ctx: RouteContext,
    private readonly now: () => number,
    private readonly log: Log = () => undefined,
    /** When to look (tick-watch.ts); without one, every check looks. */
    private readonly watch: TickWatch = new TickWatch(false),
  ) {}

  /** The upkeep loop's check: looks only when a tick may have come (see TickWatch). */
  async check(nowMs = this.now()): Promise<number> {
    if (this.watch.due(nowMs)) return this.tickNow(nowMs);
    await this.#prune(nowMs);
    return 0;
  }

  /** Makes the runs of the ticks that have come by `nowMs`; returns how many it made. */
  async tickNow(nowMs = this.now()): Promise<number> {
    let made = 0;
    for (const trigger of await dueTriggers(this.ctx.db, nowMs, PASS_LIMIT)) {
      try {
        if (await this.#tick(trigger, nowMs)) made++;
      } catch (error) {
        this.log('warn', 'schedule tick failed', { trigger: trigger.id, error: String(error) });
      }
    }
    if (this.watch.solo) {
      const begun = this.watch.begin();
      this.watch.read(begun, await earliestTick(this.ctx.db));
    }
    await this.#prune(nowMs);
    if (made > 0) this.ctx.executor.notify();
    return made;
  }

  async #prune(nowMs: number): Promise<void> {
    if (nowMs - this.#lastPrune <= PRUNE_EVERY_MS) return;
    this.#lastPrune = nowMs;
    await pruneTicks(this.ctx.db, KEEP_TICKS_MS);
  }

  async #tick(trigger: TriggerRow, nowMs: number): Promise<boolean> {
    const tick = latestTick(trigger.schedule!, nowMs);
    if (tick === undefined || tick <= (trigger.last_tick_ms ?? trigger.created_ms)) return false;
    const next = nextTick(trigger.schedule!, tick);
    if (await tickMade(this.ctx.db, trigger.id, tick)) return false;
    const at = new Date(tick).toISOString();
    try {
      await queueTriggerRun(
        this.ctx,
        trigger,
        trigger.input ?? JSON.stringify({ trigger: trigger.name, scheduled_for: at }),
        { trigger_id: trigger.id, scheduled_for: at },
        (tx, run) => recordTick(tx, trigger.id, tick, next, { runId: run.id }),
      );
      return true;
    } catch (error) {
      if (isUniqueViolation(error)) return false;
      // Not a refusal: the tick is tried again, and finds itself recorded if its run was written.
      if (error instanceof AdmissionOutcomeUnknown) throw error;
      const refused = refusalOf(error);
      if (!refused) throw error;
      this.log('warn', 'schedule tick refused', { trigger: trigger.id, tick: at, refusal: refused.type });
      await recordTick(this.ctx.db, trigger.id, tick, next, { refused: refused.type }).catch(
        (again: unknown) => {
          if (!isUniqueViolation(again)) throw again;
        },
      );
      return false;
    }
  }
}
