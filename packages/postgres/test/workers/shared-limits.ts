/** The limits every process of the multi-process tests uses (they must agree). */
export const sharedLimits = {
  maxConcurrent: 5,
  maxQueued: 30,
  leaseTtlMs: 600,
  queueEntryTtlMs: 1500,
  workloads: {
    vip: { reserved: 1, priority: 10 },
    std: { priority: 5 },
    bulk: { maxConcurrent: 3 },
  },
} as const;
