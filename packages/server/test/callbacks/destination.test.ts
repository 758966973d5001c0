import { describe, expect, it } from 'vitest';
import { checkCallbackUrl, type Resolver } from '../../src/callbacks/index.js';

// No test here touches real DNS: names resolve through this table.
const names: Record<string, string[]> = {
  'hooks.example.com': ['93.184.215.14', '2606:2800:21f:cb07:6820:80da:af6b:8b2c'],
  'internal.example.com': ['10.0.0.5'],
  'mixed.example.com': ['93.184.215.14', '127.0.0.1'],
  'v6-internal.example.com': ['fd12:3456::1'],
  'mapped.example.com': ['::ffff:169.254.169.254'],
  'empty.example.com': [],
};
const lookups: string[] = [];
const lookup: Resolver = async (host) => {
  lookups.push(host);
  const addresses = names[host];
  if (!addresses) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
  return addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
};
const check = (raw: unknown, allowPrivate = false) => checkCallbackUrl(raw, { allowPrivate, lookup });

describe('checkCallbackUrl', () => {
  // Fuzz-table row 29: every address form, literal or resolved.
  it.each([
    ['http://127.0.0.1:9999/', 'forbidden_address', '127.0.0.1 is a loopback address'],
    ['http://localhost/', 'forbidden_host', 'localhost is a loopback name'],
    ['http://LOCALHOST./x', 'forbidden_host', 'localhost is a loopback name'],
    ['http://api.localhost/', 'forbidden_host', 'api.localhost is a loopback name'],
    ['http://[::1]/', 'forbidden_address', '::1 is a loopback address'],
    ['http://0.0.0.0/', 'forbidden_address', '0.0.0.0 is an unspecified address'],
    ['http://[::]/', 'forbidden_address', ':: is an unspecified address'],
    ['http://10.0.0.1/', 'forbidden_address', '10.0.0.1 is a private address'],
    ['http://192.168.0.10:8080/', 'forbidden_address', '192.168.0.10 is a private address'],
    ['http://100.64.0.1/', 'forbidden_address', '100.64.0.1 is a shared (carrier-grade NAT) address'],
    ['http://169.254.169.254/latest/meta-data/', 'forbidden_address', '169.254.169.254 is a cloud metadata'],
    [
      'http://metadata.google.internal/',
      'forbidden_host',
      'metadata.google.internal is a cloud metadata name',
    ],
    ['http://[fd00:ec2::254]/', 'forbidden_address', 'fd00:ec2::254 is a cloud metadata address'],
    ['http://[fd00::1]/', 'forbidden_address', 'fd00::1 is a unique local address'],
    ['http://[fe80::1]/', 'forbidden_address', 'fe80::1 is a link-local address'],
    ['http://[::ffff:127.0.0.1]/', 'forbidden_address', '::ffff:7f00:1 is a loopback address (IPv4-mapped)'],
    ['http://[64:ff9b::10.0.0.1]/', 'forbidden_address', 'is a private address (NAT64)'],
    ['http://2130706433/', 'forbidden_address', '127.0.0.1 is a loopback address'],
    ['http://0x7f.1/', 'forbidden_address', '127.0.0.1 is a loopback address'],
    ['http://0177.0.0.1/', 'forbidden_address', '127.0.0.1 is a loopback address'],
    ['http://127.1/', 'forbidden_address', '127.0.0.1 is a loopback address'],
    ['http://224.0.0.1/', 'forbidden_address', '224.0.0.1 is a multicast address'],
    ['http://255.255.255.255/', 'forbidden_address', '255.255.255.255 is a broadcast address'],
    ['http://internal.example.com/', 'forbidden_address', '10.0.0.5 is a private address'],
    ['http://mixed.example.com/', 'forbidden_address', '127.0.0.1 is a loopback address'],
    ['https://v6-internal.example.com/', 'forbidden_address', 'fd12:3456::1 is a unique local address'],
    ['http://mapped.example.com/', 'forbidden_address', 'a cloud metadata address (IPv4-mapped)'],
    ['http://nowhere.example.com/', 'unresolvable', 'ENOTFOUND'],
    ['http://empty.example.com/', 'unresolvable', 'no addresses'],
  ])('refuses %s (%s)', async (raw, rule, detail) => {
    const result = await check(raw);
    expect(result).toMatchObject({ ok: false, rule });
    if (result.ok) return;
    expect(result.message).toContain('`callback_url`');
    expect(result.message).toContain(detail);
    // The value is in the message, as the URL parser normalised it.
    expect(result.message).toContain(new URL(raw).href);
  });

  // Rows 31-33: credentials, scheme, type and length.
  it.each([
    ['http://user:pass@example.com/', 'credentials', 'without a user name or password'],
    ['http://user@example.com/', 'credentials', 'without a user name or password'],
    ['ftp://x', 'scheme', 'got `ftp:` in `ftp://x/`'],
    ['javascript:alert(1)', 'scheme', 'got `javascript:`'],
    ['file:///etc/passwd', 'scheme', 'got `file:`'],
    ['', 'syntax', 'absolute URL, got ``'],
    ['/relative/path', 'syntax', 'absolute URL, got `/relative/path`'],
    [123, 'type', 'string, got `123` (number)'],
    [null, 'type', 'string, got `null`'],
    [{ href: 'http://x' }, 'type', 'string, got an object'],
    [['http://x'], 'type', 'string, got an array'],
  ])('refuses %j (%s)', async (raw, rule, detail) => {
    const result = await check(raw);
    expect(result).toMatchObject({ ok: false, rule });
    if (!result.ok) expect(result.message).toContain(detail);
  });

  it('never echoes a password in the refusal', async () => {
    const result = await check('https://alice:s3cret@hooks.example.com/in');
    expect(result.ok).toBe(false);
    if (!result.ok) {
      expect(result.message).not.toContain('s3cret');
      expect(result.message).toContain('https://***@hooks.example.com/in');
    }
  });

  it('refuses a URL over 2,048 characters, and shows only the start of it', async () => {
    const long = `https://hooks.example.com/${'a'.repeat(100_000)}`;
    const result = await check(long);
    expect(result).toMatchObject({ ok: false, rule: 'length' });
    if (!result.ok) {
      expect(result.message).toContain('at most 2048 characters, got 100026');
      expect(result.message.length).toBeLessThan(300);
    }
    const exact = `https://hooks.example.com/${'a'.repeat(2048 - 26)}`;
    expect(exact.length).toBe(2048);
    expect(await check(exact)).toEqual({ ok: true, url: exact });
  });

  it('refuses a URL that percent-encoding takes over the limit', async () => {
    const raw = `https://hooks.example.com/${' '.repeat(1000)}x`;
    expect(raw.length).toBeLessThan(2048);
    const result = await check(raw);
    expect(result).toMatchObject({ ok: false, rule: 'length' });
    if (!result.ok) expect(result.message).toContain('once normalised');
  });

  it('accepts a public host and returns the normalised URL', async () => {
    expect(await check('HTTPS://Hooks.Example.com:443/done?x=1')).toEqual({
      ok: true,
      url: 'https://hooks.example.com/done?x=1',
    });
    expect(await check('http://93.184.215.14:8080/')).toEqual({
      ok: true,
      url: 'http://93.184.215.14:8080/',
    });
    expect(await check('http://[2606:4700:4700::1111]/')).toEqual({
      ok: true,
      url: 'http://[2606:4700:4700::1111]/',
    });
  });

  it('with allowPrivate, lets loopback, private and unresolvable hosts through without a lookup', async () => {
    lookups.length = 0;
    for (const raw of [
      'http://127.0.0.1:9999/',
      'http://localhost/',
      'http://[::1]/',
      'http://10.0.0.1/',
      'http://internal.example.com/',
      'http://nowhere.example.com/',
    ]) {
      expect(await check(raw, true)).toEqual({ ok: true, url: new URL(raw).href });
    }
    expect(lookups).toEqual([]);
    // The other rules still hold.
    expect(await check('http://u:p@127.0.0.1/', true)).toMatchObject({ ok: false, rule: 'credentials' });
    expect(await check('ftp://127.0.0.1/', true)).toMatchObject({ ok: false, rule: 'scheme' });
  });

  it('does not resolve IP literals', async () => {
    lookups.length = 0;
    await check('http://93.184.215.14/');
    await check('http://10.0.0.1/');
    expect(lookups).toEqual([]);
  });
});
