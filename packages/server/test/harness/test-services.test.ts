import { describe, expect, it } from 'vitest';
import { serviceDecision, underCi } from '../../../../scripts/test-services.js';

// The rule for suites that need PostgreSQL, Redis, PgBouncer or Chromium (scripts/test-services.ts),
// which the global setup and describeWith/itWith (scripts/service-suites.ts) both follow.

describe('a suite that needs a service', () => {
  it('runs when every service it needs is there, under CI or not', () => {
    for (const env of [{}, { CI: 'true' }]) {
      expect(serviceDecision('burst', { PostgreSQL: true, Redis: true }, env)).toEqual({ kind: 'run' });
      expect(serviceDecision('no needs', {}, env)).toEqual({ kind: 'run' });
    }
  });

  it('under CI (CI=true or CI=1) a missing service fails, naming the suite and the service', () => {
    for (const CI of ['true', 'TRUE', '1']) {
      const decision = serviceDecision('GET /dashboard', { Chromium: false }, { CI });
      expect(decision.kind).toBe('fail');
      expect(decision.kind === 'fail' && decision.message).toMatch(
        /^GET \/dashboard needs Chromium under CI \(no Chromium: \/usr\/bin\/chromium is not installed\)$/,
      );
    }
  });

  it('elsewhere it is skipped with one line saying which suite and why', () => {
    for (const env of [{}, { CI: '' }, { CI: 'false' }, { CI: '0' }]) {
      const decision = serviceDecision('the Redis cache store', { Redis: false }, env);
      expect(decision).toEqual({
        kind: 'skip',
        line: '[sluice] skipped the Redis cache store: no Redis: REDIS_URL does not answer and redis-server is not installed',
      });
    }
  });

  it('names every missing service, and only those', () => {
    const skip = serviceDecision('two processes', { PostgreSQL: false, Redis: true, PgBouncer: false }, {});
    expect(skip.kind === 'skip' && skip.line).toMatch(/no PostgreSQL: .*; no PgBouncer: /);
    expect(skip.kind === 'skip' && skip.line).not.toMatch(/no Redis/);
    expect(skip.kind === 'skip' && skip.line.includes('\n')).toBe(false);
    const fail = serviceDecision('two processes', { PostgreSQL: false, Redis: false }, { CI: 'true' });
    expect(fail.kind === 'fail' && fail.message).toMatch(
      /^two processes needs PostgreSQL and Redis under CI/,
    );
  });

  it('reads CI as CI services set it', () => {
    expect([underCi({ CI: 'true' }), underCi({ CI: '1' }), underCi({ CI: 'True' })]).toEqual([
      true,
      true,
      true,
    ]);
    expect([
      underCi({}),
      underCi({ CI: 'false' }),
      underCi({ CI: '0' }),
      underCi({ CI: 'yes please' }),
    ]).toEqual([false, false, false, false]);
  });
});
