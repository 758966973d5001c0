import type { FastifyReply } from 'fastify';
import { HttpError, badRequest, notFound, shown } from '../http/errors.js';
import { clientGone } from '../http/client-gone.js';
import type { RouteContext } from '../routes/context.js';
import { answerPausedRun } from '../routes/resume.js';
import { EventStream } from '../routes/stream-run.js';
import { MAX_ANSWER_CHARS } from '../runs/answers.js';
import { MAX_REASON_CHARS } from '../runs/approvals.js';
import { getRun, toApiRun, type RunRow } from '../runs/store.js';
import type { Principal } from '../store/tokens.js';
import { pauseEndId } from '../streams/queries.js';
import { AgUiEvents } from './events.js';
import { findAgUiThread } from './threads.js';

/**
 * AG-UI's way to go on from an interrupt: a new run of the same thread whose `resume` entries
 * answer the interrupts the paused run ended with (@ag-ui/core 1.0's `ResumeEntry`:
 * `{ interruptId, status: 'resolved' | 'cancelled', payload? }`). Each entry is mapped onto the
 * runs API's resume (`answerPausedRun`, the same service) and the run's events from there on are
 * streamed as AG-UI events under the new `runId`:
 *
 * - a `question` interrupt: `resolved` with the answer as `payload` (a string), or `cancelled`,
 *   which answers that the person gave no answer;
 * - a `tool_approval` interrupt: `resolved` with `payload: { approved, reason? }`, or `cancelled`,
 *   which declines the call (with `payload.reason` when given).
 *
 * Bad entries are 400s naming the field (`resume[1].payload`); a thread of another tenant, or
 * one with no run of this agent waiting, is 404; a run that waits no more is 409, as on the runs
 * API. The run was admitted once already: no cap refuses it.
 */

export interface ResumeEntry {
  interruptId?: unknown;
  status?: unknown;
  payload?: unknown;
}

/** What a cancelled question tells the model, as the tool's result. */
export const UNANSWERED = 'The person dismissed the question without answering.';

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** The runs API's resume body for the entries, checked against what `run` waits for. */
export function resumeBodyOf(
  run: RunRow,
  entries: readonly unknown[],
): { answers: unknown[] } | { approvals: unknown[] } {
  const action = run.required_action;
  const pending =
    action?.type === 'answer_question'
      ? action.questions.map((q) => q.tool_call_id)
      : (action?.tool_calls.map((c) => c.id) ?? []);
  const seen = new Set<string>();
  const decisions = entries.map((entry, i) => {
    const at = `resume[${i}]`;
    if (!isObject(entry))
      throw badRequest(`Expected \`${at}\` to be a resume entry, got \`${shown(entry)}\``, { field: at });
    const { interruptId: id, status, payload } = entry as ResumeEntry;
    if (typeof id !== 'string' || !pending.includes(id)) {
      throw badRequest(
        `Expected \`${at}.interruptId\` to be one of the open interrupts of run ${run.id} (${pending.join(', ')}), got \`${shown(id)}\``,
        { field: `${at}.interruptId`, pending },
      );
    }
    if (seen.has(id))
      throw badRequest(`\`${at}.interruptId\` answers \`${id}\` a second time; answer each interrupt once`, {
        field: `${at}.interruptId`,
      });
    seen.add(id);
    if (status !== 'resolved' && status !== 'cancelled') {
      throw badRequest(
        `Expected \`${at}.status\` to be \`resolved\` or \`cancelled\`, got \`${shown(status)}\``,
        {
          field: `${at}.status`,
        },
      );
    }
    if (action?.type === 'answer_question') {
      if (status === 'cancelled') return { tool_call_id: id, text: UNANSWERED };
      if (typeof payload !== 'string' || payload.trim() === '' || payload.length > MAX_ANSWER_CHARS) {
        throw badRequest(
          `Expected \`${at}.payload\` to be the answer, a non-blank string of at most ${MAX_ANSWER_CHARS} characters, got \`${shown(payload)}\``,
          { field: `${at}.payload`, limit_value: MAX_ANSWER_CHARS },
        );
      }
      return { tool_call_id: id, text: payload };
    }
    const given = isObject(payload) ? payload : {};
    if (payload !== undefined && !isObject(payload)) {
      throw badRequest(
        `Expected \`${at}.payload\` to be \`{ approved, reason? }\`, got \`${shown(payload)}\``,
        {
          field: `${at}.payload`,
        },
      );
    }
    const approved = status === 'cancelled' ? false : given.approved;
    if (typeof approved !== 'boolean') {
      throw badRequest(
        `Expected \`${at}.payload.approved\` to be true or false, got \`${shown(approved)}\``,
        {
          field: `${at}.payload.approved`,
        },
      );
    }
    const reason = given.reason;
    if (reason !== undefined && (typeof reason !== 'string' || reason.length > MAX_REASON_CHARS)) {
      throw badRequest(
        `Expected \`${at}.payload.reason\` to be a string of at most ${MAX_REASON_CHARS} characters, got \`${shown(reason)}\``,
        { field: `${at}.payload.reason`, limit_value: MAX_REASON_CHARS },
      );
    }
    return { tool_call_id: id, approved, ...(reason === undefined ? {} : { reason }) };
  });
  if (action?.type === 'answer_question') return { answers: decisions };
  const missing = pending.filter((id) => !seen.has(id));
  if (missing.length > 0) {
    throw badRequest(
      `\`resume\` answers no interrupt ${missing.join(', ')}; answer every open tool approval`,
      {
        field: 'resume',
        missing,
      },
    );
  }
  return { approvals: decisions };
}

