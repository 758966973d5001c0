import type { Principal } from '../store/tokens.js';
import { cleanJson } from './json.js';
import type { RunListener } from './run-execution.js';
import type { NewRun, RunRow } from './store.js';

/**
 * A held run whose agent starts while its admission commits, so its provider request does not
 * wait for the database (bench:stream's first text). Taken only where admission is expected to
 * admit in one statement (runs/admission.ts `mayStartEarly`): a new run, without a thread, whose
 * tenant's counts this process expects to fit. A tenant at its cap is refused from what the
 * process knows and starts nothing early, so refused requests cost no provider request.
 *
 * Until admission has answered, nothing of the run leaves the process: its events are held
 * (not stored, not sent), its end is not written. Admitted, the events go out in order after
 * `run.created`; refused (or admission failed), the agent is stopped, its provider request
 * aborted and its slot freed, and what it said is dropped.
 */
export class EarlyStart {
  readonly controller = new AbortController();
  /** The caller's listener, once the front executes the admitted run (executor.execute). */
  #target: RunListener | undefined;
  #state: 'waiting' | 'admitted' | 'refused' = 'waiting';
  #decide!: (row: RunRow | undefined) => void;
  /** The admitted row, or undefined when the run was refused: what the execution waits on. */
  readonly admission = new Promise<RunRow | undefined>((resolve) => (this.#decide = resolve));

  get refused(): boolean {
    return this.#state === 'refused';
  }

  /** The run is admitted and its front listens: its held events go out now. */
  admit(row: RunRow, listener: RunListener | undefined): void {
    if (this.#state !== 'waiting') return;
    this.#state = 'admitted';
    this.#target = listener;
    this.#decide(row);
  }

  /** Admission refused the run or failed: its agent stops, and nothing of it is kept. */
  refuse(reason: Error): void {
    if (this.#state !== 'waiting') return;
    this.#state = 'refused';
    this.controller.abort(reason);
    this.#decide(undefined);
  }

  /** What the execution tells: forwarded to the front's listener once it is there. */
  readonly relay: RunListener = {
    onText: (delta) => this.#target?.onText?.(delta),
    onTool: (event) => this.#target?.onTool?.(event),
    onEvent: (event, tool) => this.#target?.onEvent?.(event, tool),
  };
}

/**
 * The row a held run will be admitted as, for its agent to start from before the row exists:
 * what the execution reads of it (its id, agent, tenant, class, input and bounds). Its events
 * and its end use the admitted row.
 */
export function provisionalRow(who: Principal, run: NewRun & { id: string }, now: number): RunRow {
  return {
    id: run.id,
    tenant: who.tenant,
    project: who.project,
    user_id: who.user,
    agent: run.agent,
    class: run.class,
    mode: 'inline',
    status: 'running',
    input: cleanJson(run.input),
    output: null,
    error: null,
    metadata: run.metadata ?? null,
    usage: null,
    created_at: now / 1000,
    started_at: now / 1000,
    finished_at: null,
    scheduled_for: null,
    callback_url: run.callbackUrl ?? null,
    worker: run.worker,
    thread_id: null,
    config: run.config ?? null,
    api_request: run.apiRequest ?? null,
    created_us: String(Math.round(now * 1000)),
    required_action: null,
    resuming: false,
  };
}
