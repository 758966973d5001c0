/**
 * Model-based test of the cap rule as the server applies it: random sequences of admission
 * batches, promotions, claims and ends run against the server's own decisions (`decideByCounts`
 * over a `Tally` of the counters, `highestCounts` for the fast path, `choosePromotions`, and
 * `hasRoom` for the deferred running cap) and against a deliberately naive reference written
 * from the rules: count the runs in a list, compare with the cap. After every step the two must
 * agree on every decision, and no count may be above its cap.
 *
 * The counters the server reads are given as the true counts of the model's runs: that the
 * database keeps them so is admission-counters.test.ts's job.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decideByCounts, highestCounts, Tally, type Counted } from '../../src/runs/admission-counts.js';
import { hasRoom } from '../../src/runs/caps.js';
import { bornStatus, type RunClass, type RunStatus } from '../../src/runs/lifecycle.js';
import type { TenantLimits } from '../../src/runs/policy.js';
import { choosePromotions } from '../../src/runs/scheduler.js';
import type { AdmissionCounters, NewRun } from '../../src/runs/store.js';

interface Limits extends TenantLimits {
  deferredRunning: number;
}

type Kind = 'queued' | 'inline' | 'scheduled' | 'deferred' | 'deferredScheduled';

type Op =
  | { kind: 'admit'; tenant: number; runs: { project: number; kind: Kind }[]; drift: number[] }
  | { kind: 'promote'; tenant: number }
  | { kind: 'claim'; class: RunClass }
  | { kind: 'end'; pick: number };

interface ModelRun {
  id: string;
  tenant: string;
  project: string;
  class: RunClass;
  status: RunStatus;
}

const TENANTS = ['ta', 'tb'];
const PROJECTS = ['p0', 'p1'];
type CountedSet = 'active' | 'scheduled' | 'deferred';
const SETS: CountedSet[] = ['active', 'scheduled', 'deferred'];

const limitsArb: fc.Arbitrary<Limits> = fc.record({
  activePerTenant: fc.integer({ min: 0, max: 4 }),
  activePerProject: fc.integer({ min: 0, max: 3 }),
  deferredQueued: fc.integer({ min: 0, max: 3 }),
  scheduled: fc.integer({ min: 0, max: 3 }),
  deferredRunning: fc.integer({ min: 0, max: 2 }),
});

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('admit' as const),
      tenant: fc.integer({ min: 0, max: 1 }),
      runs: fc.array(
        fc.record({
          project: fc.integer({ min: 0, max: 1 }),
          kind: fc.constantFrom<Kind>('queued', 'inline', 'scheduled', 'deferred', 'deferredScheduled'),
        }),
        { minLength: 1, maxLength: 5 },
      ),
      // How far each count (3 rows x 3 sets) moves between the plain read and the fast path's check.
      drift: fc.array(fc.integer({ min: -1, max: 2 }), { minLength: 9, maxLength: 9 }),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant('promote' as const), tenant: fc.integer({ min: 0, max: 1 }) }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('claim' as const),
      class: fc.constantFrom<RunClass>('default', 'deferred'),
    }),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('end' as const), pick: fc.nat() }) },
);

// ── The reference: the rules, written again with lists ───────────────────────────────────

function setOfStored(run: Pick<ModelRun, 'class' | 'status'>): CountedSet | undefined {
  if (run.class === 'default') {
    if (run.status === 'queued' || run.status === 'running') return 'active';
    if (run.status === 'scheduled') return 'scheduled';
  } else if (run.status === 'queued' || run.status === 'scheduled') return 'deferred';
  return undefined;
}

const countIn = (runs: ModelRun[], tenant: string, set: CountedSet, project?: string) =>
  runs.filter(
    (r) => r.tenant === tenant && setOfStored(r) === set && (project === undefined || r.project === project),
  ).length;

const tenantCap = (set: CountedSet, limits: Limits) =>
  set === 'active' ? limits.activePerTenant : set === 'scheduled' ? limits.scheduled : limits.deferredQueued;

const newSet = (kind: Kind): CountedSet =>
  kind === 'deferred' || kind === 'deferredScheduled'
    ? 'deferred'
    : kind === 'scheduled'
      ? 'scheduled'
      : 'active';

/** The naive answer for one new run: which cap refuses it, and the count it found there. */
function modelRefusal(
  runs: ModelRun[],
  tenant: string,
  project: string,
  kind: Kind,
  limits: Limits,
): { scope: 'tenant' | 'project'; limitValue: number; active: number } | undefined {
  const set = newSet(kind);
  const cap = tenantCap(set, limits);
  const n = countIn(runs, tenant, set);
  if (cap > 0 && n >= cap) return { scope: 'tenant', limitValue: cap, active: n };
  if (set === 'active' && limits.activePerProject > 0) {
    const np = countIn(runs, tenant, set, project);
    if (np >= limits.activePerProject)
      return { scope: 'project', limitValue: limits.activePerProject, active: np };
  }
  return undefined;
}

