import { describe, expect, it } from 'vitest';
import { createConcurrencyLimiter } from 'sluice';
import { resolveGateway, resolveGateways } from '../../src/gateway/config.js';
import { estimateTokens } from '../../src/gateway/estimate.js';
import { jsonUsageReader, sseUsageReader } from '../../src/gateway/usage.js';

// The gateway's pure parts: the usage readers, the token estimate, the config's checks.

/** Feeds `text` to a reader cut at every position in turn; all must read the same usage. */
function readAtEveryCut(text: string) {
  const bytes = Buffer.from(text);
  const results = new Set<string>();
  for (let cut = 0; cut <= bytes.length; cut++) {
    const reader = sseUsageReader();
    reader.push(bytes.subarray(0, cut));
    reader.push(bytes.subarray(cut));
    results.add(JSON.stringify(reader.end()));
  }
  return [...results];
}

describe('usage readers', () => {
  it('OpenAI chat stream: the last chunk with include_usage, cut anywhere, CRLF lines, a multi-byte character', () => {
    const text =
      'data: {"choices":[{"delta":{"content":"é✓ usage"}}]}\r\n\r\n' +
      'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5}}\r\n\r\ndata: [DONE]\r\n\r\n';
    expect(readAtEveryCut(text)).toEqual([JSON.stringify({ input: 12, output: 5 })]);
  });

  it('Anthropic stream: input from message_start (with the cache), output from the last message_delta', () => {
    const text = [
      'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":20,"cache_read_input_tokens":5,"output_tokens":1}}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"a"}}\n\n',
      'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":4}}\n\n',
      'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":9}}\n\n',
    ].join('');
    expect(readAtEveryCut(text)).toEqual([JSON.stringify({ input: 25, output: 9 })]);
  });

  it('Responses stream: response.completed; no usage at all reads as none; garbage is ignored', () => {
    expect(
      readAtEveryCut(
        'event: response.completed\ndata: {"type":"response.completed","response":{"usage":{"input_tokens":3,"output_tokens":2}}}\n\n',
      ),
    ).toEqual([JSON.stringify({ input: 3, output: 2 })]);
    const none = sseUsageReader();
    none.push(Buffer.from('data: {"choices":[]}\n\ndata: {"usage": not json\n\n: comment\n\n'));
    expect(none.end()).toBeUndefined();
  });

  it('JSON bodies of each API; a body that is not JSON has no usage', () => {
    const read = (text: string) => {
      const reader = jsonUsageReader();
      reader.push(Buffer.from(text));
      return reader.end();
    };
    expect(read('{"usage":{"prompt_tokens":7,"completion_tokens":3}}')).toEqual({ input: 7, output: 3 });
    expect(read('{"usage":{"prompt_tokens":7,"total_tokens":7}}')).toEqual({ input: 7, output: 0 });
    expect(read('{"usage":{"input_tokens":4,"output_tokens":6}}')).toEqual({ input: 4, output: 6 });
    expect(read('{"input_tokens":4}')).toBeUndefined();
    expect(read('<html>bad gateway</html>')).toBeUndefined();
    expect(read('{"usage":{"prompt_tokens":-1,"completion_tokens":"many"}}')).toBeUndefined();
  });
});

describe('token estimate', () => {
  it('input from what the model reads, output from the request cap of either API', () => {
    expect(
      estimateTokens({ messages: [{ role: 'user', content: 'x'.repeat(400) }], max_tokens: 50 }),
    ).toEqual({
      input: Math.ceil((4 + 4 + 7 + 400) / 4),
      output: 50,
    });
    expect(estimateTokens({ input: 'y'.repeat(40), max_output_tokens: 9 }).output).toBe(9);
    expect(estimateTokens({ messages: [], max_completion_tokens: 12 }).output).toBe(12);
    expect(estimateTokens({ max_tokens: -5, messages: 'abcd' })).toEqual({ input: 1, output: 0 });
    expect(estimateTokens(null)).toEqual({ input: 0, output: 0 });
    expect(estimateTokens(JSON.parse('{"__proto__": {"max_tokens": 1e9}, "model": "m"}'))).toEqual({
      input: 0,
      output: 0,
    });
  });
});

describe('config checks', () => {
  const limiter = createConcurrencyLimiter({ name: 'l', maxConcurrent: 1, workloads: { interactive: {} } });
  const good = {
    api: 'openai',
    upstream: 'https://api.example.com/v1',
    limiter,
    apiKey: 'sk-very-secret-key',
  };

  it('takes the upstream apart once: host, port, base path without a trailing slash', () => {
    expect(resolveGateway('g', { ...good, upstream: 'http://[::1]:8080/v1/' }).upstream).toEqual({
      protocol: 'http:',
      hostname: '::1',
      port: 8080,
      basePath: '/v1',
      host: '[::1]:8080',
    });
  });

  it.each([
    ['api', { ...good, api: 'gemini' }, /gateways\.g\.api.*'openai' or 'anthropic'.*gemini/],
    ['upstream scheme', { ...good, upstream: 'ftp://x' }, /gateways\.g\.upstream.*http\(s\) URL.*ftp:\/\/x/],
    ['upstream credentials', { ...good, upstream: 'https://user:pw@x/v1' }, /without credentials/],
    ['upstream query', { ...good, upstream: 'https://x/v1?key=1' }, /without a query/],
    ['limiter', { ...good, limiter: {} }, /gateways\.g\.limiter.*concurrency limiter/],
    ['empty apiKey', { ...good, apiKey: '' }, /gateways\.g\.apiKey.*an empty string/],
    ['apiKey type', { ...good, apiKey: 42 }, /gateways\.g\.apiKey.*number/],
    ['workload', { ...good, workload: 'batch' }, /gateways\.g\.workload.*batch.*lacks/],
    ['cost', { ...good, cost: { input: -1, output: 1 } }, /gateways\.g\.cost\.input.*-1/],
  ])('refuses a bad %s, naming the field and the value', (_field, options, message) => {
    expect(() => resolveGateway('g', options)).toThrow(message);
  });

  it('never shows the key, and checks names and tenant lists', () => {
    const error = (() => {
      try {
        resolveGateway('g', { ...good, upstream: 'nope' });
      } catch (e) {
        return e as Error;
      }
    })();
    expect(error?.message).not.toContain('sk-very-secret-key');
    expect(() => resolveGateway('../evil', good)).toThrow(/gateway names/);
    expect(() => resolveGateways({ g: good }, { t: { gateways: ['other'] } })).toThrow(
      /Tenant `t` lists gateway `other`/,
    );
    // A name such as `__proto__`, given as an own key, is a name like any other.
    const raw = JSON.parse('{"__proto__": {}}') as Record<string, unknown>;
    raw.__proto__ = good;
    const gateways = resolveGateways(raw, undefined);
    expect([...gateways.keys()]).toEqual(['__proto__']);
    expect(gateways.get('constructor')).toBeUndefined();
  });
});
