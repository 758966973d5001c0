import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { verifyWebhook } from '../callbacks/signing.js';

type Headers = Record<string, string | string[] | undefined>;

/** A verified delivery: the key that makes its repeats one run. */
export type Verified = { ok: true; key: string } | { ok: false; reason: string };

const header = (headers: Headers, name: string): string | undefined => {
  const value = headers[name];
  return Array.isArray(value) ? value[0] : value;
};

/** Delivery ids longer than this are refused: they are stored as the key of a row. */
export const MAX_DELIVERY_ID = 256;

/**
 * Checks a trigger's webhook over the raw body bytes, in either of the two schemes senders use:
 * - Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>`),
 *   keyed with the bytes behind the `whsec_` secret, the timestamp within 5 minutes of `nowMs`;
 * - GitHub (`X-Hub-Signature-256: sha256=<hex>` of the body), keyed with the secret's text as
 *   it was pasted into GitHub's settings.
 * When both are present the Standard Webhooks headers decide: they carry a signed time and id.
 * The key is the signed `webhook-id`, or GitHub's `X-GitHub-Delivery` (which GitHub does not
 * sign: its scheme has no replay protection, see docs/server.md), or without one the body's hash.
 */
export function verifyDelivery(secret: string, headers: Headers, body: Buffer, nowMs: number): Verified {
  if (header(headers, 'webhook-signature') !== undefined) {
    const checked = verifyWebhook(secret, headers, body, { now: nowMs, toleranceSeconds: 300 });
    if (!checked.ok) return checked;
    if (checked.id.length > MAX_DELIVERY_ID)
      return { ok: false, reason: `webhook-id is longer than ${MAX_DELIVERY_ID} characters` };
    return { ok: true, key: `id:${checked.id}` };
  }
  const github = header(headers, 'x-hub-signature-256');
  if (github !== undefined) {
    const match = /^sha256=([0-9a-fA-F]{64})$/.exec(github.trim());
    if (!match) return { ok: false, reason: 'X-Hub-Signature-256 is not sha256=<64 hex digits>' };
    const expected = createHmac('sha256', secret).update(body).digest();
    if (!timingSafeEqual(Buffer.from(match[1]!, 'hex'), expected))
      return { ok: false, reason: 'X-Hub-Signature-256 does not match the body' };
    const delivery = header(headers, 'x-github-delivery');
    if (delivery !== undefined && delivery.length > 0 && delivery.length <= MAX_DELIVERY_ID)
      return { ok: true, key: `github:${delivery}` };
    return { ok: true, key: `body:${createHash('sha256').update(body).digest('hex')}` };
  }
  return { ok: false, reason: 'no webhook-signature or X-Hub-Signature-256 header' };
}
