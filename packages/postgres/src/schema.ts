import { readFileSync } from 'node:fs';
import type { Database, SqlClient } from './database.js';
import { postgresDefaults } from './options.js';

/**
 * The limiter's schema versions, oldest first: `sql/<NNN>_*.sql`, each written so that it
 * can run again harmlessly. A schema's version is the highest number recorded in its
 * `concurrency_schema_version` table; a schema made before that table existed has none and
 * counts as version 0 (running version 1 again on it changes nothing).
 */
const versions = [
  { version: 1, file: '001_concurrency.sql' },
  { version: 2, file: '002_named_pass_columns.sql' },
  { version: 3, file: '003_fair_keys.sql' },
  { version: 4, file: '004_capacity.sql' },
] as const;

/** The version this code needs. */
export const schemaVersion = versions.at(-1)!.version;

export function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

const versionTable = (s: string) => `CREATE TABLE IF NOT EXISTS ${s}.concurrency_schema_version (
  version     int PRIMARY KEY,
  applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);`;

const recordVersion = (s: string, version: number) =>
  `INSERT INTO ${s}.concurrency_schema_version (version) VALUES (${version}) ON CONFLICT DO NOTHING;`;

function versionSql(schema: string, version: number): string {
  const entry = versions.find((v) => v.version === version)!;
  const text = readFileSync(new URL(`../sql/${entry.file}`, import.meta.url), 'utf8');
  return text.replaceAll('__SCHEMA__', quoteIdent(schema));
}

/**
 * The DDL of the limiter's tables, every version, for a migration tool when the role that
 * runs the workers may not create tables (then pass `ensureSchema: false`). Safe to apply
 * again, and on a schema of an older version: it brings it up to date.
 *
 * @example
 * await migrationClient.query(postgresConcurrencySchemaSql({ schema: 'sluice' }));
 */
export function postgresConcurrencySchemaSql(options: { schema?: string } = {}): string {
  return upgradeSql(options.schema ?? postgresDefaults.schema, 0);
}

/** The DDL from version `from` (exclusive) to the current one, each version recorded. */
function upgradeSql(schema: string, from: number): string {
  const s = quoteIdent(schema);
  const parts = [`CREATE SCHEMA IF NOT EXISTS ${s};`, versionTable(s)];
  for (const { version } of versions) {
    if (version > from) parts.push(versionSql(schema, version), recordVersion(s, version));
  }
  return parts.join('\n\n');
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
 * The schema's version: 0 when it has no version table. The table's existence is read from
 * the catalog with a fresh snapshot: to_regclass() and friends answer from a cache that an
 * advisory lock does not refresh, which once sent a second worker into the DDL (and into a
 * deadlock with the first one's allocations) in the start-up race test.
 */
export async function currentVersion(db: SqlClient, schema: string): Promise<number> {
  const found = await db.query<{ found: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = $1::text AND c.relname = 'concurrency_schema_version') AS found`,
    [schema],
  );
  if (found.rows[0]?.found !== true) return 0;
  const row = await db.query<{ version: number }>(
    `SELECT coalesce(max(version), 0)::int AS version FROM ${quoteIdent(schema)}.concurrency_schema_version`,
  );
  return row.rows[0]?.version ?? 0;
}

/**
 * Creates the tables, or brings an older schema up to date. Many workers may start at once,
 * on a fresh database or on an old schema: CREATE ... IF NOT EXISTS alone still races on the
 * catalog, so the check and the DDL run again under a transaction-scoped advisory lock. Plain
 * statements in one transaction: this works behind a transaction-mode pooler too.
 */
export async function ensureSchema(db: Database, schema: string): Promise<void> {
  if ((await currentVersion(db, schema)) >= schemaVersion) return;
  await db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', [`sluice:schema:${schema}`]);
    const from = await currentVersion(tx, schema);
    if (from >= schemaVersion) return;
    for (const statement of statements(upgradeSql(schema, from))) await tx.query(statement);
  });
}
