import fc from 'fast-check';
import type { TokenName } from './principals.js';

/**
 * Generators of hostile HTTP requests for the fuzz test: bodies, query strings, headers and
 * paths, aimed at every route. A case is data; `renderCase` turns it into bytes once the
 * server's tokens and a real run id are known.
 */

export type CaseKind = 'body' | 'query' | 'header' | 'path';

/** How the body's length is declared: truthfully, or as one of the lies a raw socket can tell. */
export type Framing =
  | { kind: 'length' }
  | { kind: 'longer'; by: number }
  | { kind: 'shorter'; by: number }
  | { kind: 'declared'; value: string }
  | { kind: 'twice' }
  | { kind: 'chunked'; broken: boolean }
  | { kind: 'chunked+length' };

export type Auth =
  | { kind: 'none' }
  | { kind: 'token'; token: TokenName; form: string }
  | { kind: 'literal'; value: string }
  | { kind: 'twice'; token: TokenName };

export interface FuzzCase {
  kind: CaseKind;
  method: string;
  /** A request target with placeholders `{run}` (an existing run of tenant t) and `{agent}`. */
  target: string;
  auth: Auth;
  contentType: string | undefined;
  /** More headers, in order; duplicates allowed. */
  headers: [string, string][];
  body: Buffer | undefined;
  framing: Framing;
  /** Leave out the Host header (HTTP/1.1 requires one). */
  noHost: boolean;
}

/** JSON text kept as is inside a generated value: deep nesting, numbers JSON.stringify cannot write. */
export class RawJson {
  constructor(readonly text: string) {}
}

