import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { serverOf } from './postgres-config.js';
// @ts-expect-error plain ESM script without types
import { ensurePostgres } from './postgres.mjs';

export interface PostgresTestConfig {
  host?: string;
  port?: number;
  user?: string;
  password?: string;
  database: string;
}

declare module 'vitest' {
  export interface ProvidedContext {
    /** Connection settings of a fresh database for this test run; `undefined` when PostgreSQL is unavailable. */
    postgres: PostgresTestConfig | undefined;
  }
}

/**
 * Finds or starts PostgreSQL, creates a database for this run, and drops it at the end.
 * Under CI=true a missing server fails the run instead of skipping the PostgreSQL suites.
 */
export default async function setup(project: TestProject) {
  const url = (await ensurePostgres()) as string | undefined;
  if (!url) {
    if (process.env.CI)
      throw new Error('PostgreSQL is required under CI=true, and none could be found or started');
    console.warn('\n[sluice] No PostgreSQL server could be found or started: its test suites are skipped.\n');
    project.provide('postgres', undefined);
    return;
  }
  const { server: config, database: adminDatabase } = serverOf(url);
  const database = `sluice_test_${Date.now().toString(36)}_${process.pid}`;
  const admin = new pg.Client({ ...config, database: adminDatabase });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${database}`);
  await admin.end();
  project.provide('postgres', { ...config, database });
  return async () => {
    const client = new pg.Client({ ...config, database: adminDatabase });
    await client.connect();
    await client.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    await client.end();
  };
}
