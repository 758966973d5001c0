import type { AgentTool } from '@mariozechner/pi-agent-core';
import type { TextContent } from '@mariozechner/pi-ai';
import type { RunScope } from './scope.js';
import { Semaphore } from './semaphore.js';
import { LinkedAbort, timer } from './signals.js';
import type { Tool, ToolContext } from './tool.js';

/** What bounds a run's tool calls. */
export interface ToolCallBounds {
  readonly maxParallelToolCalls: number;
  readonly toolTimeoutMs: number | undefined;
}

function toolResultContent(value: unknown): TextContent[] {
  const text = typeof value === 'string' ? value : (JSON.stringify(value) ?? 'null');
  return [{ type: 'text', text }];
}

/**
 * The run's tools as pi-agent-core runs them: at most `maxParallelToolCalls` at once, each
 * stopped by the run's cancellation and by `toolTimeoutMs`. A throw, a cancellation or a
 * timeout becomes an error result the model sees (pi-agent-core turns the rejection into one).
 * A call `isPending` names waits for a person: it does not run, and its stand-in result is
 * dropped from the run's messages when the run pauses.
 */
export function toAgentTools(
  tools: readonly Tool<never>[],
  scope: RunScope,
  bounds: ToolCallBounds,
  isPending: (toolCallId: string) => boolean = () => false,
): AgentTool[] {
  const semaphore = new Semaphore(bounds.maxParallelToolCalls);
  return tools.map((t) => ({
    name: t.name,
    label: t.name,
    description: t.description,
    parameters: t.jsonSchema as AgentTool['parameters'],
    execute: (toolCallId, params, signal) =>
      semaphore.run(async () => {
        if (isPending(toolCallId))
          return { content: toolResultContent('awaiting a person'), details: undefined };
        const result = await scope.trace.toolCall(
          t.name,
          toolCallId,
          () => scope.signal.aborted,
          () => callTool(t, params, { signal: signal ?? scope.signal, scope, toolCallId, bounds }),
        );
        return { content: toolResultContent(result), details: undefined };
      }),
  }));
}

/**
 * One tool call. The tool's own promise races its bounds, so a tool that ignores its signal
 * still cannot hold the run past its timeout or its cancellation.
 */
function callTool(
  t: Tool<never>,
  params: unknown,
  call: { signal: AbortSignal; scope: RunScope; toolCallId: string; bounds: ToolCallBounds },
): Promise<unknown> {
  const { scope, bounds } = call;
  const stop = new LinkedAbort([call.signal]);
  const timeout = timer(scope.clock, bounds.toolTimeoutMs, () =>
    stop.abort(new Error(`Tool ${t.name} passed toolTimeoutMs (${bounds.toolTimeoutMs} ms)`)),
  );
  return new Promise<unknown>((resolve, reject) => {
    const settle = () => {
      timeout.clear();
      stop.dispose();
      stop.signal.removeEventListener('abort', onAbort);
    };
    const onAbort = () => {
      settle();
      reject(scope.signal.aborted ? scope.signal.reason : stop.signal.reason);
    };
    if (stop.signal.aborted) return onAbort();
    stop.signal.addEventListener('abort', onAbort, { once: true });
    const context: ToolContext = { signal: stop.signal, runId: scope.runId, toolCallId: call.toolCallId };
    Promise.resolve()
      .then(() => {
        // An ask tool's calls all wait for a person (see ApprovalGate): none gets here unless
        // the gate let it by, and then there is nothing to run.
        if (!t.execute) throw new Error(`Tool ${t.name} is answered by a person; it cannot run`);
        return (t.execute as (args: unknown, context: ToolContext) => unknown)(params, context);
      })
      .then(
        (value) => {
          settle();
          resolve(value);
        },
        (error: unknown) => {
          settle();
          reject(error);
        },
      );
  });
}
