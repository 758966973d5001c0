import type { SqlClient } from '@sluice/postgres/database';
import type { Principal } from '../store/tokens.js';
import { randomId } from '../store/ids.js';

/** Uploaded files in PostgreSQL (PGlite on the embedded path), always read under their tenant. */

export interface FileMeta {
  id: string;
  bytes: number;
  mime_type: string;
  /** Epoch seconds. */
  created_at: number;
}

const meta = `id, bytes, mime_type, (extract(epoch FROM created_at))::float8 AS created_at`;

export async function insertFile(
  db: SqlClient,
  who: Principal,
  file: { content: Buffer; mimeType: string },
): Promise<FileMeta> {
  const rows = await db.query<FileMeta>(
    `INSERT INTO files (id, tenant, project, user_id, mime_type, bytes, content)
     VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::int, $7::bytea)
     RETURNING ${meta}`,
    [
      randomId('file_', 12),
      who.tenant,
      who.project,
      who.user,
      file.mimeType,
      file.content.length,
      file.content,
    ],
  );
  return rows.rows[0]!;
}

export async function getFile(db: SqlClient, tenant: string, id: string): Promise<FileMeta | undefined> {
  const rows = await db.query<FileMeta>(
    `SELECT ${meta} FROM files WHERE id = $1::text AND tenant = $2::text`,
    [id, tenant],
  );
  return rows.rows[0];
}

export async function getFileContent(
  db: SqlClient,
  tenant: string,
  id: string,
): Promise<{ mime_type: string; content: Uint8Array } | undefined> {
  const rows = await db.query<{ mime_type: string; content: Uint8Array }>(
    'SELECT mime_type, content FROM files WHERE id = $1::text AND tenant = $2::text',
    [id, tenant],
  );
  return rows.rows[0];
}

/** The files of `ids` the tenant has, by id (their bytes with `content`). */
export async function filesOf(
  db: SqlClient,
  tenant: string,
  ids: readonly string[],
  content: boolean,
): Promise<Map<string, { mime_type: string; content?: Uint8Array }>> {
  if (ids.length === 0) return new Map();
  const rows = await db.query<{ id: string; mime_type: string; content?: Uint8Array }>(
    `SELECT id, mime_type${content ? ', content' : ''} FROM files WHERE tenant = $1::text AND id = ANY($2::text[])`,
    [tenant, [...new Set(ids)]],
  );
  return new Map(rows.rows.map((r) => [r.id, r]));
}

/** Deletes a tenant's file; false when it has none of that id. */
export async function deleteFile(db: SqlClient, tenant: string, id: string): Promise<boolean> {
  const rows = await db.query<{ id: string }>(
    'DELETE FROM files WHERE id = $1::text AND tenant = $2::text RETURNING id',
    [id, tenant],
  );
  return rows.rows.length > 0;
}
