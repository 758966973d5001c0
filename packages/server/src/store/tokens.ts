import { createHash, randomBytes } from 'node:crypto';
import type { Database } from '@sluice/postgres/database';

export type Role = 'admin' | 'member' | 'read';

export interface Principal {
  readonly tokenId: string;
  readonly tenant: string;
  readonly project: string;
  readonly user: string;
  readonly role: Role;
}

/** How a token's secret is stored and looked up. */
export const hashSecret = (secret: string) => createHash('sha256').update(secret).digest('hex');
const hash = hashSecret;

/** Creates a token and returns its secret, which is stored only as a hash. */
export async function createToken(
  db: Database,
  who: { tenant: string; project: string; user: string; role: Role },
): Promise<{ id: string; secret: string }> {
  for (const [field, value] of Object.entries(who)) {
    if (typeof value !== 'string' || !/^[A-Za-z0-9._@-]{1,128}$/.test(value)) {
      throw new TypeError(
        `Expected \`${field}\` to be 1 to 128 letters, digits, . _ @ or -, got \`${String(value)}\``,
      );
    }
  }
  if (!['admin', 'member', 'read'].includes(who.role)) {
    throw new TypeError(`Expected \`role\` to be admin, member or read, got \`${who.role}\``);
  }
  const id = `tok_${randomBytes(8).toString('hex')}`;
  const secret = `sk_${randomBytes(24).toString('base64url')}`;
  await db.query(
    'INSERT INTO api_tokens (id, secret_hash, tenant, project, user_id, role) VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text)',
    [id, hash(secret), who.tenant, who.project, who.user, who.role],
  );
  return { id, secret };
}

/** The principal of a live token; a revoked or unknown secret finds nothing. */
export async function findToken(db: Database, secret: string): Promise<Principal | undefined> {
  const row = (
    await db.query<{ id: string; tenant: string; project: string; user_id: string; role: Role }>(
      'SELECT id, tenant, project, user_id, role FROM api_tokens WHERE secret_hash = $1::text AND revoked_at IS NULL',
      [hash(secret)],
    )
  ).rows[0];
  return (
    row && { tokenId: row.id, tenant: row.tenant, project: row.project, user: row.user_id, role: row.role }
  );
}

export interface TokenInfo {
  id: string;
  tenant: string;
  project: string;
  user: string;
  role: Role;
  created_at: string;
  revoked_at: string | null;
}

/** Tokens (never their secrets), oldest first; one tenant's when `tenant` is given. */
export async function listTokens(db: Database, tenant?: string): Promise<TokenInfo[]> {
  return (
    await db.query<TokenInfo>(
      `SELECT id, tenant, project, user_id AS user, role, created_at::text AS created_at, revoked_at::text AS revoked_at
       FROM api_tokens WHERE $1::text IS NULL OR tenant = $1::text ORDER BY created_at, id`,
      [tenant ?? null],
    )
  ).rows;
}

/** Revokes a token; false when there is no such live token. Effective on the next request everywhere. */
export async function revokeToken(db: Database, id: string): Promise<boolean> {
  // Every server process drops the token from its principal cache on this notification.
  const result = await db.query<{ id: string }>(
    `WITH revoked AS (
       UPDATE api_tokens SET revoked_at = clock_timestamp() WHERE id = $1::text AND revoked_at IS NULL RETURNING id
     )
     SELECT id, pg_notify('sluice_runs', 'token:' || id) FROM revoked`,
    [id],
  );
  return result.rows.length > 0;
}

/**
 * Tokens ever made, revoked ones included. `sluice serve` mints a first admin token only for a
 * store that never had one: revoking every token and restarting must not print a new one.
 */
export async function countTokens(db: Database): Promise<number> {
  return (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM api_tokens')).rows[0]!.n;
}
