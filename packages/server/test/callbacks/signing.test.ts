import { describe, expect, it } from 'vitest';
import {
  generateSigningSecret,
  signWebhook,
  tenantSigningSecret,
  verifyWebhook,
} from '../../src/callbacks/index.js';
import { openDatabase, postgres } from './helpers.js';
import { describeWith } from '../../../../scripts/service-suites.js';

// The Standard Webhooks specification's published example: a receiver's library must accept
// what we send, and this vector is what says it will.
const vector = {
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  id: 'msg_p5jXN8AQM9LWM0D4loKWxJek',
  timestamp: 1614265330,
  body: '{"test": 2432232314}',
  signature: 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=',
};
const at = (seconds: number) => ({ now: seconds * 1000 });
const headersOf = (id: string, timestamp: number | string, signature: string) => ({
  'webhook-id': id,
  'webhook-timestamp': String(timestamp),
  'webhook-signature': signature,
});

describe('signWebhook and verifyWebhook', () => {
  it('reproduce the Standard Webhooks test vector', () => {
    expect(signWebhook(vector.secret, vector.id, vector.timestamp, vector.body)).toBe(vector.signature);
    expect(
      verifyWebhook(
        vector.secret,
        headersOf(vector.id, vector.timestamp, vector.signature),
        vector.body,
        at(vector.timestamp),
      ),
    ).toEqual({ ok: true, id: vector.id, timestamp: vector.timestamp });
  });

  it('sign with the decoded secret: a Buffer of the same bytes gives the same signature', () => {
    const bytes = Buffer.from(vector.secret.slice('whsec_'.length), 'base64');
    expect(signWebhook(bytes, vector.id, vector.timestamp, Buffer.from(vector.body))).toBe(vector.signature);
  });

  it('accept any one matching signature among several (secret rotation)', () => {
    const headers = headersOf(vector.id, vector.timestamp, `v1,bm9wZQ== v2,abc ${vector.signature}`);
    expect(verifyWebhook(vector.secret, headers, vector.body, at(vector.timestamp)).ok).toBe(true);
  });

  it('read fetch Headers and array-valued Node headers', () => {
    const fetchHeaders = new Headers(headersOf(vector.id, vector.timestamp, vector.signature));
    expect(verifyWebhook(vector.secret, fetchHeaders, vector.body, at(vector.timestamp)).ok).toBe(true);
    const nodeHeaders = {
      'webhook-id': [vector.id],
      'webhook-timestamp': String(vector.timestamp),
      'webhook-signature': vector.signature,
    };
    expect(verifyWebhook(vector.secret, nodeHeaders, vector.body, at(vector.timestamp)).ok).toBe(true);
  });

  it.each([
    [
      'a changed body',
      headersOf(vector.id, vector.timestamp, vector.signature),
      '{"test": 2432232315}',
      'no webhook-signature matches',
    ],
    [
      'another id',
      headersOf('msg_other', vector.timestamp, vector.signature),
      vector.body,
      'no webhook-signature matches',
    ],
    [
      'a v2 signature only',
      headersOf(vector.id, vector.timestamp, vector.signature.replace('v1,', 'v2,')),
      vector.body,
      'no webhook-signature matches',
    ],
    [
      'a truncated signature',
      headersOf(vector.id, vector.timestamp, vector.signature.slice(0, 20)),
      vector.body,
      'no webhook-signature matches',
    ],
    [
      'no id',
      { 'webhook-timestamp': '1614265330', 'webhook-signature': vector.signature },
      vector.body,
      'missing webhook-id',
    ],
    [
      'no timestamp',
      { 'webhook-id': vector.id, 'webhook-signature': vector.signature },
      vector.body,
      'missing webhook-timestamp',
    ],
    [
      'no signature',
      { 'webhook-id': vector.id, 'webhook-timestamp': '1614265330' },
      vector.body,
      'missing webhook-signature',
    ],
    [
      'a timestamp in ms',
      headersOf(vector.id, '1614265330.5', vector.signature),
      vector.body,
      'not unix seconds',
    ],
  ])('refuse %s', (_what, headers, body, reason) => {
    const result = verifyWebhook(vector.secret, headers, body, at(vector.timestamp));
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.reason).toContain(reason);
  });

  it('refuse a timestamp outside the tolerance, either way, and accept one at its edge', () => {
    const headers = headersOf(vector.id, vector.timestamp, vector.signature);
    expect(verifyWebhook(vector.secret, headers, vector.body, at(vector.timestamp + 300)).ok).toBe(true);
    expect(verifyWebhook(vector.secret, headers, vector.body, at(vector.timestamp - 300)).ok).toBe(true);
    const late = verifyWebhook(vector.secret, headers, vector.body, at(vector.timestamp + 301));
    expect(late).toEqual({
      ok: false,
      reason: 'webhook-timestamp 1614265330 is 301 s from now; the tolerance is 300 s',
    });
    expect(verifyWebhook(vector.secret, headers, vector.body, at(vector.timestamp - 301)).ok).toBe(false);
    expect(
      verifyWebhook(vector.secret, headers, vector.body, {
        now: (vector.timestamp + 1000) * 1000,
        toleranceSeconds: 1000,
      }).ok,
    ).toBe(true);
  });

  it('refuse another secret', () => {
    const headers = headersOf(vector.id, vector.timestamp, vector.signature);
    expect(verifyWebhook(generateSigningSecret(), headers, vector.body, at(vector.timestamp)).ok).toBe(false);
  });

  it('generate secrets of whsec_ and 32 random bytes', () => {
    const a = generateSigningSecret();
    expect(a).toMatch(/^whsec_[A-Za-z0-9+/]+=*$/);
    expect(Buffer.from(a.slice(6), 'base64')).toHaveLength(32);
    expect(generateSigningSecret()).not.toBe(a);
  });

  it('throw on an empty secret rather than sign with an empty key', () => {
    expect(() => signWebhook('whsec_', 'id', 1, 'x')).toThrow(/empty key/);
  });
});

describeWith({ PostgreSQL: postgres })('tenantSigningSecret', () => {
  it('creates one secret per tenant, once, even when many calls race on several connections', async () => {
    const { db } = await openDatabase();
    const secrets = await Promise.all(Array.from({ length: 24 }, () => tenantSigningSecret(db, 'acme')));
    expect(new Set(secrets).size).toBe(1);
    expect(secrets[0]).toMatch(/^whsec_/);
    expect(await tenantSigningSecret(db, 'acme')).toBe(secrets[0]);
    const other = await tenantSigningSecret(db, 'globex');
    expect(other).not.toBe(secrets[0]);
    const rows = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM tenant_secrets');
    expect(rows.rows[0]!.n).toBe(2);
  });

  it('names the field when the tenant is empty', async () => {
    const { db } = await openDatabase();
    await expect(tenantSigningSecret(db, '')).rejects.toThrow(
      'Expected `tenant` to be a non-empty string, got ``',
    );
  });
});
