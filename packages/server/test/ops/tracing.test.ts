import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';
import { startProviderStandIn, toolThenAnswer } from '@sluice/testkit';
import { afterThisTest, postgres } from '../helpers.js';
import { bin, processEnv, send, servingLine, spawnProcess, testDatabase } from '../process/harness.js';
import { describeWith } from '../../../../scripts/service-suites.js';

// A real `sluice serve` process exporting its spans over OTLP/HTTP (JSON) to a receiver in this
// test; a preloaded probe prints how many of the SDK's modules the process had loaded at exit.

const config = fileURLToPath(new URL('./fixtures/ops.config.ts', import.meta.url));
const probe = fileURLToPath(new URL('./fixtures/loaded-modules.mjs', import.meta.url));
const sdkModules = /^otel-sdk-modules (\d+)$/m;

interface Span {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  attributes: Record<string, string | number | boolean>;
}

type OtlpValue = {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
};

/** An OTLP/HTTP receiver for JSON trace exports: every body as received, and the spans in them. */
async function startReceiver() {
  const bodies: string[] = [];
  const server = createServer((request, response) => {
    let body = '';
    request.on('data', (chunk: Buffer) => (body += chunk.toString()));
    request.on('end', () => {
      if (request.url === '/v1/traces') bodies.push(body);
      response.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  afterThisTest(() => new Promise((resolve) => server.close(() => resolve())));
  const spans = (): Span[] =>
    bodies.flatMap((body) => {
      const parsed = JSON.parse(body) as {
        resourceSpans: {
          scopeSpans: {
            spans: (Omit<Span, 'attributes'> & { attributes?: { key: string; value: OtlpValue }[] })[];
          }[];
        }[];
      };
      return parsed.resourceSpans.flatMap((r) =>
        r.scopeSpans.flatMap((s) =>
          s.spans.map((span) => ({
            ...span,
            attributes: Object.fromEntries(
              (span.attributes ?? []).map(({ key, value }) => [
                key,
                value.stringValue ??
                  (value.intValue === undefined ? undefined : Number(value.intValue)) ??
                  value.doubleValue ??
                  value.boolValue!,
              ]),
            ),
          })),
        ),
      );
    });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, bodies, spans };
}

/** `sluice serve` on the ops config with the module probe preloaded. */
async function startServer(env: Record<string, string>) {
  const proc = spawnProcess(
    process.execPath,
    ['--import', probe, bin, 'serve', '--port', '0', '--config', config],
    { cwd: fileURLToPath(new URL('.', import.meta.url)), env: processEnv(env) },
  );
  const [, url] = await proc.waitFor(servingLine);
  return { ...proc, url: url! };
}

describeWith({ PostgreSQL: postgres })('traces of a server process', () => {
  it('exports run → agent run → turn → provider request (slot wait) and tool call spans over OTLP, without the prompt', async () => {
    const database = await testDatabase();
    const receiver = await startReceiver();
    const provider = await startProviderStandIn({
      reply: toolThenAnswer(() => [{ name: 'lookup', arguments: { word: 'tide' } }]),
    });
    afterThisTest(() => provider.close());
    const server = await startServer({
      DATABASE_URL: database.url,
      PROVIDER_URL: provider.url,
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
    });
    const { secret: token } = await database.token({ tenant: 'acme' });
    const marker = `PROMPT-MARKER-${randomBytes(8).toString('hex')}`;

    const run = await send(server.url, 'POST', '/api/client/v1/agents/traced/runs', {
      token,
      body: { input: `${marker} look up a word` },
    });
    expect(run.status).toBe(200);
    expect(run.body.status).toBe('succeeded');
    // The drain on SIGTERM ends with the SDK's shutdown, which sends every batched span.
    server.child.kill('SIGTERM');
    expect((await server.closed).code).toBe(0);
    expect(Number(sdkModules.exec(server.output())?.[1])).toBeGreaterThan(0);

    const spans = receiver.spans();
    const named = (name: string) => spans.filter((s) => s.name === name);
    const parentOf = (span: Span) => spans.find((s) => s.spanId === span.parentSpanId);

    const [runSpan, ...moreRuns] = named('sluice.run');
    expect(moreRuns).toEqual([]);
    expect(runSpan!.attributes).toMatchObject({
      'sluice.run.id': run.body.id,
      'sluice.agent': 'traced',
      'sluice.run.class': 'default',
      'sluice.tenant': 'acme',
      'sluice.run.status': 'succeeded',
    });
    const [agentRun] = named('sluice.agent.run');
    expect(parentOf(agentRun!)).toBe(runSpan);
    expect(agentRun!.attributes).toMatchObject({ 'sluice.limiter': 'stand-in', 'sluice.turns': 2 });

    // Two turns: the one that asks for the tool, the one that answers.
    const turns = named('sluice.turn');
    expect(turns.map((t) => t.attributes['sluice.turn.index']).sort()).toEqual([0, 1]);
    for (const turn of turns) expect(parentOf(turn)).toBe(agentRun);

    const requests = named('sluice.provider.request');
    expect(requests).toHaveLength(2);
    for (const request of requests) {
      expect(turns).toContain(parentOf(request));
      expect(request.attributes['sluice.slot_wait_ms']).toEqual(expect.any(Number));
      expect(request.attributes['sluice.limiter']).toBe('stand-in');
      expect(request.attributes['http.response.status_code']).toBe(200);
    }
    expect(new Set(requests.map(parentOf))).toEqual(new Set(turns));

    const [toolCall, ...moreCalls] = named('sluice.tool.call');
    expect(moreCalls).toEqual([]);
    const firstTurn = turns.find((t) => t.attributes['sluice.turn.index'] === 0);
    expect(parentOf(toolCall!)).toBe(firstTurn);
    expect(toolCall!.attributes).toMatchObject({
      'sluice.tool.name': 'lookup',
      'sluice.tool.call_id': expect.any(String),
      'sluice.tool.outcome': 'ok',
    });

    // One trace, and the prompt nowhere in what was exported.
    expect(new Set(spans.map((s) => s.traceId)).size).toBe(1);
    expect(receiver.bodies.join('\n')).not.toContain(marker);
    expect(receiver.bodies.join('\n')).not.toContain('PROMPT-MARKER');
  });

  it('loads none of the SDK without OTEL_EXPORTER_OTLP_ENDPOINT', async () => {
    const database = await testDatabase();
    const server = await startServer({ DATABASE_URL: database.url, PROVIDER_URL: 'http://127.0.0.1:9' });
    server.child.kill('SIGTERM');
    expect((await server.closed).code).toBe(0);
    expect(sdkModules.exec(server.output())?.[1]).toBe('0');
  });
});
