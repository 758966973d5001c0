/**
 * The IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers) of a 429, beside its
 * Retry-After: the policy that refused (`q`: its limit, `w`: its window when it has one) and
 * what is left of it (`r`) with the seconds until that changes (`t`). NAME is the limit's name
 * as the error body spells it (`max_active_runs`, `agent_runs`...), quoted as the draft's
 * structured-field strings are.
 */
export function rateLimitFields(
  name: string,
  figures: { limit: number; remaining: number; seconds: number; windowSeconds?: number },
): Record<string, string> {
  const quoted = `"${name.replace(/[^A-Za-z0-9_.-]/g, '_')}"`;
  const window = figures.windowSeconds === undefined ? '' : `;w=${Math.round(figures.windowSeconds)}`;
  return {
    'ratelimit-policy': `${quoted};q=${Math.max(0, Math.floor(figures.limit))}${window}`,
    ratelimit: `${quoted};r=${Math.max(0, Math.floor(figures.remaining))};t=${Math.max(0, Math.ceil(figures.seconds))}`,
  };
}
