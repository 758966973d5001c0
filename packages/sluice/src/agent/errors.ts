/** The run passed its `timeoutMs`, or its parent's budget ran out. */
export class RunTimeoutError extends Error {
  override readonly name = 'TimeoutError';
  constructor(
    readonly runId: string,
    readonly timeoutMs: number,
  ) {
    super(`Run ${runId} passed its time budget of ${timeoutMs} ms`);
  }
}
