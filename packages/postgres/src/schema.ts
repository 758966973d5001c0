import { readFileSync } from 'node:fs';
import type { Database } from './database.js';

export const defaultSchema = 'sluice';

const schemaFile = new URL('../sql/001_concurrency.sql', import.meta.url);

export function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/**
 * The DDL of the limiter's tables, for a migration tool when the role that runs the
 * workers may not create tables (then pass `ensureSchema: false`).
 *
 * @example
 * await migrationClient.query(postgresConcurrencySchemaSql({ schema: 'sluice' }));
 */
export function postgresConcurrencySchemaSql(options: { schema?: string } = {}): string {
  return readFileSync(schemaFile, 'utf8').replaceAll(
    '__SCHEMA__',
    quoteIdent(options.schema ?? defaultSchema),
  );
}

/**
 * The DDL, one statement at a time (drivers differ on multi-statement queries). Splits at a
 * semicolon that ends a line, except inside a `$$` function body.
 */
export function statements(sql: string): string[] {
  const out: string[] = [];
  let current = '';
  let inBody = false;
  for (const line of sql.split('\n')) {
    if (!inBody && /^\s*--/.test(line)) continue;
    current += `${line}\n`;
    if ((line.match(/\$\$/g) ?? []).length % 2 === 1) inBody = !inBody;
    if (!inBody && /;\s*$/.test(line)) {
      if (current.trim()) out.push(current.trim());
      current = '';
    }
  }
  if (current.trim()) out.push(current.trim());
  return out;
}

/**
 * Creates the tables unless they exist. Many workers may start at once on a fresh
 * database: CREATE ... IF NOT EXISTS alone still races on the catalog, so creation runs
 * under a transaction-scoped advisory lock.
 */
export async function ensureSchema(db: Database, schema: string): Promise<void> {
  // The newest object of the file (the pass function, in its current signature): when it
  // exists, everything before it does too. Read from
  // the catalog tables with a fresh snapshot: to_regclass() and friends answer from a cache
  // that an advisory lock does not refresh, which sent a second worker into the DDL (and into
  // a deadlock with the first one's allocations) in the start-up race test.
  const exists = async (q: Database | { query: Database['query'] }) =>
    (
      await q.query<{ found: boolean }>(
        `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = $1::text AND p.proname = 'concurrency_pass' AND p.pronargs = 11) AS found`,
        [schema],
      )
    ).rows[0]?.found === true;
  if (await exists(db)) return;
  await db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:schema:${schema}`]);
    if (await exists(tx)) return;
    for (const statement of statements(postgresConcurrencySchemaSql({ schema }))) await tx.query(statement);
  });
}
