import { createToken, type ServerApp, type Store } from '@sluice/server';

// The one API client of the server tests: tokens minted in the server's store, and requests
// to its client API through a socket (`fetch`) or through `fastify.inject` (no socket), with
// one `Reply` shape for both.

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- response bodies are checked field by field
export type Body = Record<string, any>;

export interface Reply {
  status: number;
  retryAfter: string | null;
  headers: Headers;
  body: Body;
}

export type Role = 'admin' | 'member' | 'read';
export type Who = Partial<{ tenant: string; project: string; user: string; role: Role }>;

/** What a request may carry besides its JSON body and its token. */
export interface RequestExtras {
  /** A body sent as it is (as `application/json`), instead of `body` serialized. */
  raw?: string;
  /** More request headers. */
  headers?: Record<string, string>;
}

export interface ApiClient {
  /** A token of tenant `t`, project `p`, user `u` (admin unless given). */
  token(who?: Who): Promise<string>;
  /** A request to `/api/client/v1<path>` with the default admin token, or `token` (null: none). */
  call(
    method: string,
    path: string,
    body?: unknown,
    token?: string | null,
    extras?: RequestExtras,
  ): Promise<Reply>;
  /** The default admin token. */
  admin: string;
}

/** How a request reaches the server: its socket's URL, or its app for `inject`. */
export type Transport = { url: string } | { app: ServerApp };

/** Tokens of a server's store and requests to its API: the admin token unless another is given. */
export async function apiClientOf(server: { store: Store } & Transport): Promise<ApiClient> {
  const token: ApiClient['token'] = async (who = {}) =>
    (
      await createToken(server.store.db, {
        tenant: who.tenant ?? 't',
        project: who.project ?? 'p',
        user: who.user ?? 'u',
        role: who.role ?? 'admin',
      })
    ).secret;
  const admin = await token();
  const call: ApiClient['call'] = (method, path, body, as, extras = {}) => {
    const payload = extras.raw ?? (body !== undefined ? JSON.stringify(body) : undefined);
    const headers: Record<string, string> = {
      ...(as !== null ? { authorization: `Bearer ${as ?? admin}` } : {}),
      ...(payload !== undefined ? { 'content-type': 'application/json' } : {}),
      ...extras.headers,
    };
    const url = `/api/client/v1${path}`;
    return 'app' in server
      ? injected(server.app, method, url, headers, payload)
      : fetched(`${server.url}${url}`, method, headers, payload);
  };
  return { token, admin, call };
}

async function fetched(
  url: string,
  method: string,
  headers: Record<string, string>,
  payload: string | undefined,
): Promise<Reply> {
  const r = await fetch(url, { method, headers, body: payload });
  return {
    status: r.status,
    retryAfter: r.headers.get('retry-after'),
    headers: r.headers,
    body: (await r.json()) as Body,
  };
}

async function injected(
  app: ServerApp,
  method: string,
  url: string,
  headers: Record<string, string>,
  payload: string | undefined,
): Promise<Reply> {
  const r = await app.fastify.inject({ method: method as 'GET', url, headers, payload });
  return replyOf(r.statusCode, r.headers, JSON.parse(r.body) as Body);
}

/** A `Reply` from a status, headers as Node gives them (`IncomingHttpHeaders`, say) and a body. */
export function replyOf(
  status: number,
  headers: Record<string, string | string[] | number | undefined>,
  body: Body,
): Reply {
  const replyHeaders = new Headers();
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const one of Array.isArray(value) ? value : [value]) replyHeaders.append(name, String(one));
  }
  return { status, retryAfter: replyHeaders.get('retry-after'), headers: replyHeaders, body };
}
