import type { CallOptions, Transport } from './http.js';
import type { CreateThreadBody, Page, Thread, ThreadMessage } from './types.js';

const enc = encodeURIComponent;

/** The thread calls of a client (see `createClient`). */
export function threadCalls(t: Transport) {
  return {
    create: (body: CreateThreadBody = {}, options?: CallOptions) =>
      t.json<Thread>('POST', '/threads', body, options),
    get: (id: string, options?: CallOptions) =>
      t.json<Thread>('GET', `/threads/${enc(id)}`, undefined, options),
    /** The thread's messages, oldest first, fetched a page (`limit`) at a time as they are read. */
    messages(id: string, options: CallOptions & { limit?: number } = {}): AsyncIterable<ThreadMessage> {
      return {
        async *[Symbol.asyncIterator]() {
          let cursor: string | null = null;
          do {
            const query = new URLSearchParams();
            if (options.limit !== undefined) query.set('limit', String(options.limit));
            if (cursor !== null) query.set('cursor', cursor);
            const search = query.toString();
            const page: Page<ThreadMessage> = await t.json<Page<ThreadMessage>>(
              'GET',
              `/threads/${enc(id)}/messages${search ? `?${search}` : ''}`,
              undefined,
              options,
            );
            yield* page.data;
            cursor = page.next_cursor;
          } while (cursor !== null);
        },
      };
    },
  };
}
