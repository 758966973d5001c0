import {
  trace,
  type Attributes,
  type Span,
  type SpanOptions,
  type Tracer,
  type TracerProvider,
} from '@opentelemetry/api';
import { afterEach, expect, it } from 'vitest';
import { until } from '../harness/index.js';
import { startGatewayServer } from './harness.js';

// Item 7: the gateway's series, its span for each upstream exchange, and the dashboard's
// overview of gateway traffic per tenant.

interface Recorded {
  name: string;
  attributes: Attributes;
  ended: boolean;
}

/** The least of an OpenTelemetry SDK: it keeps every span started, with its attributes. */
function recordingProvider(spans: Recorded[]): TracerProvider {
  const start = (name: string, options?: SpanOptions): Span => {
    const record: Recorded = { name, attributes: { ...options?.attributes }, ended: false };
    spans.push(record);
    const span: Span = {
      spanContext: () => ({ traceId: '0'.repeat(32), spanId: '0'.repeat(16), traceFlags: 1 }),
      setAttribute: (key, value) => ((record.attributes[key] = value), span),
      setAttributes: (attributes) => (Object.assign(record.attributes, attributes), span),
      addEvent: () => span,
      addLink: () => span,
      addLinks: () => span,
      setStatus: () => span,
      updateName: () => span,
      end: () => void (record.ended = true),
      isRecording: () => true,
      recordException: () => undefined,
    };
    return span;
  };
  const tracer: Tracer = {
    startSpan: start,
    startActiveSpan: ((name: string, ...rest: unknown[]) => {
      const fn = rest.at(-1) as (span: Span) => unknown;
      return fn(start(name, typeof rest[0] === 'object' ? (rest[0] as SpanOptions) : undefined));
    }) as Tracer['startActiveSpan'],
  };
  return { getTracer: () => tracer };
}

afterEach(() => trace.disable());

it('counts requests by gateway and status, times the upstream, draws a span with the slot wait, and shows each tenant its own traffic', async () => {
  const spans: Recorded[] = [];
  trace.setGlobalTracerProvider(recordingProvider(spans));
  const s = await startGatewayServer({
    standIn: {
      reply: (r) =>
        String(r.messages.at(-1)?.content).includes('refuse')
          ? { status: 400, message: 'no' }
          : { text: 'ok', usage: { input: 11, output: 7 } },
    },
  });
  const a = await s.token({ tenant: 'a' });
  const b = await s.token({ tenant: 'b' });
  const ask = (token: string, content: string) =>
    s.openai(token).chat.completions.create({ model: 'm', messages: [{ role: 'user', content }] });
  await ask(a, 'one');
  const streamed = await s.openai(a).chat.completions.create({
    model: 'm',
    messages: [{ role: 'user', content: 'two' }],
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const _ of streamed) void _;
  await s
    .anthropic(b)
    .messages.create({ model: 'c', max_tokens: 5, messages: [{ role: 'user', content: 'three' }] });
  await ask(b, 'refuse me').catch(() => undefined);
  await until(
    async () => (await s.call('GET', '/ops/overview', undefined, b)).body.gateways.length === 2,
    'b is counted',
  );

  const metrics = await s.call('GET', '/metrics', undefined, undefined, { fullPath: true, anyBody: true });
  const text = metrics.text!;
  expect(text).toContain('sluice_gateway_requests_total{gateway="openai",status="200"} 2');
  expect(text).toContain('sluice_gateway_requests_total{gateway="claude",status="200"} 1');
  expect(text).toContain('sluice_gateway_requests_total{gateway="openai",status="400"} 1');
  expect(text).toContain('sluice_gateway_upstream_seconds_count{gateway="openai"} 3');
  expect(text).toContain('sluice_gateway_upstream_seconds_count{gateway="claude"} 1');
  // The gateway's slots are the limiter's, as an agent's are.
  expect(text).toMatch(/sluice_limiter_wait_seconds_count\{limiter="provider",workload="default"\} 4/);

  const upstreamSpans = spans.filter((x) => x.name === 'sluice.gateway.upstream');
  expect(upstreamSpans).toHaveLength(4);
  expect(upstreamSpans[0]).toMatchObject({
    ended: true,
    attributes: {
      'sluice.gateway': 'openai',
      'sluice.tenant': 'a',
      'sluice.slot.held': true,
      'sluice.slot.wait_ms': expect.any(Number),
      'http.response.status_code': 200,
      'sluice.gateway.outcome': 'completed',
    },
  });

  // Each tenant's admin sees its own rows: the usage of the JSON answer and of the stream.
  const ofA = (await s.call('GET', '/ops/overview', undefined, a)).body.gateways;
  expect(ofA).toEqual([
    {
      tenant: 'a',
      gateway: 'openai',
      requests: 2,
      open: 0,
      statuses: { '2xx': 2 },
      inputTokens: 22,
      outputTokens: 14,
    },
  ]);
  const ofB = (await s.call('GET', '/ops/overview', undefined, b)).body.gateways;
  expect(ofB.map((r: { gateway: string; statuses: object }) => [r.gateway, r.statuses])).toEqual([
    ['claude', { '2xx': 1 }],
    ['openai', { '4xx': 1 }],
  ]);
}, 240_000);