/** JSON text of a generated value; own keys only, so a generated `__proto__` key is written out. */
export function toJsonText(value: unknown): string {
  if (value instanceof RawJson) return value.text;
  if (Array.isArray(value)) return `[${value.map(toJsonText).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    return `{${Object.keys(value)
      .map((k) => `${JSON.stringify(k)}:${toJsonText((value as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

const prototypeNames = ['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf', 'prototype'];

const hostileChar = fc.oneof(
  { weight: 8, arbitrary: fc.string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 1 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }) },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      '\u0000',
      '\ud800',
      '\udbff',
      '\udc00',
      '\udfff',
      '\ufeff',
      '\u2028',
      '"',
      '\\',
    ),
  },
);
const hostileString = (maxLength = 30) => fc.string({ unit: hostileChar, maxLength });
const hostileKey = fc.oneof(
  { weight: 3, arbitrary: hostileString(12) },
  { weight: 1, arbitrary: fc.constantFrom(...prototypeNames, '', 'k'.repeat(65), 'a\u0000') },
);
/** Long strings around the limits (made by repeat: generating them char by char is slow). */
const longString = fc
  .constantFrom(513, 2049, 100_000, 1_000_000, 1_000_001, 3_000_000)
  .map((n) => 'a'.repeat(n));
const deepArray = (depth: number) => new RawJson(`${'['.repeat(depth)}${']'.repeat(depth)}`);
const deepObject = (depth: number) => new RawJson(`${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`);
const deep = fc
  .tuple(fc.constantFrom(65, 1_000, 10_000, 100_000, 400_000), fc.boolean())
  .map(([d, array]) => (array ? deepArray(d) : deepObject(d)));
const oddNumber = fc.constantFrom('1e400', '-1e400', '-0', '1e-400', '123456789012345678901234567890', '0.0');
const anyJson = fc.oneof(
  { weight: 4, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
  { weight: 1, arbitrary: oddNumber.map((t) => new RawJson(t)) },
);

const block = fc.record(
  { type: fc.constantFrom('text', 'image', 'TEXT', ''), text: fc.oneof(hostileString(), anyJson) },
  { requiredKeys: [] },
);
const message = fc.record(
  {
    role: fc.constantFrom('user', 'assistant', 'system', 'tool', 'User', ''),
    content: fc.oneof(hostileString(), fc.array(block, { maxLength: 4 }), anyJson),
  },
  { requiredKeys: [] },
);
const many = <T>(n: number, item: T) => Array.from({ length: n }, () => item);
const input = fc.oneof(
  { weight: 6, arbitrary: hostileString(40) },
  { weight: 3, arbitrary: fc.array(message, { maxLength: 4 }) },
  { weight: 1, arbitrary: longString },
  {
    weight: 1,
    arbitrary: fc.constantFrom(499, 500, 501, 5_000).map((n) => many(n, { role: 'user', content: 'x' })),
  },
  {
    weight: 1,
    arbitrary: fc
      .constantFrom(100, 101, 1_000)
      .map((n) => [{ role: 'user', content: many(n, { type: 'text', text: 'x' }) }]),
  },
  { weight: 1, arbitrary: anyJson },
  { weight: 1, arbitrary: deep },
);

const year = 365 * 24 * 3600;
const runAt = fc.oneof(
  // Around now, both forms: some valid and due, some scheduled, some past the year.
  fc.integer({ min: -2 * year, max: 2 * year }).map((s) => Math.floor(Date.now() / 1000) + s),
  fc
    .integer({ min: -2 * year, max: 2 * year })
    .map((s) => new Date(Date.now() + s * 1000).toISOString().replace('Z', '+00:00')),
  fc.date({ noInvalidDate: true }).map((d) => d.toISOString()),
  fc.double().map((n) => n),
  fc.integer(),
  hostileString(30),
  fc.constantFrom(
    1e13,
    -1e12,
    1e11,
    0,
    253_402_300_800,
    '+275760-09-13T00:00:00Z',
    '1970-01-01T00:00:00Z',
    '2030-01-01T00:00',
    '1/2/2030',
    '2030',
    '0',
    'next tuesday',
    '2027-02-30T00:00:00Z',
    '2027-01-01T25:00:00Z',
    '2027-01-01T00:00:60Z',
    '2027-01-01T00:00:00+24:00',
    '2027-01-01t00:00:00z',
    '2027-01-01T00:00:00.1234567891Z',
    true,
    null,
    [],
    {},
  ),
  oddNumber.map((t) => new RawJson(t)),
);
const delaySeconds = fc.oneof(
  fc.double(),
  fc.integer({ min: -10, max: 2 * year }),
  fc.constantFrom(0, -1, 1, year, year + 1, 1e308, '10', null, true),
  oddNumber.map((t) => new RawJson(t)),
);
const metadataValue = fc.oneof(hostileString(20), fc.double(), fc.boolean(), fc.constant(null), anyJson);
const metadata = fc.oneof(
  { weight: 5, arbitrary: fc.dictionary(hostileKey, metadataValue, { maxKeys: 20 }) },
  {
    weight: 1,
    arbitrary: fc
      .constantFrom(16, 17, 10_000)
      .map((n) => Object.fromEntries(many(n, 0).map((v, i) => [`k${i}`, v]))),
  },
  { weight: 1, arbitrary: fc.constantFrom(512, 513, 100_000).map((n) => ({ k: 'v'.repeat(n) })) },
  { weight: 1, arbitrary: fc.oneof(anyJson, longString, deep) },
);
const callbackUrl = fc.oneof(
  fc.constantFrom(
    'http://127.0.0.1:9/hook',
    'https://127.0.0.1:9/hook',
    'http://user:pass@127.0.0.1:9/',
    'ftp://x',
    'javascript:alert(1)',
    'file:///etc/passwd',
    '',
    `http://127.0.0.1:9/${'a'.repeat(2_100)}`,
    `http://127.0.0.1:9/${'a'.repeat(100_000)}`,
    'http://[::1',
    '//127.0.0.1:9/',
    123,
    null,
  ),
  hostileString(30),
);

/** A body the server accepts: a run of either class, now or scheduled, with optional fields. */
const validBody = fc.record(
  {
    input: fc.oneof(
      fc.string({ minLength: 1, maxLength: 20 }),
      fc.array(
        fc.record({
          role: fc.constantFrom('user', 'assistant', 'system'),
          content: fc.oneof(
            fc.string({ minLength: 1, maxLength: 20 }),
            fc.array(fc.record({ type: fc.constant('text'), text: fc.string({ maxLength: 20 }) }), {
              minLength: 1,
              maxLength: 2,
            }),
          ),
        }),
        { minLength: 1, maxLength: 3 },
      ),
    ),
    class: fc.constantFrom('default', 'deferred'),
    wait: fc.boolean(),
    run_at: fc.oneof(
      fc.integer({ min: -3600, max: year - 3600 }).map((s) => Math.floor(Date.now() / 1000) + s),
      fc.integer({ min: -3600, max: year - 3600 }).map((s) => new Date(Date.now() + s * 1000).toISOString()),
    ),
    delay_seconds: fc.integer({ min: 0, max: 1000 }),
    metadata: fc.dictionary(
      fc.string({ minLength: 1, maxLength: 64 }),
      fc.oneof(fc.string({ maxLength: 512 }), fc.integer(), fc.boolean(), fc.constant(null)),
      { maxKeys: 16 },
    ),
    callback_url: fc.constant('http://127.0.0.1:9/hook'),
  },
  { requiredKeys: ['input'] },
);

/** A hostile value for one field, or for a field the server does not know (prototype keys too). */
const mutation: fc.Arbitrary<[string, unknown]> = fc.oneof(
  fc.tuple(fc.constant('input'), input),
  fc.tuple(fc.constant('class'), fc.constantFrom('Deferred', '', null, ['deferred'], 1)),
  fc.tuple(fc.constant('wait'), fc.constantFrom('false', 0, null, 'true')),
  fc.tuple(fc.constant('run_at'), runAt),
  fc.tuple(fc.constant('delay_seconds'), delaySeconds),
  fc.tuple(fc.constant('metadata'), metadata),
  fc.tuple(fc.constant('callback_url'), callbackUrl),
  fc.tuple(fc.oneof(hostileKey, fc.constantFrom('Input', 'thread_id')), anyJson),
  fc.tuple(fc.constantFrom('input', 'class', 'run_at'), fc.constant(undefined)),
);

/** A valid body with none, one or two fields made hostile, so most requests get past the schema's first check. */
const createBody = fc
  .tuple(
    validBody,
    fc.oneof({ weight: 2, arbitrary: fc.constant([]) }, fc.array(mutation, { minLength: 1, maxLength: 2 })),
  )
  .map(([valid, mutations]) => {
    const body: Record<string, unknown> = { ...valid };
    // Both forms of a schedule is a refusal of its own; a valid body keeps one.
    if ('run_at' in body && 'delay_seconds' in body) delete body.delay_seconds;
    for (const [key, value] of mutations) {
      if (value === undefined) delete body[key];
      // defineProperty: a key named `__proto__` becomes a plain key, sent as such.
      else Object.defineProperty(body, key, { value, enumerable: true, writable: true, configurable: true });
    }
    return body;
  });

const rawBodies = fc.constantFrom(
  '',
  ' ',
  '{',
  '{"input":',
  'null',
  '[]',
  '"str"',
  '42',
  'NaN',
  '{"input":"x","__proto__":{"a":1}}',
  '{"input":"x","constructor":{"prototype":{}}}',
  '{"input":"x","input":5}',
  '\ufeff{"input":"x"}',
  '{"input":"\\ud800"}',
  '{"input":"\\x41"}',
  '{"input":"x"} trailing',
  '{"input":"x"}{"input":"y"}',
);

export const jsonBody = fc.oneof(
  { weight: 10, arbitrary: createBody.map((v) => Buffer.from(toJsonText(v))) },
  { weight: 2, arbitrary: anyJson.map((v) => Buffer.from(toJsonText(v))) },
  { weight: 2, arbitrary: rawBodies.map((t) => Buffer.from(t)) },
  { weight: 1, arbitrary: deep.map((d) => Buffer.from(`{"input":${d.text}}`)) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.from(b)) },
  { weight: 1, arbitrary: fc.constant(Buffer.from(JSON.stringify({ input: 'x' }), 'utf16le')) },
);

const contentType = fc.oneof(
  { weight: 12, arbitrary: fc.constant('application/json') },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      undefined,
      '',
      'application/json; charset=utf-8',
      'APPLICATION/JSON',
      'application/json; charset=utf-16',
      'application/json;',
      'application/jsonx',
      'application/vnd.api+json',
      'text/plain',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      'application/json, text/plain',
      '*/*',
      '\u00ff/\u00ff',
    ),
  },
);

