/**
 * What the test run does when a service a suite needs is not there. One rule, used by the
 * global setup (scripts/vitest-global-setup.ts) and by every suite that needs a service
 * (scripts/service-suites.ts):
 * - under CI (CI=true or CI=1) a missing service fails: a CI run that quietly skipped the
 *   multi-process and database suites would pass while proving nothing;
 * - elsewhere the suite is skipped, and says so in one line naming the suite, the service and
 *   why, so a developer without Redis or Chromium still sees what went untested.
 */

export type TestService = 'PostgreSQL' | 'Redis' | 'PgBouncer' | 'Chromium';

/** How each service is made available, for the line that says why it is not. */
const remedy: Record<TestService, string> = {
  PostgreSQL: 'no server answered or could be started (scripts/postgres.mjs)',
  Redis: 'REDIS_URL does not answer and redis-server is not installed',
  PgBouncer: 'PGBOUNCER_URL is not set and pgbouncer is not installed',
  Chromium: '/usr/bin/chromium is not installed',
};

export type ServiceDecision =
  { kind: 'run' } | { kind: 'skip'; line: string } | { kind: 'fail'; message: string };

/** Whether this is a CI run: CI set to `true` or `1` (any case), as CI services set it. */
export function underCi(env: NodeJS.ProcessEnv): boolean {
  return /^(true|1)$/i.test(env.CI ?? '');
}

/**
 * What to do with `suite` (a test file or block; for the global setup, the suites of a whole
 * service), given which of the services it needs are there.
 */
export function serviceDecision(
  suite: string,
  needs: Partial<Record<TestService, boolean>>,
  env: NodeJS.ProcessEnv,
): ServiceDecision {
  const missing = (Object.keys(needs) as TestService[]).filter((service) => !needs[service]);
  if (missing.length === 0) return { kind: 'run' };
  const why = missing.map((service) => `no ${service}: ${remedy[service]}`).join('; ');
  if (underCi(env))
    return { kind: 'fail', message: `${suite} needs ${missing.join(' and ')} under CI (${why})` };
  return { kind: 'skip', line: `[sluice] skipped ${suite}: ${why}` };
}
