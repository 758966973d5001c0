import { BlockList } from 'node:net';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { forbiddenAddressReason, parseIPv6 } from '../../src/callbacks/addresses.js';

describe('forbiddenAddressReason', () => {
  it.each([
    ['127.0.0.1', 'a loopback address'],
    ['127.255.255.254', 'a loopback address'],
    ['0.0.0.0', 'an unspecified address'],
    ['0.1.2.3', 'an unspecified address'],
    ['10.0.0.1', 'a private address'],
    ['172.16.0.1', 'a private address'],
    ['172.31.255.255', 'a private address'],
    ['192.168.1.1', 'a private address'],
    ['100.64.0.1', 'a shared (carrier-grade NAT) address'],
    ['100.127.255.255', 'a shared (carrier-grade NAT) address'],
    ['100.100.100.200', 'a shared (carrier-grade NAT) address'],
    ['169.254.169.254', 'a cloud metadata address'],
    ['168.63.129.16', 'a cloud metadata address'],
    ['169.254.1.1', 'a link-local address'],
    ['192.0.0.192', 'a reserved address'],
    ['192.0.2.1', 'a documentation address'],
    ['198.18.0.1', 'a benchmarking address'],
    ['224.0.0.1', 'a multicast address'],
    ['239.255.255.250', 'a multicast address'],
    ['255.255.255.255', 'a broadcast address'],
    ['240.0.0.1', 'a reserved address'],
    ['::', 'an unspecified address'],
    ['::1', 'a loopback address'],
    ['::7f00:1', 'a reserved address'],
    ['fd00:ec2::254', 'a cloud metadata address'],
    ['fd00::1', 'a unique local address'],
    ['fc00::1', 'a unique local address'],
    ['fe80::1', 'a link-local address'],
    ['fe80::1%eth0', 'a link-local address'],
    ['febf::1', 'a link-local address'],
    ['fec0::1', 'a site-local address'],
    ['ff02::1', 'a multicast address'],
    ['2001:db8::1', 'a documentation address'],
    ['2001:0:4136:e378:8000:63bf:3fff:fdd2', 'a Teredo tunnel address'],
    ['100::1', 'a discard-only address'],
    ['64:ff9b:1::a00:1', 'a local NAT64 address'],
    ['::ffff:127.0.0.1', 'a loopback address (IPv4-mapped)'],
    ['::ffff:7f00:1', 'a loopback address (IPv4-mapped)'],
    ['::ffff:a9fe:a9fe', 'a cloud metadata address (IPv4-mapped)'],
    ['::ffff:10.1.2.3', 'a private address (IPv4-mapped)'],
    ['64:ff9b::127.0.0.1', 'a loopback address (NAT64)'],
    ['64:ff9b::a9fe:a9fe', 'a cloud metadata address (NAT64)'],
    ['2002:7f00:1::', 'a loopback address (6to4)'],
    ['2002:c0a8:101::1', 'a private address (6to4)'],
    ['localhost', 'not an IP address'],
    ['1.2.3', 'not an IP address'],
  ])('%s is %s', (address, reason) => {
    expect(forbiddenAddressReason(address)).toBe(reason);
  });

  it.each([
    '8.8.8.8',
    '93.184.215.14',
    '11.0.0.1',
    '100.63.255.255',
    '100.128.0.0',
    '172.15.255.255',
    '172.32.0.0',
    '169.255.0.1',
    '192.169.0.1',
    '223.255.255.255',
    '2606:4700:4700::1111',
    '2a00:1450:4001:80b::200e',
    'fbff:ffff::1',
    'fe7f::1',
    '::ffff:8.8.8.8',
    '64:ff9b::808:808',
    '2002:808:808::1',
  ])('%s is public', (address) => {
    expect(forbiddenAddressReason(address)).toBeUndefined();
  });

  // The same ranges, in node:net's BlockList, as an independent reference for the bit logic.
  const reference4 = new BlockList();
  for (const [net, bits] of [
    ['0.0.0.0', 8],
    ['10.0.0.0', 8],
    ['100.64.0.0', 10],
    ['127.0.0.0', 8],
    ['168.63.129.16', 32],
    ['169.254.0.0', 16],
    ['172.16.0.0', 12],
    ['192.0.0.0', 24],
    ['192.0.2.0', 24],
    ['192.168.0.0', 16],
    ['198.18.0.0', 15],
    ['198.51.100.0', 24],
    ['203.0.113.0', 24],
    ['224.0.0.0', 3],
  ] as const) {
    reference4.addSubnet(net, bits, 'ipv4');
  }
  const reference6 = new BlockList();
  for (const [net, bits] of [
    ['::', 96],
    ['64:ff9b:1::', 48],
    ['100::', 64],
    ['2001::', 32],
    ['2001:db8::', 32],
    ['fc00::', 7],
    ['fe80::', 9],
    ['ff00::', 8],
  ] as const) {
    reference6.addSubnet(net, bits, 'ipv6');
  }

  it('agrees with node:net BlockList on random IPv4 addresses, and on each one mapped into IPv6', () => {
    fc.assert(
      fc.property(fc.ipV4(), (address) => {
        const reason = forbiddenAddressReason(address);
        expect(reason !== undefined).toBe(reference4.check(address, 'ipv4'));
        expect(forbiddenAddressReason(`::ffff:${address}`)).toBe(reason && `${reason} (IPv4-mapped)`);
        expect(forbiddenAddressReason(`64:ff9b::${address}`)).toBe(reason && `${reason} (NAT64)`);
      }),
      { numRuns: 2000 },
    );
  });

  it('agrees with node:net BlockList on random IPv6 addresses outside the IPv4-carrying prefixes', () => {
    const carriesIPv4 = (a: string) => {
      const b = parseIPv6(a)!;
      const head = b.slice(0, 12).join(',');
      return (
        head === '0,0,0,0,0,0,0,0,0,0,255,255' ||
        head === '0,100,255,155,0,0,0,0,0,0,0,0' ||
        (b[0] === 0x20 && b[1] === 0x02)
      );
    };
    fc.assert(
      fc.property(
        fc.ipV6().filter((a) => !carriesIPv4(a)),
        (address) => {
          expect(forbiddenAddressReason(address) !== undefined).toBe(reference6.check(address, 'ipv6'));
        },
      ),
      { numRuns: 2000 },
    );
  });
});

describe('parseIPv6', () => {
  it.each([
    ['::', [0, 0, 0, 0, 0, 0, 0, 0]],
    ['::1', [0, 0, 0, 0, 0, 0, 0, 1]],
    ['1::', [1, 0, 0, 0, 0, 0, 0, 0]],
    ['1:2:3:4:5:6:7:8', [1, 2, 3, 4, 5, 6, 7, 8]],
    ['fe80::1:2', [0xfe80, 0, 0, 0, 0, 0, 1, 2]],
    ['::ffff:1.2.3.4', [0, 0, 0, 0, 0, 0xffff, 0x0102, 0x0304]],
    ['fe80::1%eth0', [0xfe80, 0, 0, 0, 0, 0, 0, 1]],
  ])('%s', (text, groups) => {
    const bytes = parseIPv6(text)!;
    expect(Array.from({ length: 8 }, (_, i) => (bytes[2 * i]! << 8) | bytes[2 * i + 1]!)).toEqual(groups);
  });

  it('refuses what is not IPv6', () => {
    expect(parseIPv6('1.2.3.4')).toBeUndefined();
    expect(parseIPv6('1:::2')).toBeUndefined();
    expect(parseIPv6('example.com')).toBeUndefined();
  });
});