const framing: fc.Arbitrary<Framing> = fc.oneof(
  { weight: 12, arbitrary: fc.constant({ kind: 'length' as const }) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 1000 }).map((by) => ({ kind: 'longer' as const, by })) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 20 }).map((by) => ({ kind: 'shorter' as const, by })) },
  {
    weight: 1,
    arbitrary: fc
      .constantFrom('20000000', '10485761', '-1', 'abc', '1e3', '', '99999999999999999999', '0x10', ' 5')
      .map((value) => ({ kind: 'declared' as const, value })),
  },
  { weight: 1, arbitrary: fc.constant({ kind: 'twice' as const }) },
  { weight: 1, arbitrary: fc.boolean().map((broken) => ({ kind: 'chunked' as const, broken })) },
  { weight: 1, arbitrary: fc.constant({ kind: 'chunked+length' as const }) },
);

const tokenName = fc.constantFrom<TokenName>('admin', 'admin', 'member', 'reader', 'otherTenant', 'acme');
const auth: fc.Arbitrary<Auth> = fc.oneof(
  { weight: 10, arbitrary: tokenName.map((token) => ({ kind: 'token' as const, token, form: 'Bearer %s' })) },
  {
    weight: 4,
    arbitrary: fc
      .tuple(
        tokenName,
        fc.constantFrom(
          'bearer %s',
          'BEARER\t%s',
          'Bearer  %s  ',
          'Bearer %s extra',
          'Bearer%s',
          'Basic %s',
          'Token %s',
          'Bearer %s\u00ff',
          'Bearer "%s"',
          'Bearer %s%s',
        ),
      )
      .map(([token, form]) => ({ kind: 'token' as const, token, form })),
  },
  {
    weight: 2,
    arbitrary: fc
      .oneof(
        fc.constantFrom(
          '',
          'Bearer',
          'Bearer ',
          'Bearer sk_nope',
          `Bearer ${'x'.repeat(600)}`,
          'Basic dXNlcjpwYXNz',
        ),
        fc.constantFrom(`Bearer ${'a'.repeat(20_000)}`),
        fc.string({ unit: 'binary-ascii', maxLength: 40 }).map((s) => s.replace(/[\r\n]/g, '')),
      )
      .map((value) => ({ kind: 'literal' as const, value })),
  },
  { weight: 1, arbitrary: fc.constant({ kind: 'none' as const }) },
  { weight: 1, arbitrary: tokenName.map((token) => ({ kind: 'twice' as const, token })) },
);

