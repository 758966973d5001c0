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
  /** The parsed JSON body (`{}` when `anyBody` let a body that is not JSON through). */
  body: Body;
  /** The body as it came; this client always sets it (optional for replies built elsewhere). */
  text?: string;
}

export type Role = 'admin' | 'member' | 'read';
export type Who = Partial<{ tenant: string; project: string; user: string; role: Role }>;

/** What a request may carry besides its JSON body and its token. */
export interface RequestExtras {
  /** A body sent as it is (as `application/json` unless `headers` say otherwise), instead of `body` serialized. */
  raw?: string | Buffer;
  /** More request headers. */
  headers?: Record<string, string>;
  /** `path` is the whole path (`/readyz`, `/api/client/v1/...`), not one under `/api/client/v1`. */
  fullPath?: boolean;
  /** The answer may be empty or not JSON: `body` is then `{}`, and `text` holds what came. */
  anyBody?: boolean;
}

export interface ApiClient {
  /** A token of tenant `t`, project `p`, user `u` (admin unless given). */
  token(who?: Who): Promise<string>;
  /** A request to `/api/client/v1<path>` (or `path`, see `fullPath`) with the default admin token, or `token` (null: none). */
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
    const url = extras.fullPath ? path : `/api/client/v1${path}`;
    const parse = (text: string) => bodyOf(text, extras.anyBody === true);
    return 'app' in server
      ? injected(server.app, method, url, headers, payload, parse)
      : fetched(`${server.url}${url}`, method, headers, payload, parse);
  };
  return { token, admin, call };
}

async function fetched(
  url: string,
  method: string,
  headers: Record<string, string>,
  payload: string | Buffer | undefined,
  parse: (text: string) => Body,
): Promise<Reply> {
  const r = await fetch(url, { method, headers, body: payload });
  const text = await r.text();
  return {
    status: r.status,
    retryAfter: r.headers.get('retry-after'),
    headers: r.headers,
    body: parse(text),
    text,
  };
}

async function injected(
  app: ServerApp,
  method: string,
  url: string,
  headers: Record<string, string>,
  payload: string | Buffer | undefined,
  parse: (text: string) => Body,
): Promise<Reply> {
  const r = await app.fastify.inject({ method: method as 'GET', url, headers, payload });
  return replyOf(r.statusCode, r.headers, parse(r.body), r.body);
}

/** A body parsed as JSON; with `any`, `{}` for one that is empty or not JSON. */
function bodyOf(text: string, any: boolean): Body {
  if (!any) return JSON.parse(text) as Body;
  try {
    return text === '' ? {} : (JSON.parse(text) as Body);
  } catch {
    return {};
  }
}

/** A `Reply` from a status, headers as Node gives them (`IncomingHttpHeaders`, say) and a body. */
export function replyOf(
  status: number,
  headers: Record<string, string | string[] | number | undefined>,
  body: Body,
  text: string = JSON.stringify(body),
): Reply {
  const replyHeaders = new Headers();
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const one of Array.isArray(value) ? value : [value]) replyHeaders.append(name, String(one));
  }
  return { status, retryAfter: replyHeaders.get('retry-after'), headers: replyHeaders, body, text };
}