function modelStatus(kind: Kind): RunStatus {
  if (kind === 'scheduled' || kind === 'deferredScheduled') return 'scheduled';
  return kind === 'inline' ? 'running' : 'queued';
}

// ── What the server is given ─────────────────────────────────────────────────────────────

function newRunOf(kind: Kind): NewRun {
  return {
    agent: 'echo',
    class: kind === 'deferred' || kind === 'deferredScheduled' ? 'deferred' : 'default',
    mode: kind === 'inline' ? 'inline' : 'queued',
    input: 'x',
    metadata: {},
    worker: 'w',
    ...(kind === 'scheduled' || kind === 'deferredScheduled' ? { schedule: { delayMs: 1 } } : {}),
  };
}

/** The counter rows the database would hold for `tenant`: the true counts. */
function countersOf(runs: ModelRun[], tenant: string): Map<string, AdmissionCounters> {
  const row = (project?: string): AdmissionCounters => ({
    project: project ?? '',
    default_active: countIn(runs, tenant, 'active', project),
    default_scheduled: countIn(runs, tenant, 'scheduled', project),
    deferred_waiting: countIn(runs, tenant, 'deferred', project),
    active_left: '0',
    scheduled_left: '0',
    deferred_left: '0',
  });
  return new Map([['', row()], ...PROJECTS.map((p) => [p, row(p)] as const)]);
}

const countOf = (row: AdmissionCounters, set: CountedSet) =>
  set === 'active' ? row.default_active : set === 'scheduled' ? row.default_scheduled : row.deferred_waiting;

/**
 * The fast path's check on counters that moved after the read: `sluice_admit_runs` writes only
 * when no count is above its bound (a NULL bound checks nothing).
 */
function fastPathWrites(bounds: ReturnType<typeof highestCounts>, counters: Map<string, AdmissionCounters>) {
  return bounds.every((bound) =>
    SETS.every((set) => {
      const highest = bound[set];
      const row = counters.get(bound.project);
      return highest === null || row === undefined || countOf(row, set) <= highest;
    }),
  );
}

/** The naive answer: would every one of `admitted` (in order) still fit on these counters? */
function allStillFit(admitted: Counted[], counters: Map<string, AdmissionCounters>, limits: Limits) {
  const counts = new Map(
    [...counters].map(([p, row]) => [p, Object.fromEntries(SETS.map((s) => [s, countOf(row, s)]))]),
  );
  return admitted.every((item) => {
    const kind: Kind =
      item.run.class === 'deferred' ? 'deferred' : item.run.schedule !== undefined ? 'scheduled' : 'queued';
    const set = newSet(kind);
    const cap = tenantCap(set, limits);
    const tenantRow = counts.get('')!;
    const projectRow = counts.get(item.who.project)!;
    if (cap > 0 && tenantRow[set]! >= cap) return false;
    if (set === 'active' && limits.activePerProject > 0 && projectRow[set]! >= limits.activePerProject)
      return false;
    tenantRow[set]!++;
    projectRow[set]!++;
    return true;
  });
}

function drifted(counters: Map<string, AdmissionCounters>, drift: number[]): Map<string, AdmissionCounters> {
  const rows = ['', ...PROJECTS];
  return new Map(
    rows.map((project, r) => {
      const row = counters.get(project)!;
      const moved = (set: CountedSet, s: number) => Math.max(0, countOf(row, set) + drift[r * 3 + s]!);
      return [
        project,
        {
          ...row,
          default_active: moved('active', 0),
          default_scheduled: moved('scheduled', 1),
          deferred_waiting: moved('deferred', 2),
        },
      ];
    }),
  );
}

// ── The run ──────────────────────────────────────────────────────────────────────────────

