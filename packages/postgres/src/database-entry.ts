/**
 * `@sluice/postgres/database`: the small driver layer the limiter runs on, for code that wants
 * the same `Database` over node-postgres or PGlite (the run server's store uses it).
 */
export { toDatabase, fromPgPool, fromPGlite, prepared } from './database.js';
export type { PgPoolOptions } from './database.js';
export type {
  Database,
  DatabaseInput,
  SqlClient,
  QueryResult,
  ListenSession,
  ListenOptions,
} from './database.js';
export { statements as splitSqlStatements, quoteIdent } from './schema.js';
