import { describe, it } from 'vitest';
import { serviceDecision, type TestService } from './test-services.js';

/**
 * `describe` and `it` for suites that need services, as `describe.runIf` is used, with the rule
 * of test-services.ts: `describeWith({ PostgreSQL: postgres })('name', () => { ... })` runs the
 * block when every service given is there (a truthy value: a config, a URL), prints one line and
 * skips it elsewhere, and under CI fails in its place with what is missing.
 */
type Needs = Partial<Record<TestService, unknown>>;

const decide = (name: string, needs: Needs) =>
  serviceDecision(
    name,
    Object.fromEntries(Object.entries(needs).map(([service, value]) => [service, Boolean(value)])),
    process.env,
  );

export function describeWith(needs: Needs) {
  return (name: string, body: () => void, timeout?: number): void => {
    const decision = decide(name, needs);
    if (decision.kind === 'fail') {
      describe(name, () =>
        it('has the services it needs', () => {
          throw new Error(decision.message);
        }),
      );
      return;
    }
    if (decision.kind === 'skip') console.warn(decision.line);
    describe.runIf(decision.kind === 'run')(name, body, timeout);
  };
}

export function itWith(needs: Needs) {
  return (name: string, body: () => Promise<unknown> | void, timeout?: number): void => {
    const decision = decide(name, needs);
    if (decision.kind === 'fail') {
      it(name, () => {
        throw new Error(decision.message);
      });
      return;
    }
    if (decision.kind === 'skip') console.warn(decision.line);
    it.runIf(decision.kind === 'run')(name, body, timeout);
  };
}
