/** An error that becomes an HTTP response: status, headers and the `{ error: {...} }` body. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    message: string,
    readonly details: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }

  body() {
    return { error: { type: this.type, message: this.message, ...this.details } };
  }
}

export const badRequest = (message: string, details: Record<string, unknown> = {}) =>
  new HttpError(400, 'invalid_request', message, details);
export const notFound = (message: string) => new HttpError(404, 'not_found', message);