/** The paused run an AG-UI thread waits on: 404 for no thread of the tenant, 409 for one that waits for nothing. */
async function pausedRunOf(
  ctx: RouteContext,
  who: Principal,
  agent: string,
  threadId: string,
): Promise<RunRow> {
  const thread = await findAgUiThread(ctx.db, who, threadId);
  if (!thread) throw notFound(`No thread \`${shown(threadId)}\``);
  const run =
    thread.status === 'requires_action' && thread.active_run_id !== null
      ? await getRun(ctx.db, who.tenant, thread.active_run_id)
      : undefined;
  if (!run || run.status !== 'requires_action') {
    throw new HttpError(
      409,
      'run_not_requires_action',
      `Thread \`${shown(threadId)}\` has no run waiting for a person; send a run without \`resume\``,
      { field: 'resume' },
    );
  }
  if (run.agent !== agent)
    throw notFound(`No run of agent \`${shown(agent)}\` waits on thread \`${shown(threadId)}\``);
  return run;
}

/**
 * Answers the paused run of the AG-UI thread with the entries and streams what follows as AG-UI
 * events: `RUN_STARTED`, the run's events from its resume on, and `RUN_FINISHED` (with an
 * interrupt outcome again for a run that pauses again, or for questions still open) or
 * `RUN_ERROR`. A client that leaves stops the stream, not the run.
 */
export async function resumeOverAgUi(
  ctx: RouteContext,
  who: Principal,
  agent: string,
  body: { threadId: string; runId: string; resume: readonly unknown[] },
  reply: FastifyReply,
): Promise<FastifyReply> {
  const run = await pausedRunOf(ctx, who, agent, body.threadId);
  const decisions = resumeBodyOf(run, body.resume);
  // What follows the pause's own last event is the resume's (that event may not be stored yet).
  const cursor = await pauseEndId(ctx.db, run.id);
  const moved = await answerPausedRun(ctx, who, run, decisions);
  const signal = clientGone(reply);
  const stream = new EventStream(reply, ctx.settings.streamKeepAliveMs);
  const events = new AgUiEvents(body.threadId, body.runId, (event) => stream.data(event));
  events.send('run.created', toApiRun(moved.run));
  try {
    if (!moved.resumed) {
      events.send('run.requires_action', toApiRun(moved.run));
      return reply;
    }
    for await (const event of ctx.executor.streams.follow(who.tenant, run.id, cursor, signal)) {
      if (event.event !== 'run.created') events.send(event.event, event.data);
    }
  } catch (error) {
    // The headers are sent: a database that went away ends the stream.
    reply.log.warn({ error: String(error), run: run.id }, 'AG-UI resume stream ended early');
  } finally {
    stream.end();
  }
  return reply;
}
