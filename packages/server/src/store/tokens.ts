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

const hash = (secret: string) => createHash('sha256').update(secret).digest('hex');

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
    'INSERT INTO api_tokens (id, secret_hash, tenant, project, user_id, role) VALUES ($1, $2, $3, $4, $5, $6)',
    [id, hash(secret), who.tenant, who.project, who.user, who.role],
  );
  return { id, secret };
}

export async function findToken(db: Database, secret: string): Promise<Principal | undefined> {
  const row = (
    await db.query<{ id: string; tenant: string; project: string; user_id: string; role: Role }>(
      'SELECT id, tenant, project, user_id, role FROM api_tokens WHERE secret_hash = $1',
      [hash(secret)],
    )
  ).rows[0];
  return (
    row && { tokenId: row.id, tenant: row.tenant, project: row.project, user: row.user_id, role: row.role }
  );
}