const extraHeader: fc.Arbitrary<[string, string]> = fc.oneof(
  fc.constantFrom<[string, string]>(
    ['accept', 'application/xml'],
    ['accept-encoding', 'gzip, br'],
    ['content-encoding', 'gzip'],
    ['expect', '100-continue'],
    ['expect', 'nonsense'],
    ['x-forwarded-for', '1.2.3.4, ::1'],
    ['cookie', 'a=b; __proto__=x'],
    ['host', 'evil.example'],
    ['connection', 'keep-alive, Upgrade'],
    ['upgrade', 'websocket'],
    ['x-http-method-override', 'DELETE'],
    ['__proto__', 'x'],
    ['constructor', 'x'],
  ),
  fc
    .tuple(
      fc.stringMatching(/^[a-z][a-z0-9-]{0,20}$/),
      fc.string({ unit: 'binary-ascii', maxLength: 60 }).map((s) => s.replace(/[\r\n\0]/g, '')),
    )
    .map(([k, v]) => [k, v] as [string, string]),
);

/** Path segments that a router, a decoder or an object lookup might trip on. */
const segment = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom('echo', 'analyst', '{run}', 'runs', 'queue', 'cancel') },
  {
    weight: 4,
    arbitrary: fc.constantFrom(
      ...prototypeNames,
      '',
      '.',
      '..',
      '%2e%2e',
      '%00',
      'run_%00x',
      '%',
      '%%',
      '%E0%A4%A',
      '%FF',
      '%C0%AF',
      '%2F',
      'run_000000000000000000000000',
      'run_ZZZ',
      'e%63ho',
      '%5F%5Fproto%5F%5F',
      ';x=1',
      '\u00e9',
      '\u0000',
      ' ',
      'a?b',
    ),
  },
  { weight: 1, arbitrary: fc.constantFrom(101, 200, 201, 500, 501, 2_000).map((n) => 'r'.repeat(n)) },
  {
    weight: 2,
    arbitrary: fc
      .array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 6 })
      .map((bytes) => bytes.map((b) => `%${b.toString(16).padStart(2, '0').toUpperCase()}`).join('')),
  },
);

