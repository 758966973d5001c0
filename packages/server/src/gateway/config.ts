import type { ConcurrencyLimiter } from 'sluice';

/** The two wire protocols a gateway speaks: its paths, its credentials and its error shape. */
export type GatewayApi = 'openai' | 'anthropic';

/** One provider behind the server: `/api/client/v1/gateway/NAME/...` forwards to `upstream`. */
export interface GatewayConfig {
  api: GatewayApi;
  /** Where requests go: the rest of the path is appended to it as text (`.../v1` keeps its `/v1`). */
  upstream: string;
  /** The limiter every forwarded POST takes a slot of (shared with agents that name it). */
  limiter: ConcurrencyLimiter<string>;
  /** The provider key the upstream sees; never sent to a caller, never logged. */
  apiKey: string;
  /** The workload of the slots; default: the limiter's default. */
  workload?: string;
  /**
   * Prices in USD per million tokens, to count the usage into the tenant's spend. Without it the
   * usage is counted as tokens only, at no cost.
   */
  cost?: { input: number; output: number };
}

/** A gateway as the server holds it: checked once at start, with its upstream taken apart. */
export interface ResolvedGateway {
  readonly name: string;
  readonly api: GatewayApi;
  readonly limiter: ConcurrencyLimiter<string>;
  readonly apiKey: string;
  readonly workload: string | undefined;
  readonly cost: { readonly input: number; readonly output: number } | undefined;
  readonly upstream: {
    readonly protocol: 'http:' | 'https:';
    readonly hostname: string;
    readonly port: number;
    /** The upstream's path without a trailing slash (`/v1`, or `` for an origin). */
    readonly basePath: string;
    /** `Host` as the upstream expects it. */
    readonly host: string;
  };
}

const NAME = /^[A-Za-z0-9_-]{1,64}$/;

const fail = (field: string, expected: string, value: unknown): never => {
  throw new TypeError(`Expected \`${field}\` to be ${expected}, got \`${describe(value)}\``);
};

/** A value shown in a message: never the whole of a long string (an API key, say). */
function describe(value: unknown): string {
  if (typeof value === 'string') return value.length > 80 ? `${value.slice(0, 77)}...` : value;
  if (typeof value === 'function') return 'a function';
  if (value === null || typeof value !== 'object') return String(value);
  return Array.isArray(value) ? 'an array' : 'an object';
}

function resolveUpstream(field: string, raw: unknown): ResolvedGateway['upstream'] {
  if (typeof raw !== 'string') return fail(field, 'an http(s) URL', raw);
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return fail(field, 'an http(s) URL', raw);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return fail(field, 'an http(s) URL', raw);
  if (url.username || url.password) return fail(field, 'a URL without credentials (use `apiKey`)', raw);
  if (url.search || url.hash || raw.includes('?') || raw.includes('#'))
    return fail(field, 'a URL without a query or a fragment', raw);
  const port = url.port ? Number(url.port) : url.protocol === 'https:' ? 443 : 80;
  return {
    protocol: url.protocol,
    // An IPv6 literal comes bracketed from URL; the socket wants it bare.
    hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'),
    port,
    basePath: url.pathname.replace(/\/+$/, ''),
    host: url.host,
  };
}

function resolveCost(field: string, raw: unknown): ResolvedGateway['cost'] {
  if (raw === undefined) return undefined;
  if (raw === null || typeof raw !== 'object') return fail(field, 'an object `{ input, output }`', raw);
  const cost = raw as Record<string, unknown>;
  for (const side of ['input', 'output'] as const) {
    const value = cost[side];
    if (typeof value !== 'number' || !Number.isFinite(value) || value < 0)
      fail(`${field}.${side}`, 'a price >= 0 (USD per million tokens)', value);
  }
  return Object.freeze({ input: cost.input as number, output: cost.output as number });
}

/** Checks one gateway's options; throws a TypeError naming the field and the value. */
export function resolveGateway(name: string, raw: unknown): ResolvedGateway {
  const at = `gateways.${name}`;
  if (!NAME.test(name))
    throw new TypeError(
      `Expected gateway names to be 1 to 64 letters, digits, _ or -, got \`${describe(name)}\``,
    );
  if (raw === null || typeof raw !== 'object') return fail(at, 'an object', raw);
  const options = raw as Record<string, unknown>;
  if (options.api !== 'openai' && options.api !== 'anthropic')
    fail(`${at}.api`, "'openai' or 'anthropic'", options.api);
  const limiter = options.limiter as ConcurrencyLimiter<string> | undefined;
  if (typeof limiter?.acquire !== 'function' || typeof limiter.release !== 'function')
    fail(`${at}.limiter`, 'a concurrency limiter', limiter);
  if (typeof options.apiKey !== 'string' || options.apiKey === '')
    // The key itself is never shown: only whether it was there.
    throw new TypeError(
      `Expected \`${at}.apiKey\` to be a non-empty string, got ${options.apiKey === '' ? 'an empty string' : typeof options.apiKey}`,
    );
  const workload = options.workload;
  if (workload !== undefined) {
    if (typeof workload !== 'string' || workload === '') fail(`${at}.workload`, 'a workload name', workload);
    try {
      limiter!.validateWorkload?.(workload as string);
    } catch (error) {
      throw new TypeError(
        `\`${at}.workload\` is \`${workload as string}\`, which limiter \`${limiter!.name}\` lacks: ${(error as Error).message}`,
      );
    }
  }
  return Object.freeze({
    name,
    api: options.api as GatewayApi,
    limiter: limiter!,
    apiKey: options.apiKey as string,
    workload: workload as string | undefined,
    cost: resolveCost(`${at}.cost`, options.cost),
    upstream: Object.freeze(resolveUpstream(`${at}.upstream`, options.upstream)),
  });
}

/**
 * Every gateway of a config, checked, by name, and the tenants' gateway lists against them.
 * A Map, so a name such as `__proto__` is a name like any other and finds nothing else.
 */
export function resolveGateways(
  gateways: Record<string, unknown> | undefined,
  tenants: Record<string, { gateways?: unknown }> | undefined,
): ReadonlyMap<string, ResolvedGateway> {
  const resolved = new Map<string, ResolvedGateway>();
  if (gateways === undefined) return resolved;
  if (gateways === null || typeof gateways !== 'object' || Array.isArray(gateways))
    fail('gateways', 'an object of gateways by name', gateways);
  for (const name of Object.keys(gateways)) resolved.set(name, resolveGateway(name, gateways[name]));
  for (const [tenant, quota] of Object.entries(tenants ?? {})) {
    const list = quota?.gateways;
    if (list === undefined) continue;
    if (!Array.isArray(list)) fail(`tenants.${tenant}.gateways`, 'a list of gateway names', list);
    for (const name of list as unknown[]) {
      if (typeof name !== 'string' || !resolved.has(name))
        throw new TypeError(
          `Tenant \`${tenant}\` lists gateway \`${describe(name)}\`, which is not in \`gateways\``,
        );
    }
  }
  return resolved;
}

/** Whether `tenant` may use gateway `name`: a tenant without a list may use every gateway. */
export function tenantMayUse(
  tenants: Record<string, { gateways?: string[] }> | undefined,
  tenant: string,
  name: string,
): boolean {
  const list = tenants && Object.hasOwn(tenants, tenant) ? tenants[tenant]!.gateways : undefined;
  return list === undefined || list.includes(name);
}
