import type { Database } from '@sluice/postgres/database';
import { HttpError, shown } from '../http/errors.js';
import { isFinal } from '../runs/lifecycle.js';
import { full, getRun, type RunRow } from '../runs/store.js';
import type { Principal } from '../store/tokens.js';
import { newThreadMessages, type NewThread } from '../threads/store.js';
import { randomId } from '../store/ids.js';

/**
 * `previous_response_id` chains as threads. A response starts no thread of its own; the first
 * follow-up makes one, seeded with that response's conversation, and every later response of
 * the chain continues it (and waits its turn on it, as any run of a thread does). `created` is
 * set when this call made the thread: a refusal of the follow-up removes it again, and the
 * previous response goes back to having none (see `RunRequest.newThread`).
 */
export async function threadOfChain(
  db: Database,
  who: Principal,
  previousId: string,
): Promise<{ id: string; created?: NewThread }> {
  const previous = await getRun(db, who.tenant, previousId);
  // Responses only: a chat completion or a run of the runs API is not a response to continue.
  if (!previous || previous.api_request === null || previous.api_request.api === 'chat.completions') {
    throw new HttpError(400, 'previous_response_not_found', `No previous response \`${shown(previousId)}\``, {
      field: 'previous_response_id',
    });
  }
  if (previous.thread_id !== null) return { id: previous.thread_id };
  if (!isFinal(previous.status)) {
    throw new HttpError(
      409,
      'previous_response_in_progress',
      `Response ${previous.id} is still ${previous.status}; continue it once it has ended`,
      { field: 'previous_response_id' },
    );
  }
  return db.transaction(async (tx) => {
    // Under the row's lock: two follow-ups of one response make one thread between them.
    const row = (
      await tx.query<RunRow>(`SELECT ${full} FROM agent_runs WHERE id = $1::text FOR UPDATE`, [previous.id])
    ).rows[0]!;
    if (row.thread_id !== null) return { id: row.thread_id };
    const id = randomId('thr_', 12);
    await tx.query(
      `INSERT INTO threads (id, tenant, project, user_id, metadata) VALUES ($1::text, $2::text, $3::text, $4::text, '{}'::jsonb)`,
      [id, row.tenant, row.project, row.user_id],
    );
    const text = (row.output as { text?: unknown } | null)?.text;
    const seeded =
      row.status === 'succeeded' && typeof text === 'string'
        ? newThreadMessages(row.input, text)
        : newThreadMessages(row.input, '').slice(0, -1);
    await tx.query(
      `INSERT INTO thread_messages (thread_id, role, content, run_id)
       SELECT $1::text, m.value ->> 'role', m.value -> 'content', $2::text
       FROM jsonb_array_elements($3::jsonb) WITH ORDINALITY AS m(value, n) ORDER BY m.n`,
      [id, row.id, JSON.stringify(seeded)],
    );
    await tx.query('UPDATE agent_runs SET thread_id = $2::text WHERE id = $1::text', [row.id, id]);
    return { id, created: { id, seededFrom: row.id } };
  });
}
