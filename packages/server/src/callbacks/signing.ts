import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { SqlClient } from '@sluice/postgres/database';
import { systemClock } from 'sluice/concurrency';

/**
 * Standard Webhooks signatures (https://www.standardwebhooks.com): the sender puts
 * `webhook-id`, `webhook-timestamp` (unix seconds) and `webhook-signature: v1,<base64>`
 * on the request, where the signature is HMAC-SHA256 of `id.timestamp.body` keyed with the
 * bytes behind the `whsec_` secret. Receivers verify with any Standard Webhooks library.
 */

const secretPrefix = 'whsec_';
const secretBytes = 32;
const signatureBytes = 32;

/** A new signing secret: `whsec_` and the base64 of 32 random bytes. */
export function generateSigningSecret(): string {
  return secretPrefix + randomBytes(secretBytes).toString('base64');
}

/**
 * The tenant's callback signing secret, created on first use. Race-safe across processes:
 * the insert that loses the race does nothing, and the read after it (a new statement, so a
 * new snapshot) sees the winner's row.
 *
 * @example
 * // `sluice webhooks secret --tenant acme` prints this.
 * console.log(await tenantSigningSecret(store.db, 'acme'));
 */
export async function tenantSigningSecret(db: SqlClient, tenant: string): Promise<string> {
  if (typeof tenant !== 'string' || tenant === '') {
    throw new TypeError(`Expected \`tenant\` to be a non-empty string, got \`${String(tenant)}\``);
  }
  const read = async () =>
    (
      await db.query<{ secret: string }>('SELECT secret FROM tenant_secrets WHERE tenant = $1::text', [
        tenant,
      ])
    ).rows[0]?.secret;
  // Read first: every delivery asks, and only the first one for a tenant needs to write.
  const existing = await read();
  if (existing !== undefined) return existing;
  const inserted = await db.query<{ secret: string }>(
    `INSERT INTO tenant_secrets (tenant, secret) VALUES ($1::text, $2::text)
     ON CONFLICT (tenant) DO NOTHING RETURNING secret`,
    [tenant, generateSigningSecret()],
  );
  return inserted.rows[0]?.secret ?? (await read())!;
}

/**
 * The `webhook-signature` value for one message: `v1,` and the base64 HMAC-SHA256 of
 * `id.timestamp.body`, keyed with the decoded secret.
 *
 * @example
 * const signature = signWebhook(secret, 'msg_1', Math.floor(Date.now() / 1000), JSON.stringify(run));
 */
export function signWebhook(
  secret: string | Uint8Array,
  id: string,
  timestamp: number,
  body: string | Uint8Array,
): string {
  return `v1,${hmac(secret, id, timestamp, body).toString('base64')}`;
}

export interface VerifyOptions {
  /** How far the timestamp may be from `now`, either way. @default 300 */
  toleranceSeconds?: number;
  /** Epoch milliseconds. @default the current time */
  now?: number;
}

/** Header access for Node's `IncomingHttpHeaders` (lower-case keys) and fetch's `Headers`. */
export type WebhookHeaders =
  Record<string, string | string[] | undefined> | { get(name: string): string | null };

export type WebhookVerification = { ok: true; id: string; timestamp: number } | { ok: false; reason: string };

/**
 * Checks a Standard Webhooks signature over the raw body: the id and timestamp headers are
 * present, the timestamp is within the tolerance, and one of the `v1,` signatures in the
 * (space-separated) header matches, compared in constant time.
 *
 * @example
 * const check = verifyWebhook(secret, request.headers, rawBody);
 * if (!check.ok) return reply.status(401).send({ error: check.reason });
 */
export function verifyWebhook(
  secret: string | Uint8Array,
  headers: WebhookHeaders,
  body: string | Uint8Array,
  options: VerifyOptions = {},
): WebhookVerification {
  const toleranceSeconds = options.toleranceSeconds ?? 300;
  const now = options.now ?? systemClock.now();
  const id = header(headers, 'webhook-id');
  const timestampText = header(headers, 'webhook-timestamp');
  const signatures = header(headers, 'webhook-signature');
  if (!id) return { ok: false, reason: 'missing webhook-id header' };
  if (!timestampText) return { ok: false, reason: 'missing webhook-timestamp header' };
  if (!signatures) return { ok: false, reason: 'missing webhook-signature header' };
  if (!/^\d{1,15}$/.test(timestampText)) {
    return { ok: false, reason: `webhook-timestamp is not unix seconds: \`${timestampText.slice(0, 40)}\`` };
  }
  const timestamp = Number(timestampText);
  const skew = Math.abs(now / 1000 - timestamp);
  if (skew > toleranceSeconds) {
    return {
      ok: false,
      reason: `webhook-timestamp ${timestamp} is ${Math.round(skew)} s from now; the tolerance is ${toleranceSeconds} s`,
    };
  }
  const expected = hmac(secret, id, timestamp, body);
  for (const candidate of signatures.split(' ')) {
    const [version, encoded] = candidate.split(',', 2);
    if (version !== 'v1' || !encoded) continue;
    const given = Buffer.from(encoded, 'base64');
    if (given.length === signatureBytes && timingSafeEqual(given, expected)) {
      return { ok: true, id, timestamp };
    }
  }
  return { ok: false, reason: 'no webhook-signature matches the body' };
}

function hmac(secret: string | Uint8Array, id: string, timestamp: number, body: string | Uint8Array): Buffer {
  return createHmac('sha256', keyOf(secret)).update(`${id}.${timestamp}.`).update(body).digest();
}

function keyOf(secret: string | Uint8Array): Uint8Array {
  if (typeof secret !== 'string') return secret;
  const key = Buffer.from(
    secret.startsWith(secretPrefix) ? secret.slice(secretPrefix.length) : secret,
    'base64',
  );
  if (key.length === 0)
    throw new TypeError('Expected a signing secret of `whsec_` and base64 bytes, got an empty key');
  return key;
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof headers.get === 'function') return headers.get(name) ?? undefined;
  const value = (headers as Record<string, string | string[] | undefined>)[name];
  return Array.isArray(value) ? value[0] : value;
}