const api = '/api/client/v1';
/** The routes, with `{s}` where a generated segment goes. */
const routeShapes = [
  `${api}/agents/{s}/runs`,
  `${api}/agents/runs/{s}`,
  `${api}/agents/runs/{s}/cancel`,
  `${api}/agents/{s}`,
  `${api}/{s}/runs`,
  `/{s}/client/v1/agents/runs`,
  `${api}/agents/runs/{s}/{s}`,
  `/{s}`,
  `/readyz{s}`,
  `${api}/openapi.json{s}`,
];
/** Every real route, as a client would call it. */
export const routes: { method: string; target: string }[] = [
  { method: 'GET', target: '/readyz' },
  { method: 'GET', target: `${api}/openapi.json` },
  { method: 'POST', target: `${api}/agents/{agent}/runs` },
  { method: 'GET', target: `${api}/agents/runs/queue` },
  { method: 'GET', target: `${api}/agents/runs/{run}` },
  { method: 'POST', target: `${api}/agents/runs/{run}/cancel` },
  { method: 'GET', target: `${api}/agents/runs` },
  { method: 'GET', target: `${api}/ops/overview` },
  { method: 'GET', target: '/metrics' },
  { method: 'GET', target: '/dashboard' },
];
const method = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom('GET', 'POST') },
  { weight: 3, arbitrary: fc.constantFrom('PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD') },
  { weight: 1, arbitrary: fc.constantFrom('get', 'FOO', 'TRACE', 'CONNECT', 'PRI', 'M-SEARCH') },
);

const queryKey = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom('limit', 'cursor', 'status', 'class') },
  { weight: 2, arbitrary: fc.constantFrom(...prototypeNames, '', 'x', 'limit[]', 'status[0]', 'a.b') },
);
const queryValue = fc.oneof(
  fc.constantFrom(
    '',
    '0',
    '1',
    '-1',
    '1.5',
    '1e3',
    'abc',
    '1000',
    '1001',
    '99999999999999999999',
    '9223372036854775808',
    `1${'0'.repeat(30)}`,
    'queued',
    'queued,running',
    ',,',
    'nope',
    'deferred',
    'DEFERRED',
    'MTIzOnJ1bl94',
    'x'.repeat(300),
  ),
  hostileString(20).map((s) => encodeURIComponent(s.replace(/[\ud800-\udfff]/g, '?'))),
  fc.constantFrom('%', '%G1', '%E0%A4%A', '%00', '%FF', '+', '%2B', '&', '=', '%26', '#x'),
);
export const queryString = fc
  .tuple(
    fc.array(fc.tuple(queryKey, queryValue, fc.nat(4)), { maxLength: 5 }),
    fc.constantFrom('?', '?', '??', '?&', '?&&'),
  )
  .map(([pairs, lead]) =>
    pairs.length === 0
      ? lead
      : lead + pairs.map(([k, v, form]) => (form === 0 ? k : form === 1 ? `${k}=` : `${k}=${v}`)).join('&'),
  );

const plain = fc.constant<Framing>({ kind: 'length' });
const rightAuth = tokenName.map((token): Auth => ({ kind: 'token', token, form: 'Bearer %s' }));

