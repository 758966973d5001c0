import { lookup as dnsLookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { forbiddenAddressReason } from './addresses.js';

/** One answer of a name lookup, as `dns.lookup(name, { all: true })` gives them. */
export interface ResolvedAddress {
  address: string;
  family: number;
}

/** Resolves a host name to every address it has. */
export type Resolver = (hostname: string) => Promise<ResolvedAddress[]>;

/** The rule a refused `callback_url` broke. */
export type CallbackUrlRule =
  | 'type'
  | 'length'
  | 'syntax'
  | 'scheme'
  | 'credentials'
  | 'forbidden_host'
  | 'forbidden_address'
  | 'unresolvable';

export type CallbackUrlCheck =
  { ok: true; url: string } | { ok: false; rule: CallbackUrlRule; message: string };

export interface CallbackUrlOptions {
  /** SLUICE_CALLBACK_ALLOW_PRIVATE=1: skip the host and address rules (on-prem receivers). */
  allowPrivate: boolean;
  /** Name resolution; default `dns.lookup` with `all: true`. */
  lookup?: Resolver;
}

export const maxCallbackUrlLength = 2048;
/** A lookup at run creation that takes longer than this refuses the URL. */
const lookupTimeoutMs = 5000;
const shownLength = 120;

// Names that resolve to internal services whatever the resolver says (or only inside a
// cloud VM, where the check runs): refused before any lookup.
const forbiddenNames: readonly { test: (host: string) => boolean; kind: string }[] = [
  { test: (h) => h === 'localhost' || h.endsWith('.localhost'), kind: 'a loopback name' },
  {
    test: (h) => h === 'metadata' || h === 'metadata.google.internal' || h === 'metadata.goog',
    kind: 'a cloud metadata name',
  },
];

/**
 * The checks of a `callback_url` that need no network: type, length, syntax, scheme, no
 * credentials, and, unless `allowPrivate`, the host when it is an IP literal or a name that
 * always means an internal service. WHATWG URL parsing runs first, so numeric forms such as
 * `http://2130706433/` and `http://0x7f.1/` are judged as the 127.0.0.1 they stand for.
 * Delivery runs this again before every attempt; names are judged at connect time.
 */
export function screenCallbackUrl(
  raw: unknown,
  allowPrivate: boolean,
): { ok: true; url: URL; hostname: string } | Extract<CallbackUrlCheck, { ok: false }> {
  if (typeof raw !== 'string') {
    return refuse('type', `Expected \`callback_url\` to be a string, got ${describe(raw)}`);
  }
  if (raw.length > maxCallbackUrlLength) {
    return refuse(
      'length',
      `Expected \`callback_url\` to be at most ${maxCallbackUrlLength} characters, got ${raw.length}: \`${shorten(raw)}\``,
    );
  }
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return refuse('syntax', `Expected \`callback_url\` to be an absolute URL, got \`${shorten(raw)}\``);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    return refuse(
      'scheme',
      `Expected \`callback_url\` to use http or https, got \`${url.protocol}\` in \`${shorten(shown(url))}\``,
    );
  }
  if (url.username !== '' || url.password !== '') {
    return refuse(
      'credentials',
      `Expected \`callback_url\` without a user name or password, got \`${shorten(shown(url))}\``,
    );
  }
  // Percent-encoding can lengthen the URL; the stored form is the one that must fit.
  if (url.href.length > maxCallbackUrlLength) {
    return refuse(
      'length',
      `Expected \`callback_url\` to be at most ${maxCallbackUrlLength} characters once normalised, got ${url.href.length}: \`${shorten(url.href)}\``,
    );
  }
  // Brackets come off IPv6 literals; a trailing dot names the same host as without it.
  const hostname = url.hostname.replace(/^\[(.*)\]$/, '$1').replace(/\.+$/, '');
  if (!allowPrivate) {
    if (isIP(hostname)) {
      const reason = forbiddenAddressReason(hostname);
      if (reason) return refuseAddress(url, hostname, reason);
    } else {
      const name = forbiddenNames.find((n) => n.test(hostname));
      if (name) {
        return refuse(
          'forbidden_host',
          `Expected \`callback_url\` to name a public host, got \`${shorten(url.href)}\` (${hostname} is ${name.kind})`,
        );
      }
    }
  }
  return { ok: true, url, hostname };
}

/**
 * Checks a `callback_url` when a run is created: {@link screenCallbackUrl}, then (unless
 * `allowPrivate`) resolves the host and refuses it when any of its addresses is loopback,
 * private, link-local, metadata or otherwise internal. The answer names the field, the rule
 * and the value, for a 400 with `field: 'callback_url'`.
 *
 * @example
 * const check = await checkCallbackUrl(body.callback_url, { allowPrivate: settings.callbackAllowPrivate });
 * if (!check.ok) throw badRequest(check.message, { field: 'callback_url' });
 */
export async function checkCallbackUrl(raw: unknown, options: CallbackUrlOptions): Promise<CallbackUrlCheck> {
  const screened = screenCallbackUrl(raw, options.allowPrivate);
  if (!screened.ok) return screened;
  const { url, hostname } = screened;
  // With private destinations allowed there is nothing left to judge, and a resolver that is
  // briefly down should not refuse the run.
  if (options.allowPrivate || isIP(hostname)) return { ok: true, url: url.href };
  let addresses: ResolvedAddress[];
  try {
    addresses = await withTimeout((options.lookup ?? systemResolver)(hostname), lookupTimeoutMs);
  } catch (error) {
    return refuse(
      'unresolvable',
      `Expected \`callback_url\` to name a host that resolves, got \`${shorten(url.href)}\` (${errorText(error)})`,
    );
  }
  if (addresses.length === 0) {
    return refuse(
      'unresolvable',
      `Expected \`callback_url\` to name a host that resolves, got \`${shorten(url.href)}\` (no addresses)`,
    );
  }
  for (const { address } of addresses) {
    const reason = forbiddenAddressReason(address);
    if (reason) return refuseAddress(url, address, reason);
  }
  return { ok: true, url: url.href };
}

/** `dns.lookup` with every address of both families, in the resolver's order. */
export const systemResolver: Resolver = (hostname) => dnsLookup(hostname, { all: true, verbatim: true });

function refuse(rule: CallbackUrlRule, message: string): Extract<CallbackUrlCheck, { ok: false }> {
  return { ok: false, rule, message };
}

function refuseAddress(url: URL, address: string, reason: string) {
  return refuse(
    'forbidden_address',
    `Expected \`callback_url\` to reach a public address, got \`${shorten(url.href)}\` (${address} is ${reason})`,
  );
}

/** The URL with any credentials masked: a refusal must not echo a password. */
function shown(url: URL): string {
  if (url.username === '' && url.password === '') return url.href;
  const copy = new URL(url.href);
  copy.username = '***';
  copy.password = '';
  return copy.href;
}

function shorten(text: string): string {
  return text.length > shownLength ? `${text.slice(0, shownLength)}…` : text;
}

function describe(value: unknown): string {
  if (value === null) return '`null`';
  if (typeof value === 'object') return Array.isArray(value) ? 'an array' : 'an object';
  return `\`${shorten(String(value))}\` (${typeof value})`;
}

function errorText(error: unknown): string {
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' ? code : error instanceof Error ? error.message : String(error);
}

async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
    timer.unref();
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
