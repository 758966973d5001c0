/**
 * The configurations bench/capacity compares, in the order it runs them, and the provider
 * account they all face. Shared by the bench and its worker processes.
 */

/** The stand-in's account: what the provider allows. No configuration but `told` is given it. */
export const account = Object.freeze({ maxConcurrent: 20, requestsPerMinute: 600, tokensPerMinute: 60_000 });

export const configurations = ['slots_only', 'no_limiter', 'count_after', 'sluice', 'told'] as const;
export type Configuration = (typeof configurations)[number];

/** How each configuration is described in the table. */
export const labels: Record<Configuration, string> = {
  slots_only: 'Sluice, slots only (maxConcurrent 20)',
  no_limiter: 'no limiter (the runtime retries 429s)',
  count_after: 'count after the response (LiteLLM)',
  sluice: 'Sluice adaptive (maxConcurrent 64)',
  told: 'Sluice told the limits',
};

/** Agent loops in all, shared among the worker processes: each runs one agent run after another. */
export const agentLoops = 64;

/** The output-token cap the agents send (`max_tokens`): a short answer's, as a chat agent sets it. */
export const outputCap = 512;