/** A case of each kind; most are aimed at the right route with a valid token, so they get deep. */
export const fuzzCase: fc.Arbitrary<FuzzCase> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc
      .record({
        agent: fc.constantFrom('echo', 'echo', 'echo', 'analyst'),
        auth: rightAuth,
        contentType,
        body: jsonBody,
        framing: fc.oneof({ weight: 6, arbitrary: plain }, { weight: 1, arbitrary: framing }),
      })
      .map(({ agent, auth, contentType, body, framing }): FuzzCase => ({
        kind: 'body',
        method: 'POST',
        target: `${api}/agents/${agent}/runs`,
        auth,
        contentType,
        headers: [],
        body,
        framing,
        noHost: false,
      })),
  },
  {
    weight: 2,
    arbitrary: fc
      .record({ auth: rightAuth, query: queryString, route: fc.nat(6) })
      .map(({ auth, query, route }): FuzzCase => ({
        kind: 'query',
        method: route < 5 ? 'GET' : routes[route]!.method,
        target: (route < 5 ? `${api}/agents/runs` : routes[route]!.target) + query,
        auth,
        contentType: undefined,
        headers: [],
        body: undefined,
        framing: { kind: 'length' },
        noHost: false,
      })),
  },
  {
    weight: 2,
    arbitrary: fc
      .record({
        route: fc.constantFrom(...routes),
        auth,
        contentType,
        headers: fc.array(extraHeader, { maxLength: 3 }),
        body: fc.option(jsonBody, { freq: 2 }),
        framing,
        noHost: fc.nat(19).map((n) => n === 0),
      })
      .map(({ route, auth, contentType, headers, body, framing, noHost }): FuzzCase => ({
        kind: 'header',
        method: route.method,
        target: route.target,
        auth,
        contentType,
        headers,
        body: body ?? undefined,
        framing,
        noHost,
      })),
  },
  {
    weight: 2,
    arbitrary: fc
      .record({
        method,
        shape: fc.constantFrom(...routeShapes),
        segments: fc.array(segment, { minLength: 2, maxLength: 2 }),
        auth: rightAuth,
        body: fc.option(jsonBody, { freq: 3 }),
      })
      .map(({ method, shape, segments, auth, body }): FuzzCase => ({
        kind: 'path',
        method,
        target: shape.replace('{s}', segments[0]!).replace('{s}', segments[1]!),
        auth,
        contentType: body ? 'application/json' : undefined,
        headers: [],
        body: body ?? undefined,
        framing: { kind: 'length' },
        noHost: false,
      })),
  },
);

export interface Rendered {
  bytes: Buffer;
  /** The request promises more body than it sends: the client must end its side to be answered. */
  halfClose: boolean;
}

/** The bytes of a case, with real tokens and a real run id in place. */
export function renderCase(
  c: FuzzCase,
  tokens: Record<TokenName, string>,
  runId: string,
  port: number,
): Rendered {
  const target = c.target.replaceAll('{run}', runId).replaceAll('{agent}', 'echo');
  const headers: [string, string][] = [];
  if (!c.noHost) headers.push(['Host', `127.0.0.1:${port}`]);
  headers.push(['Connection', 'close']);
  switch (c.auth.kind) {
    case 'none':
      break;
    case 'token':
      headers.push(['Authorization', c.auth.form.replaceAll('%s', tokens[c.auth.token])]);
      break;
    case 'literal':
      headers.push(['Authorization', c.auth.value]);
      break;
    case 'twice':
      headers.push(['Authorization', `Bearer ${tokens[c.auth.token]}`], ['Authorization', 'Bearer sk_nope']);
      break;
  }
  if (c.contentType !== undefined) headers.push(['Content-Type', c.contentType]);
  headers.push(...c.headers);
  let body = c.body ?? Buffer.alloc(0);
  let halfClose = false;
  const f = c.framing;
  switch (f.kind) {
    case 'length':
      if (c.body !== undefined || c.method === 'POST') headers.push(['Content-Length', String(body.length)]);
      break;
    case 'longer':
      headers.push(['Content-Length', String(body.length + f.by)]);
      halfClose = true;
      break;
    case 'shorter':
      headers.push(['Content-Length', String(Math.max(0, body.length - f.by))]);
      break;
    case 'declared':
      headers.push(['Content-Length', f.value]);
      // A declared length the server may take at its word and wait for.
      halfClose = /^\s*\d+\s*$/.test(f.value) && Number(f.value) > body.length;
      break;
    case 'twice':
      headers.push(['Content-Length', String(body.length)], ['Content-Length', String(body.length + 1)]);
      halfClose = true;
      break;
    case 'chunked':
      headers.push(['Transfer-Encoding', 'chunked']);
      body = Buffer.concat([
        Buffer.from(`${(body.length + (f.broken ? 3 : 0)).toString(16)}\r\n`),
        body,
        Buffer.from(f.broken ? '\r\n' : '\r\n0\r\n\r\n'),
      ]);
      halfClose = f.broken;
      break;
    case 'chunked+length':
      headers.push(['Transfer-Encoding', 'chunked'], ['Content-Length', String(body.length)]);
      halfClose = true;
      break;
  }
  const bytes = Buffer.concat([
    Buffer.from(
      `${c.method} ${target} HTTP/1.1\r\n${headers.map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`,
      'latin1',
    ),
    body,
  ]);
  return { bytes, halfClose };
}
