import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers.js';
import { errorShapeProblem, harnessConfig, mintTokens, type TokenName } from './principals.js';
import { fuzzCase, renderCase, routes, type CaseKind, type FuzzCase } from './fuzz-cases.js';
import { rawExchange, type RawExchange } from './raw-client.js';

/**
 * Generated requests, sent one by one over real sockets. The count is fixed (not a time
 * budget) so a loaded machine runs the same test, only slower. FUZZ_SEED replays a run.
 */
const FUZZ_CASES = 3_000;
const seed = process.env.FUZZ_SEED === undefined ? undefined : Number(process.env.FUZZ_SEED);

let server: TestServer;
let port: number;
let tokens: Record<TokenName, string>;
let runId: string;

beforeAll(async () => {
  // Held calls end within 10 s whatever a generated body asks for.
  const { config, provider } = await harnessConfig({ syncTimeoutMs: 10_000 });
  server = await startTestServer({ config, provider });
  port = Number(new URL(server.server.url).port);
  tokens = await mintTokens(server.server.store);
  runId = (await createRun()).body.id as string;
}, 180_000);

/** An ordinary run, as a member's client posts it. */
const createRun = () => server.call('POST', '/agents/echo/runs', { input: 'hello' }, tokens.member);

/** What is wrong with an exchange, or undefined. */
function problemOf(c: FuzzCase, exchange: RawExchange, halfClose: boolean): string | undefined {
  // A request that promised more body than it sent may be dropped unanswered; any other is answered.
  if (exchange.responses.length === 0) return halfClose ? undefined : 'no response';
  for (const [i, response] of exchange.responses.entries()) {
    if (response.status >= 500) return `${response.status}: ${response.body.slice(0, 300)}`;
    if (response.status < 400 || (c.method === 'HEAD' && i === 0)) continue;
    let body: unknown;
    try {
      body = JSON.parse(response.body);
    } catch {
      return `${response.status} with a body that is not JSON: ${JSON.stringify(response.body.slice(0, 200))}`;
    }
    const problem = errorShapeProblem(body);
    if (problem) return `${response.status}: ${problem}`;
  }
  // A request Node cannot parse is answered with a body even when it began with HEAD: Node
  // could not know. The connection closes after it, so no client misreads it.
  if (exchange.garbage !== '' && c.method !== 'HEAD')
    return `bytes after the responses: ${JSON.stringify(exchange.garbage.slice(0, 100))}`;
  return undefined;
}

function describeCase(c: FuzzCase): string {
  const body =
    c.body === undefined
      ? ''
      : ` body(${c.body.length}): ${JSON.stringify(c.body.subarray(0, 120).toString())}`;
  return `${c.kind}: ${c.method} ${c.target.slice(0, 200)} auth=${JSON.stringify(c.auth).slice(0, 80)} ct=${String(c.contentType)} framing=${JSON.stringify(c.framing)} headers=${JSON.stringify(c.headers)}${body}`;
}

describe('hostile HTTP input (issue 8, item 3)', () => {
  it(`${FUZZ_CASES} generated bodies, query strings, headers and paths at every route: no 5xx, every error in the API shape`, async () => {
    const byKind: Record<CaseKind, number> = { body: 0, query: 0, header: 0, path: 0 };
    const byStatus = new Map<number, number>();
    const seenRoutes = new Set<string>();
    let sent = 0;
    await fc.assert(
      fc.asyncProperty(fuzzCase, async (c) => {
        const rendered = renderCase(c, tokens, runId, port);
        const exchange = await rawExchange(port, rendered.bytes, {
          halfClose: rendered.halfClose,
          head: c.method === 'HEAD',
        });
        sent++;
        byKind[c.kind]++;
        const status = exchange.responses[0]?.status ?? 0;
        byStatus.set(status, (byStatus.get(status) ?? 0) + 1);
        const route = routes.find((r) => r.method === c.method && r.target === c.target);
        if (route) seenRoutes.add(`${route.method} ${route.target}`);
        const problem = problemOf(c, exchange, rendered.halfClose);
        if (problem) throw new Error(`${problem}\n  for ${describeCase(c)}`);
      }),
      { numRuns: FUZZ_CASES, seed, endOnFailure: false },
    );
    const statuses = [...byStatus].sort(([a], [b]) => a - b).map(([s, n]) => `${s || 'none'}: ${n}`);
    console.log(
      `fuzz: ${sent} requests (${Object.entries(byKind)
        .map(([k, n]) => `${k} ${n}`)
        .join(', ')}); first statuses ${statuses.join(', ')}`,
    );
    // Every real route was called as a client would call it, so none escaped the fuzz.
    expect([...seenRoutes].sort()).toEqual(routes.map((r) => `${r.method} ${r.target}`).sort());
    expect(sent).toBeGreaterThanOrEqual(FUZZ_CASES);
  }, 1_800_000);

  it('after the fuzz: /readyz is 200 and a normal run succeeds', async () => {
    const ready = await server.call('GET', '/readyz', undefined, null, { fullPath: true, anyBody: true });
    expect(ready.status).toBe(200);
    const run = await createRun();
    expect(run.status).toBe(200);
    expect(run.body).toMatchObject({ status: 'succeeded', output: { text: 'echo hello' } });
  }, 60_000);
});
