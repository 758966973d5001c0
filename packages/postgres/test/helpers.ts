import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { inject } from 'vitest';

/** Connection settings of this run's PostgreSQL database (see scripts/vitest-global-setup.ts). */
export const postgresConfig = inject('postgres');

/** A pool on this run's database. */
export function createPool(max = 10): pg.Pool {
  if (!postgresConfig) throw new Error('PostgreSQL is not available');
  return new pg.Pool({ ...postgresConfig, max });
}

/** A unique schema name per test file, so files never see each other's tables. */
export function uniqueSchema(prefix: string): string {
  return `${prefix}_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6)}`;
}

export async function createPGlite(): Promise<PGlite> {
  const db = new PGlite();
  await db.waitReady;
  return db;
}
