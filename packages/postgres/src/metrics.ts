/**
 * What one limiter object did, for dashboards and tuning: allocation transactions (and how
 * many failed), polls, and how slots reached its waiting requests (directly, by an offer
 * claimed after a NOTIFY or by a poll, or by enqueueing again after an offer lapsed or an
 * entry was lost).
 */
export interface LimiterMetrics {
  passes: number;
  failedPasses: number;
  polls: number;
  directGrants: number;
  offersMade: number;
  offersClaimedOnNotify: number;
  offersClaimedOnPoll: number;
  requeued: number;
}

export function newMetrics(): LimiterMetrics {
  return {
    passes: 0,
    failedPasses: 0,
    polls: 0,
    directGrants: 0,
    offersMade: 0,
    offersClaimedOnNotify: 0,
    offersClaimedOnPoll: 0,
    requeued: 0,
  };
}
