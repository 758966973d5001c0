import { createHash } from 'node:crypto';
import type { Database } from '@sluice/postgres/database';
import { toJsonb } from '../runs/json.js';
import type { Principal } from '../store/tokens.js';
import { getThread, type NewThread, type ThreadRow } from '../threads/store.js';

/**
 * The Sluice thread behind an AG-UI `threadId`. A Sluice thread id of the token's tenant is used
 * as it is. Any other id (AG-UI clients make up their own) names a thread of its own, created on
 * first use with an id derived from the tenant and the client's id: the same client id always
 * takes the same lock, two first runs at once create one thread, and no tenant can reach
 * another's. A thread created here starts with the history the client resent before its trailing
 * turn; from then on the thread keeps the conversation (each successful run appends its turn and
 * its answer), as for every thread. `created` is set when this call made it: a refusal of the
 * request removes it again (see `RunRequest.newThread`).
 */
/** The id of the Sluice thread made for a client's own thread id. */
const derivedId = (tenant: string, threadId: string) =>
  `thr_${createHash('sha256').update(`ag-ui\u0000${tenant}\u0000${threadId}`).digest('hex').slice(0, 24)}`;

/** The Sluice thread behind an AG-UI `threadId` (see `threadOfAgUi`), if there is one; none is created. */
export async function findAgUiThread(
  db: Database,
  who: Principal,
  threadId: string,
): Promise<ThreadRow | undefined> {
  return (
    (await getThread(db, who.tenant, threadId)) ?? getThread(db, who.tenant, derivedId(who.tenant, threadId))
  );
}

export async function threadOfAgUi(
  db: Database,
  who: Principal,
  threadId: string,
  history: { role: string; content: unknown }[],
): Promise<{ id: string; created?: NewThread }> {
  if (await getThread(db, who.tenant, threadId)) return { id: threadId };
  const id = derivedId(who.tenant, threadId);
  // One statement: only the run that creates the thread writes its history, in order.
  const { rows } = await db.query<{ id: string }>(
    `WITH t AS (INSERT INTO threads (id, tenant, project, user_id, metadata)
                VALUES ($1::text, $2::text, $3::text, $4::text, $5::jsonb)
                ON CONFLICT (id) DO NOTHING RETURNING id),
     m AS (INSERT INTO thread_messages (thread_id, role, content)
           SELECT t.id, m.value ->> 'role', m.value -> 'content'
           FROM t, jsonb_array_elements($6::jsonb) WITH ORDINALITY AS m(value, n) ORDER BY m.n)
     SELECT id FROM t`,
    [id, who.tenant, who.project, who.user, toJsonb({ ag_ui_thread_id: threadId }), toJsonb(history)],
  );
  return rows.length > 0 ? { id, created: { id } } : { id };
}
