import type { ApiRun } from '../runs/store.js';
import { interruptsOf } from './interrupts.js';
import type { ToolEvent } from 'sluice';
import type { RunStreamEvent } from '../routes/stream-run.js';

/**
 * A run's stream events as AG-UI events: `RUN_STARTED` first; the answer's text as one
 * assistant message per stretch of text (`TEXT_MESSAGE_START`, `_CONTENT`, `_END`), closed when
 * a tool call begins; each server tool call as `TOOL_CALL_START`, `TOOL_CALL_ARGS` (its arguments
 * as JSON), `TOOL_CALL_END`, then `TOOL_CALL_RESULT` (the result's text, cut short); then `RUN_FINISHED`
 * (with AG-UI's interrupt outcome for a run that paused for a person), or `RUN_ERROR` for a run
 * that failed or was canceled.
 */
export class AgUiEvents {
  readonly #threadId: string;
  readonly #runId: string;
  readonly #emit: (event: object) => void;
  #message: string | undefined;
  #messages = 0;
  readonly #openCalls = new Set<string>();

  /** `threadId` and `runId` as the client sent them; `emit` sends one event. */
  constructor(threadId: string, runId: string, emit: (event: object) => void) {
    this.#threadId = threadId;
    this.#runId = runId;
    this.#emit = emit;
  }

  readonly send = (event: RunStreamEvent, data: object, tool?: ToolEvent): void => {
    const run = data as { id: string; run_id: string; text: string; tool_call_id: string; name: string };
    switch (event) {
      case 'run.created':
        this.#emit({ type: 'RUN_STARTED', threadId: this.#threadId, runId: this.#runId });
        return;
      case 'run.started':
        return;
      case 'message.delta':
        if (run.text === '') return;
        if (this.#message === undefined) {
          this.#message = `${run.run_id}_m${this.#messages++}`;
          this.#emit({ type: 'TEXT_MESSAGE_START', messageId: this.#message, role: 'assistant' });
        }
        this.#emit({ type: 'TEXT_MESSAGE_CONTENT', messageId: this.#message, delta: run.text });
        return;
      case 'tool.started':
        this.#closeMessage();
        this.#openCalls.add(run.tool_call_id);
        this.#emit({ type: 'TOOL_CALL_START', toolCallId: run.tool_call_id, toolCallName: run.name });
        if (tool?.type === 'started' && tool.args !== undefined)
          this.#emit({
            type: 'TOOL_CALL_ARGS',
            toolCallId: run.tool_call_id,
            delta: JSON.stringify(tool.args),
          });
        return;
      case 'tool.completed':
        if (!this.#openCalls.delete(run.tool_call_id)) return;
        this.#emit({ type: 'TOOL_CALL_END', toolCallId: run.tool_call_id });
        if (tool?.type === 'completed')
          this.#emit({
            type: 'TOOL_CALL_RESULT',
            messageId: `${run.run_id}_t${run.tool_call_id}`,
            toolCallId: run.tool_call_id,
            content: tool.result,
            role: 'tool',
          });
        return;
      default:
        this.#end(event, data as ApiRun);
    }
  };

  #closeMessage(): void {
    if (this.#message === undefined) return;
    this.#emit({ type: 'TEXT_MESSAGE_END', messageId: this.#message });
    this.#message = undefined;
  }

  #end(event: RunStreamEvent, run: ApiRun): void {
    this.#closeMessage();
    for (const id of this.#openCalls) this.#emit({ type: 'TOOL_CALL_END', toolCallId: id });
    this.#openCalls.clear();
    if (event === 'run.completed') {
      this.#emit({
        type: 'RUN_FINISHED',
        threadId: this.#threadId,
        runId: this.#runId,
        result: { run_id: run.id },
      });
      return;
    }
    if (event === 'run.requires_action' && run.required_action) {
      this.#emit({
        type: 'RUN_FINISHED',
        threadId: this.#threadId,
        runId: this.#runId,
        result: { run_id: run.id, required_action: run.required_action },
        outcome: { type: 'interrupt', interrupts: interruptsOf(run.id, run.required_action) },
      });
      return;
    }
    const canceled = event === 'run.canceled';
    this.#emit({
      type: 'RUN_ERROR',
      code: canceled ? 'run_canceled' : (run.error?.type ?? 'run_failed'),
      message: canceled
        ? `Run ${run.id} was canceled`
        : `Run ${run.id} failed${run.error ? `: ${run.error.message}` : ''}`,
    });
  }
}
