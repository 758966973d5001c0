import type { TickWatch } from '../triggers/tick-watch.js';
import type { Database } from '@sluice/postgres/database';
import type { Principals } from '../http/principals.js';
import type { Clock } from 'sluice/concurrency';
import type { Places } from '../cache/places.js';
import type { AdmissionHooks } from '../ops/admissions.js';
import type { SluiceConfig } from '../config.js';
import type { Executor } from '../runs/executor.js';
import type { TenantLimits } from '../runs/policy.js';
import type { RunWaiters } from '../runs/waiters.js';
import type { ServerSettings } from '../settings.js';

/** What the routes share: the store, the policy, and this process's executor and waiters. */
export interface RouteContext {
  readonly db: Database;
  /** API tokens' principals (a lookup cache kept right by revocation notifications). */
  readonly principals: Principals;
  readonly config: SluiceConfig;
  readonly settings: ServerSettings;
  readonly executor: Executor;
  readonly waiters: RunWaiters;
  /** Held runs per user and WebSocket connections (the cache store's places). */
  readonly places: Places;
  readonly limitsFor: (tenant: string) => TenantLimits;
  /** What admission reads the time from (its Retry-After estimate). */
  readonly clock: Clock;
  /** Vets a callback destination; a message says why it is refused. */
  readonly checkCallbackUrl: (
    raw: string,
  ) => Promise<{ ok: true; url: string } | { ok: false; message: string }>;
  readonly isDraining: () => boolean;
  /** Hears each admission decision (the metrics and the dashboard's refusals). */
  readonly admissions?: AdmissionHooks;
  /** Whether the provider requests of a tenant's agent wait for slots now (a queued run's `waiting`). */
  readonly providerWaiting?: (tenant: string, agent: string) => boolean;
  /** Told of each schedule trigger made here, so that a ticker sleeping till the next tick wakes for it. */
  readonly triggerTicks?: TickWatch;
}
