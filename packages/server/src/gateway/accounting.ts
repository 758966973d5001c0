import type { Database } from '@sluice/postgres/database';
import type { TokenCounts } from 'sluice';
import type { Places, PlaceTaken } from '../cache/places.js';
import { quotaUse, spendFigures } from '../runs/admission-counts.js';
import type { TenantLimits } from '../runs/policy.js';
import type { ResolvedGateway } from './config.js';
import { deleteInBatches, PRUNE_MAX_STATEMENTS } from '../store/prune.js';
import { GatewayError } from './errors.js';

/**
 * The tenant's limits, applied to gateway requests as to runs:
 * - its cap of active runs (`maxConcurrentAgentRuns`, or the server's setting) bounds its
 *   gateway requests in flight too, as places of the cache store (shared through Redis when the
 *   server uses it), apart from the runs' own count;
 * - its run quota counts its gateway requests of the period beside its runs;
 * - its spend limit counts what its gateway requests cost (the gateway's `cost` prices times the
 *   usage the responses reported) beside what its runs cost.
 * Requests of a tenant with a quota or a spend limit, or to a priced gateway, leave a row in
 * `gateway_usage` when they end; the rest cost no database write.
 */
export class GatewayAccounting {
  constructor(
    readonly db: Database,
    readonly places: Places,
    readonly limitsFor: (tenant: string) => TenantLimits,
  ) {}

  /** A place under the tenant's cap; throws the 429 when it has none. */
  async takePlace(tenant: string): Promise<PlaceTaken & { ok: true }> {
    const limits = this.limitsFor(tenant);
    const cap = limits.activePerTenant;
    // `maxConcurrentAgentRuns: 0` closes the tenant: no run, and no gateway request either.
    const taken = limits.defaultClosed
      ? { ok: false as const, held: 0 }
      : await this.places.take(`gateway:${tenant}`, cap);
    if (!taken.ok)
      throw new GatewayError(
        429,
        'rate_limit_exceeded',
        `The tenant already has ${taken.held} gateway requests in flight; the limit is ${limits.defaultClosed ? 0 : cap}`,
        { 'retry-after': '1' },
      );
    return taken;
  }

  /** Whether a request of `tenant` to `gateway` is written down when it ends. */
  counted(tenant: string, gateway: ResolvedGateway): boolean {
    const limits = this.limitsFor(tenant);
    return gateway.cost !== undefined || limits.runQuota !== undefined || limits.spend !== undefined;
  }

  /** Refuses (429) a tenant whose quota or spend limit is used up; nothing to read without them. */
  async checkPeriod(tenant: string): Promise<void> {
    const { runQuota, spend } = this.limitsFor(tenant);
    if (runQuota) {
      const used =
        (await quotaUse(this.db, tenant, runQuota.windowMs)) +
        (await this.requests(tenant, runQuota.windowMs));
      if (used >= runQuota.limit)
        throw new GatewayError(
          429,
          'agent_quota_exceeded',
          `The tenant's quota is used up: ${used} of ${runQuota.limit} runs and gateway requests in the period`,
          { 'retry-after': '60' },
        );
    }
    if (spend) {
      const figures = await spendFigures(this.db, tenant, spend.windowMs);
      const reserved = figures.active * (figures.mean ?? 0);
      if (figures.spent + reserved >= spend.limitUsd)
        throw new GatewayError(
          429,
          'spend_limit_exceeded',
          `The tenant's spend limit is used up: $${figures.spent.toFixed(4)} spent and $${reserved.toFixed(4)} ` +
            `reserved for active runs, of $${spend.limitUsd} in the period`,
          // Not a case for retrying soon; the OpenAI SDKs read this header.
          { 'x-should-retry': 'false' },
        );
    }
  }

  async requests(tenant: string, windowMs: number): Promise<number> {
    const { rows } = await this.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM gateway_usage
       WHERE tenant = $1::text AND created_at > clock_timestamp() - $2::float8 * interval '1 millisecond'`,
      [tenant, windowMs],
    );
    return rows[0]!.n;
  }

  /** Writes one ended request down; its cost from the gateway's prices. */
  async record(tenant: string, gateway: ResolvedGateway, status: number, usage: TokenCounts | undefined) {
    const input = usage?.input ?? 0;
    const output = usage?.output ?? 0;
    const cost = gateway.cost ? (input * gateway.cost.input + output * gateway.cost.output) / 1_000_000 : 0;
    await this.db.query(
      `INSERT INTO gateway_usage (tenant, gateway, status, input_tokens, output_tokens, cost)
       VALUES ($1::text, $2::text, $3::int, $4::bigint, $5::bigint, $6::float8)`,
      [tenant, gateway.name, status, input, output, cost],
    );
  }
}

/**
 * Deletes the gateway_usage rows older than `keepMs` (the longest period a quota or spend limit
 * counts over), `batch` rows a statement while one finds a full batch (store/prune.ts). The rows
 * come in id order, which is their time order (id and created_at are both taken at the insert),
 * so a statement reads only the oldest `batch` rows by the primary key and never scans the
 * table. Returns how many went.
 */
export async function pruneGatewayUsage(
  db: Database,
  keepMs: number,
  batch: number,
  maxStatements = PRUNE_MAX_STATEMENTS,
): Promise<number> {
  return deleteInBatches(
    async () =>
      (
        await db.query<{ id: string }>(
          `DELETE FROM gateway_usage WHERE id IN (
             SELECT id FROM (SELECT id, created_at FROM gateway_usage ORDER BY id LIMIT $2::int) oldest
             WHERE created_at < clock_timestamp() - $1::float8 * interval '1 millisecond')
           RETURNING id`,
          [keepMs, batch],
        )
      ).rows.length,
    batch,
    maxStatements,
  );
}
