import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Page } from 'playwright-core';
import { expect, inject, it } from 'vitest';
import { createAgent, createConcurrencyLimiter } from 'sluice';
import { ManualClock } from 'sluice/concurrency';
import { afterThisTest, freshDatabase, postgres, startTestServer, until } from '../helpers.js';
import { gatedStandIn } from './ops-helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/** Debian's package, found by the global setup; CI installs it (.ci/run). Nothing is downloaded at test time. */
const CHROMIUM = inject('chromium') ?? '/usr/bin/chromium';
const repoRoot = fileURLToPath(new URL('../../../../', import.meta.url));
/** Kept by CI as an artifact; docs/dashboard.png is a copy of one. */
const SCREENSHOT = join(repoRoot, '.sluice', 'dashboard.png');

async function openBrowser() {
  const profile = mkdtempSync(join(tmpdir(), 'sluice-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1000, height: 420 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  afterThisTest(async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  });
  return context;
}

const cellText = (page: Page, row: string, field: string) =>
  page.locator(`${row} td[data-field="${field}"]`).textContent({ timeout: 20_000 });

/** Waits until the page shows `value` in that cell; the page changes it by itself, by polling. */
async function shows(page: Page, row: string, field: string, value: string): Promise<void> {
  await page.waitForFunction(textIs, [`${row} td[data-field="${field}"]`, value] as const, {
    timeout: 20_000,
    polling: 100,
  });
}

/**
 * Runs in the page (as a function: the page's CSP forbids evaluating strings). The test compiles
 * without DOM types, hence the cast.
 */
function textIs([selector, want]: readonly [string, string]): boolean {
  type Doc = { querySelector(s: string): { textContent: string | null } | null };
  const doc = (globalThis as unknown as { document: Doc }).document;
  return doc.querySelector(selector)?.textContent === want;
}

function includesText([selector, want]: readonly [string, string]): boolean {
  type Doc = { querySelector(s: string): { textContent: string | null } | null };
  const doc = (globalThis as unknown as { document: Doc }).document;
  return doc.querySelector(selector)?.textContent?.includes(want) === true;
}

// Without Chromium this suite is skipped, saying so; under CI the run fails (scripts/test-services.ts).
describeWith({ Chromium: inject('chromium') })('GET /dashboard', () => {
  it('shows slots, runs and refusals live after sign-in, loading nothing from elsewhere', async () => {
    const browser = openBrowser();
    const { provider, release } = await gatedStandIn();
    // Budgets refill with time: on a still clock the page's figures are exact.
    const limiter = createConcurrencyLimiter({
      name: 'claude',
      maxConcurrent: 1,
      rate: { requestsPerMinute: 600, tokensPerMinute: 100_000 },
      adaptive: true,
      clock: new ManualClock(),
    });
    // The operator's secret: the page then shows every tenant (an admin token sees its own).
    const operator = 'operator-secret-0123456789';
    process.env.SLUICE_METRICS_TOKEN = operator;
    let t;
    try {
      [t] = await Promise.all([
        startTestServer({
          provider,
          databaseUrl: postgres ? await freshDatabase() : undefined,
          settings: { maxActivePerTenant: 1 },
          agents: (model) => ({
            analyst: createAgent({ model, credentials: { apiKey: 'k' }, concurrency: { limiter } }),
          }),
        }),
        // Chromium starts meanwhile: both take seconds.
        browser,
      ]);
    } finally {
      delete process.env.SLUICE_METRICS_TOKEN;
    }
    const origin = new URL(t.server.url).origin;

    const context = await browser;
    const page = await context.newPage();
    const requests: string[] = [];
    page.on('request', (request) => requests.push(request.url()));
    let navigations = 0;
    page.on('framenavigated', (frame) => {
      if (frame === page.mainFrame()) navigations++;
    });

    const response = await page.goto(`${t.server.url}/dashboard`);
    expect(response?.status()).toBe(200);
    const headers = response!.headers();
    expect(headers['content-security-policy']).toContain("default-src 'none'");
    expect(headers['content-security-policy']).toContain("connect-src 'self'");
    // The page itself carries no secret and needs none.
    expect(await response!.text()).not.toContain(operator);

    // A member token is refused by the overview route: the page says so and stays on sign-in.
    await page.fill('#token', await t.token({ role: 'member', user: 'm' }));
    await page.click('#sign-in button[type=submit]');
    await page.waitForSelector('#sign-in-error:not([hidden])');
    expect(await page.textContent('#sign-in-error')).toMatch(/needs the admin role/);
    expect(
      await page.evaluate(
        () => (globalThis as unknown as { sessionStorage: { length: number } }).sessionStorage.length,
      ),
    ).toBe(0);

    await page.fill('#token', operator);
    await page.click('#sign-in button[type=submit]');
    const slots = 'tr[data-limiter="claude"][data-workload="default"]';
    await shows(page, slots, 'active', '0');
    const capacity = '#capacity tr[data-limiter="claude"]';
    await shows(page, capacity, 'limit', '1');
    expect(await cellText(page, capacity, 'requests')).toBe('600 / 600');
    expect(await cellText(page, capacity, 'tokens')).toBe('100000 / 100000');
    expect(await cellText(page, capacity, 'inputTokens')).toBe('–');
    expect(await cellText(page, capacity, 'throttled')).toBe('0');
    expect(await page.isVisible('#sign-in')).toBe(false);
    expect(await page.isVisible('#sign-in-error')).toBe(false);
    expect(await page.isVisible('#board')).toBe(true);
    const signedInAt = navigations;

    // A run takes a slot: the number on the page changes without a reload.
    const run = await t.call('POST', '/agents/analyst/runs', { input: 'look', wait: false });
    expect(run.status).toBe(202);
    await until(() => provider.inFlight === 1, 'the run holds its slot');
    await shows(page, slots, 'active', '1');
    await shows(page, 'tr[data-tenant="t"][data-class="default"]', 'running', '1');
    // Another tenant's run waits for the one slot: queued on the limiter, running in the store.
    const other = await t.call(
      'POST',
      '/agents/analyst/runs',
      { input: 'wait', wait: false },
      await t.token({ tenant: 'u' }),
    );
    expect(other.status).toBe(202);
    await shows(page, slots, 'queued', '1');
    await shows(page, 'tr[data-tenant="u"][data-class="default"]', 'running', '1');
    // One request granted: one taken from the request budget.
    await shows(page, capacity, 'requests', '599 / 600');

    // Over the tenant's cap: the refusal is listed.
    const refused = await t.call('POST', '/agents/analyst/runs', { input: 'more', wait: false });
    expect(refused.status).toBe(429);
    await page.waitForFunction(includesText, ['#refusals tbody tr', 'max_active_runs'] as const, {
      timeout: 20_000,
      polling: 100,
    });
    mkdirSync(join(repoRoot, '.sluice'), { recursive: true });
    await page.screenshot({ path: SCREENSHOT, fullPage: true });

    release('look');
    await shows(page, slots, 'queued', '0');
    expect(await cellText(page, slots, 'active')).toBe('1');
    release('wait');
    await shows(page, slots, 'active', '0');
    await shows(page, capacity, 'requests', '598 / 600');

    // The provider answers a request 429 (here one sent on the limiter by another client): the
    // page counts the throttle.
    const lease = await limiter.acquire();
    await limiter.release(lease, { provider: { status: 429, retryAfterMs: 1000 } });
    await shows(page, capacity, 'throttled', '1');

    expect(navigations).toBe(signedInAt);
    expect(navigations).toBe(1);
    expect(requests.length).toBeGreaterThan(3);
    for (const url of requests) {
      expect(new URL(url).origin).toBe(origin);
      expect(url).not.toContain(operator);
    }
    expect(requests.filter((u) => u.endsWith('/api/client/v1/ops/overview')).length).toBeGreaterThan(2);
  });
});
