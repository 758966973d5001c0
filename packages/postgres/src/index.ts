/**
 * `@sluice/postgres`: one concurrency limit shared by many worker processes through
 * PostgreSQL, on node-postgres or embedded PGlite. The driver layer is on the
 * `@sluice/postgres/database` subpath.
 */
export { createPostgresConcurrencyLimiter, PostgresConcurrencyLimiter } from './postgres-limiter.js';
export type { PostgresConcurrencyLimiterOptions, PostgresSettings } from './options.js';
export { postgresConcurrencySchemaSql } from './schema.js';
export type { DatabaseInput } from './database.js';
