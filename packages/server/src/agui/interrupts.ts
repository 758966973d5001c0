import type { RequiredAction } from '../runs/required-action.js';

/** AG-UI's `Interrupt`, the fields this server fills (written out: @ag-ui/core is not a dependency). */
export interface Interrupt {
  id: string;
  reason: string;
  message?: string;
  toolCallId?: string;
  responseSchema?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
}

/**
 * A paused run as AG-UI 1.0 interrupts (`RUN_FINISHED` with `outcome: { type: 'interrupt' }`):
 * one per call the person is asked about, its id the tool call's. The client answers them with
 * the next run's `resume` entries (agui/resume.ts); each also carries the run's id in its
 * metadata, for an answer through `POST /agents/runs/:run_id/resume` (`approvals` for a
 * `tool_approval` interrupt, `answers` for a `question` one).
 */
export function interruptsOf(runId: string, action: RequiredAction): Interrupt[] {
  if (action.type === 'approve_tool_calls') {
    return action.tool_calls.map((call) => ({
      id: call.id,
      reason: 'tool_approval',
      message: `Run ${call.name} with ${JSON.stringify(call.arguments)}?`,
      toolCallId: call.id,
      responseSchema: {
        type: 'object',
        properties: { approved: { type: 'boolean' }, reason: { type: 'string' } },
        required: ['approved'],
      },
      metadata: { run_id: runId, name: call.name, arguments: call.arguments },
    }));
  }
  return action.questions.map((q) => ({
    id: q.tool_call_id,
    reason: 'question',
    message: q.question,
    toolCallId: q.tool_call_id,
    responseSchema: { type: 'string', minLength: 1 },
    metadata: { run_id: runId, name: q.name },
  }));
}
