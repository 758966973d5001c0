import { isIPv4, isIPv6 } from 'node:net';

/**
 * Which IP addresses a callback may not reach. One ordered table per family, first match
 * wins, so the more specific rows (the metadata services) come before the ranges that hold
 * them. IPv6 forms that carry an IPv4 address (IPv4-mapped, NAT64 well-known prefix, 6to4)
 * are judged by the IPv4 address inside: a connection to `::ffff:127.0.0.1` reaches loopback.
 *
 * A hand-written range check instead of node:net's BlockList, because the refusal message
 * names the kind of address, and BlockList only answers yes or no.
 */

interface Range {
  readonly prefix: readonly number[];
  readonly bits: number;
  readonly kind: string;
}

/** An IPv6 range whose last 32 bits (or bits 16-48 for 6to4) are an IPv4 address to judge. */
interface Embedding {
  readonly prefix: readonly number[];
  readonly bits: number;
  readonly via: string;
  /** Byte offset of the embedded IPv4 address. */
  readonly at: number;
}

const v4 = (text: string, bits: number, kind: string): Range => ({
  prefix: parseIPv4(text)!,
  bits,
  kind,
});
const v6 = (text: string, bits: number, kind: string): Range => ({
  prefix: parseIPv6(text)!,
  bits,
  kind,
});

const ipv4Ranges: readonly Range[] = [
  v4('169.254.169.254', 32, 'a cloud metadata address'),
  // Azure's wire server answers on a public-looking address inside every VM.
  v4('168.63.129.16', 32, 'a cloud metadata address'),
  // 0/8 is "this network": connecting to 0.0.0.0 reaches the local host on Linux.
  v4('0.0.0.0', 8, 'an unspecified address'),
  v4('10.0.0.0', 8, 'a private address'),
  v4('100.64.0.0', 10, 'a shared (carrier-grade NAT) address'),
  v4('127.0.0.0', 8, 'a loopback address'),
  v4('169.254.0.0', 16, 'a link-local address'),
  v4('172.16.0.0', 12, 'a private address'),
  v4('192.0.0.0', 24, 'a reserved address'),
  v4('192.0.2.0', 24, 'a documentation address'),
  v4('192.168.0.0', 16, 'a private address'),
  v4('198.18.0.0', 15, 'a benchmarking address'),
  v4('198.51.100.0', 24, 'a documentation address'),
  v4('203.0.113.0', 24, 'a documentation address'),
  v4('224.0.0.0', 4, 'a multicast address'),
  v4('255.255.255.255', 32, 'a broadcast address'),
  v4('240.0.0.0', 4, 'a reserved address'),
];

const ipv6Ranges: readonly Range[] = [
  v6('fd00:ec2::254', 128, 'a cloud metadata address'),
  v6('::', 128, 'an unspecified address'),
  v6('::1', 128, 'a loopback address'),
  // The rest of ::/96 is the deprecated IPv4-compatible form: never routed.
  v6('::', 96, 'a reserved address'),
  // Local-use NAT64 (RFC 8215): translated inside the operator's own network.
  v6('64:ff9b:1::', 48, 'a local NAT64 address'),
  v6('100::', 64, 'a discard-only address'),
  v6('2001:db8::', 32, 'a documentation address'),
  // Teredo tunnels: the client's address is hidden in the low bits, so it cannot be judged.
  v6('2001::', 32, 'a Teredo tunnel address'),
  v6('fc00::', 7, 'a unique local address'),
  v6('fe80::', 10, 'a link-local address'),
  v6('fec0::', 10, 'a site-local address'),
  v6('ff00::', 8, 'a multicast address'),
];

const embeddings: readonly Embedding[] = [
  { prefix: parseIPv6('::ffff:0:0')!, bits: 96, via: 'IPv4-mapped', at: 12 },
  { prefix: parseIPv6('64:ff9b::')!, bits: 96, via: 'NAT64', at: 12 },
  { prefix: parseIPv6('2002::')!, bits: 16, via: '6to4', at: 2 },
];

/**
 * Why `address` may not be the destination of a callback, or undefined when it may. Takes
 * IPv4 dotted quads and IPv6 text (a `%zone` suffix is ignored); anything else is refused.
 *
 * @example
 * forbiddenAddressReason('10.1.2.3'); // 'a private address'
 * forbiddenAddressReason('::ffff:127.0.0.1'); // 'a loopback address (IPv4-mapped)'
 * forbiddenAddressReason('93.184.215.14'); // undefined
 */
export function forbiddenAddressReason(address: string): string | undefined {
  const bytes4 = parseIPv4(address);
  if (bytes4) return matchRange(ipv4Ranges, bytes4)?.kind;
  const bytes6 = parseIPv6(address);
  if (!bytes6) return 'not an IP address';
  for (const e of embeddings) {
    if (!inPrefix(bytes6, e.prefix, e.bits)) continue;
    const inner = matchRange(ipv4Ranges, bytes6.slice(e.at, e.at + 4));
    return inner && `${inner.kind} (${e.via})`;
  }
  return matchRange(ipv6Ranges, bytes6)?.kind;
}

function matchRange(ranges: readonly Range[], bytes: readonly number[]): Range | undefined {
  return ranges.find((r) => inPrefix(bytes, r.prefix, r.bits));
}

function inPrefix(bytes: readonly number[], prefix: readonly number[], bits: number): boolean {
  for (let i = 0; i < bits; i += 8) {
    const take = Math.min(8, bits - i);
    const mask = (0xff << (8 - take)) & 0xff;
    if ((bytes[i / 8]! & mask) !== (prefix[i / 8]! & mask)) return false;
  }
  return true;
}

/** Dotted-quad IPv4 to 4 bytes; undefined for anything else (node:net decides validity). */
export function parseIPv4(text: string): number[] | undefined {
  if (!isIPv4(text)) return undefined;
  return text.split('.').map(Number);
}

/** IPv6 text (with `::` and an optional trailing dotted quad) to 16 bytes. */
export function parseIPv6(text: string): number[] | undefined {
  const address = text.replace(/%.*$/, '');
  if (!isIPv6(address)) return undefined;
  // A trailing dotted quad becomes two hex groups, so one splitter handles every form.
  const withoutQuad = address.replace(/(\d+)\.(\d+)\.(\d+)\.(\d+)$/, (_m, a, b, c, d) =>
    [(Number(a) << 8) | Number(b), (Number(c) << 8) | Number(d)].map((n) => n.toString(16)).join(':'),
  );
  const [head = '', tail] = withoutQuad.split('::');
  const groups = (part: string) => (part === '' ? [] : part.split(':'));
  const left = groups(head);
  const right = tail === undefined ? [] : groups(tail);
  const all = [...left, ...new Array<string>(8 - left.length - right.length).fill('0'), ...right];
  return all.flatMap((group) => {
    const n = parseInt(group, 16);
    return [n >> 8, n & 0xff];
  });
}
