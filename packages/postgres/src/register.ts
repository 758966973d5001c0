import { ConcurrencyConfigError, type ResolvedLimits } from 'sluice/concurrency';
import type { Database } from './database.js';
import type { LimiterQueries } from './queries.js';
import { differences, storedForm, type StoredLimits } from './stored-limits.js';

/**
 * Stores this worker's limits under its name, or checks them against the stored ones: a
 * worker with other limits is refused with `ConcurrencyConfigError` listing every difference,
 * unless `onConflict` is `'replace'` (then its limits become everyone's).
 */
export async function registerLimits(
  db: Database,
  queries: LimiterQueries,
  limits: ResolvedLimits<string>,
  onConflict: 'error' | 'replace',
): Promise<void> {
  const name = limits.name;
  const mine = storedForm(limits);
  await db.query(queries.registerLimits, [name, JSON.stringify(mine)]);
  const row = (await db.query<{ limits: StoredLimits }>(queries.readLimits, [name])).rows[0];
  const diff = row ? differences(mine, row.limits) : [];
  if (diff.length === 0) return;
  if (onConflict === 'replace') {
    await db.query(queries.replaceLimits, [name, JSON.stringify(mine)]);
    return;
  }
  throw new ConcurrencyConfigError(
    `Limiter \`${name}\` is stored with other limits: ${diff.join('; ')}. ` +
      "Every worker sharing a name must use the same limits; use a new name, or onConflict: 'replace'",
    { limiter: name, field: 'limits', value: row?.limits },
  );
}