function check(limits: Limits, ops: Op[]): void {
  const runs: ModelRun[] = [];
  let next = 0;
  for (const op of ops) {
    if (op.kind === 'admit') {
      const tenant = TENANTS[op.tenant]!;
      const counters = countersOf(runs, tenant);
      const batch: Counted[] = op.runs.map((r) => ({
        who: { project: PROJECTS[r.project]! },
        run: newRunOf(r.kind),
        limits,
      }));
      const decided = decideByCounts(new Tally(counters), batch);
      const admitted: Counted[] = [];
      op.runs.forEach((r, i) => {
        const project = PROJECTS[r.project]!;
        const expected = modelRefusal(runs, tenant, project, r.kind, limits);
        const refusal = decided[i];
        // Counts alone only ever refuse for a cap.
        if (refusal) expect(refusal.kind).toBe('concurrency');
        const shown = refusal?.kind === 'concurrency' && {
          scope: refusal.scope,
          limitValue: refusal.limitValue,
          active: refusal.active,
        };
        expect(shown || undefined).toEqual(expected);
        if (expected) return;
        expect(bornStatus(batch[i]!.run)).toBe(modelStatus(r.kind));
        admitted.push(batch[i]!);
        runs.push({
          id: `r${next++}`,
          tenant,
          project,
          class: batch[i]!.run.class,
          status: modelStatus(r.kind),
        });
      });
      // The fast path writes the admitted runs on moved counters exactly when they all still fit.
      const moved = drifted(counters, op.drift);
      expect(fastPathWrites(highestCounts(admitted, ['', ...PROJECTS]), moved)).toBe(
        allStillFit(admitted, moved, limits),
      );
    } else if (op.kind === 'promote') {
      const tenant = TENANTS[op.tenant]!;
      for (const r of runs)
        if (r.tenant === tenant && r.class === 'deferred' && r.status === 'scheduled') r.status = 'queued';
      const due = runs.filter(
        (r) => r.tenant === tenant && r.class === 'default' && r.status === 'scheduled',
      );
      const active = new Map(PROJECTS.map((p) => [p, countIn(runs, tenant, 'active', p)]));
      const chosen = choosePromotions(due, active, limits);
      // The rule: in due order, a run goes while the tenant and its project are under their caps;
      // a full tenant stops the pass, a full project skips its own runs.
      const expected: string[] = [];
      for (const r of due) {
        const n = countIn(runs, tenant, 'active');
        if (limits.activePerTenant > 0 && n >= limits.activePerTenant) break;
        if (
          limits.activePerProject > 0 &&
          countIn(runs, tenant, 'active', r.project) >= limits.activePerProject
        )
          continue;
        r.status = 'queued';
        expected.push(r.id);
      }
      expect(chosen).toEqual(expected);
    } else if (op.kind === 'claim') {
      const queued = runs.filter((r) => r.class === op.class && r.status === 'queued');
      const runningOf = (tenant: string) =>
        runs.filter((r) => r.tenant === tenant && r.class === 'deferred' && r.status === 'running').length;
      const server = queued.find(
        (r) => op.class === 'default' || hasRoom(runningOf(r.tenant), limits.deferredRunning),
      );
      const model = queued.find(
        (r) =>
          op.class === 'default' ||
          limits.deferredRunning === 0 ||
          runningOf(r.tenant) < limits.deferredRunning,
      );
      expect(server?.id).toBe(model?.id);
      if (model) model.status = 'running';
    } else {
      const live = runs.filter(
        (r) => r.status === 'scheduled' || r.status === 'queued' || r.status === 'running',
      );
      if (live.length > 0) live[op.pick % live.length]!.status = 'succeeded';
    }
    for (const tenant of TENANTS) {
      for (const set of SETS) {
        const cap = tenantCap(set, limits);
        if (cap > 0) expect(countIn(runs, tenant, set)).toBeLessThanOrEqual(cap);
      }
      for (const project of PROJECTS) {
        if (limits.activePerProject > 0)
          expect(countIn(runs, tenant, 'active', project)).toBeLessThanOrEqual(limits.activePerProject);
      }
      const running = runs.filter(
        (r) => r.tenant === tenant && r.class === 'deferred' && r.status === 'running',
      );
      if (limits.deferredRunning > 0) expect(running.length).toBeLessThanOrEqual(limits.deferredRunning);
    }
  }
}

describe('the cap rule against a naive model', () => {
  it('admission, the fast path bound, promotion and the deferred claim agree with counting a list, and keep every cap', () => {
    fc.assert(
      fc.property(limitsArb, fc.array(opArb, { maxLength: 40 }), (limits, ops) => check(limits, ops)),
      { numRuns: 500 },
    );
  });
});
