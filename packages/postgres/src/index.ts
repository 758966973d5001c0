/**
 * `@sluice/postgres`: one concurrency limit shared by many worker processes through
 * PostgreSQL, on node-postgres or embedded PGlite.
 */
export {
  createPostgresConcurrencyLimiter,
  PostgresConcurrencyLimiter,
  postgresLimiterDefaults,
} from './postgres-limiter.js';
export type { PostgresConcurrencyLimiterOptions } from './postgres-limiter.js';
export { postgresConcurrencySchemaSql, ensureSchema } from './schema.js';
export { toDatabase, fromPgPool, fromPGlite } from './database.js';
export { statements as splitSqlStatements, quoteIdent } from './schema.js';
export type { Database, DatabaseInput, SqlClient, QueryResult, ListenSession } from './database.js';
