import { SluiceError } from './errors.js';
import { segment, type CallOptions, type Transport } from './http.js';
import type { CreateThreadBody, Page, Thread, ThreadMessage } from './types.js';

/** The thread calls of a client (see `createClient`). */
export function threadCalls(t: Transport) {
  return {
    create: async (body: CreateThreadBody = {}, options?: CallOptions) =>
      t.json<Thread>('POST', '/threads', body, options),
    get: async (id: string, options?: CallOptions) =>
      t.json<Thread>('GET', `/threads/${segment('id', id)}`, undefined, options),
    /**
     * The thread's messages, oldest first, fetched a page (`limit`) at a time as they are read.
     * A cursor the server sends twice is a SluiceError (reading on would loop for ever).
     */
    messages(id: string, options: CallOptions & { limit?: number } = {}): AsyncIterable<ThreadMessage> {
      const path = `/threads/${segment('id', id)}/messages`;
      return {
        async *[Symbol.asyncIterator]() {
          const seen = new Set<string>();
          let cursor: string | null = null;
          do {
            const query = new URLSearchParams();
            if (options.limit !== undefined) query.set('limit', String(options.limit));
            if (cursor !== null) query.set('cursor', cursor);
            const search = query.toString();
            const page: Page<ThreadMessage> = await t.json<Page<ThreadMessage>>(
              'GET',
              `${path}${search ? `?${search}` : ''}`,
              undefined,
              options,
            );
            if (!Array.isArray(page?.data))
              throw new SluiceError(200, {
                type: 'invalid_response',
                message: `A page of thread ${id}'s messages has no \`data\` list`,
              });
            yield* page.data;
            cursor = typeof page.next_cursor === 'string' ? page.next_cursor : null;
            if (cursor !== null && seen.has(cursor))
              throw new SluiceError(200, {
                type: 'invalid_response',
                message: `The server sent the cursor \`${cursor}\` of thread ${id}'s messages twice; reading on would loop for ever`,
              });
            if (cursor !== null) seen.add(cursor);
          } while (cursor !== null);
        },
      };
    },
  };
}
