import type { RequestLineage } from './errors.js';

/** How a slot's provider request ended. */
export type ReleaseOutcome = 'completed' | 'failed' | 'cancelled';

/** Fields every concurrency event carries. Never a prompt, never a credential. */
export interface ConcurrencyEventBase extends RequestLineage {
  /** Name of the limiter. */
  readonly limiter: string;
  /** The workload; a plain string, since one listener may hear several limiters. */
  readonly workload: string;
  /** When the event happened (ms since the epoch). */
  readonly at: number;
}

export type ConcurrencyEvent =
  /** A request started waiting for a slot (possibly for no time at all). */
  | (ConcurrencyEventBase & { readonly type: 'wait-started'; readonly deadline: number | undefined })
  | (ConcurrencyEventBase & { readonly type: 'acquired'; readonly leaseId: string; readonly waitMs: number })
  | (ConcurrencyEventBase & { readonly type: 'timed-out'; readonly waitMs: number })
  | (ConcurrencyEventBase & { readonly type: 'queue-full'; readonly waitMs: number })
  | (ConcurrencyEventBase & { readonly type: 'wait-cancelled'; readonly waitMs: number })
  | (ConcurrencyEventBase & {
      readonly type: 'limiter-error';
      readonly waitMs: number;
      readonly error: Error;
    })
  | (ConcurrencyEventBase & { readonly type: 'config-error'; readonly error: Error })
  | (ConcurrencyEventBase & {
      readonly type: 'released';
      readonly leaseId: string;
      readonly holdMs: number;
      readonly outcome: ReleaseOutcome;
    })
  | (ConcurrencyEventBase & {
      readonly type: 'renewal-failed';
      readonly leaseId: string;
      readonly error: Error;
    })
  | (ConcurrencyEventBase & {
      readonly type: 'lease-lost';
      readonly leaseId: string;
      readonly holdMs: number;
    })
  | (ConcurrencyEventBase & {
      readonly type: 'release-failed';
      readonly leaseId: string;
      readonly error: Error;
    })
  /** The provider said it is overloaded (429, 503, 529 or nothing remaining): new grants pause. */
  | (ConcurrencyEventBase & {
      readonly type: 'provider-throttled';
      readonly status: number | undefined;
      readonly retryAfterMs: number;
    })
  /** The adaptive limit moved. */
  | (ConcurrencyEventBase & {
      readonly type: 'limit-changed';
      readonly from: number;
      readonly to: number;
      readonly reason: 'overload' | 'increase';
    });

export type ConcurrencyEventType = ConcurrencyEvent['type'];

/** Receives concurrency events. A listener that throws is ignored; it cannot break a run. */
export type ConcurrencyEventListener = (event: ConcurrencyEvent) => void;
