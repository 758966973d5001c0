import type { Model, Api } from '@mariozechner/pi-ai';
import type { Clock } from '../concurrency/clock.js';
import { ConcurrencyConfigError, ConcurrencyError, type RequestLineage } from '../concurrency/errors.js';
import type { ConcurrencyLimiter } from '../concurrency/limiter.js';
import { resolveKey } from '../concurrency/options.js';
import { withLineage } from '../concurrency/slot.js';
import { checkDecisions, checkPausedState, type PausedState, type ToolDecision } from './approvals.js';
import { resumedHistory, toConversation, type ChatMessage, type Conversation } from './conversation.js';
import type { RunScope } from './scope.js';

/** The conversation a run starts from and, for a resumed run, the pause it goes on from. */
export interface ConversationPlan {
  readonly conversation: Conversation;
  /** Set when the run goes on after a pause. */
  readonly resume?: { state: PausedState; decisions: Map<string, ToolDecision> };
}

/** What a new run or a resumed one gives: a prompt (and history), or a paused state and decisions. */
type RunInput =
  | { prompt: string | readonly ChatMessage[]; history?: readonly ChatMessage[] }
  | { paused: PausedState; decisions: readonly ToolDecision[]; history?: readonly ChatMessage[] };

/**
 * Checks a run's input and turns it into the conversation the loop starts from. A resumed run
 * takes its system prompt from the paused state (the instructions it ran with then), and its
 * decisions are checked against the pending calls before a slot is asked for.
 */
export function runConversation(
  instructions: string | undefined,
  input: RunInput,
  model: Model<Api>,
  clock: Clock,
): ConversationPlan {
  if ('paused' in input) {
    const state = checkPausedState(input.paused);
    return {
      conversation: {
        systemPrompt: state.systemPrompt,
        history: resumedHistory(input.history, model, clock.now()),
        prompts: [],
      },
      resume: { state, decisions: checkDecisions(state.pending, input.decisions) },
    };
  }
  return {
    conversation: toConversation(
      { instructions, prompt: input?.prompt, history: input?.history },
      model,
      clock.now(),
    ),
  };
}

/**
 * A run's limiter, workload and fairness key, checked before anything is sent. The agent's own
 * limiter wins; without one a run inside another agent's tool uses its parent's.
 */
export function runConcurrency(
  agent: { limiter: ConcurrencyLimiter<string>; workload?: string; outputTokens?: number } | undefined,
  options: { concurrency?: { workload?: string; key?: string; outputTokens?: number } },
  parent: RunScope | undefined,
  lineage: RequestLineage,
): {
  limiter: ConcurrencyLimiter<string> | undefined;
  workload: string | undefined;
  key: string | undefined;
  outputTokens: number | undefined;
} {
  const limiter = agent?.limiter ?? parent?.limiter;
  // A child on its parent's limiter keeps its parent's workload unless the run picks one:
  // nesting cannot move work to another workload by accident.
  let workload =
    options.concurrency?.workload ??
    (limiter !== undefined && limiter === parent?.limiter ? parent.workload : agent?.workload);
  if (options.concurrency?.workload !== undefined && !limiter) {
    throw new ConcurrencyConfigError('This agent has no limiter, so a run cannot pick a workload', {
      limiter: 'none',
      workload: options.concurrency.workload,
      ...lineage,
      field: 'concurrency.workload',
    });
  }
  if (limiter?.validateWorkload) {
    try {
      workload = limiter.validateWorkload(workload);
    } catch (error) {
      throw error instanceof ConcurrencyError ? withLineage(error, lineage) : error;
    }
  }
  // The key says who the work is for, whichever limiter a child uses: it is inherited.
  const key = options.concurrency?.key ?? parent?.key;
  if (options.concurrency?.key !== undefined) {
    resolveKey({ name: limiter?.name ?? 'none' }, options.concurrency.key, workload ?? 'default', lineage);
  }
  // The expected answer length belongs to the agent and its model: a child does not inherit it.
  const outputTokens = options.concurrency?.outputTokens ?? agent?.outputTokens;
  if (options.concurrency?.outputTokens !== undefined) {
    checkOutputTokens(options.concurrency.outputTokens, limiter?.name ?? 'none', lineage);
  }
  return { limiter, workload, key, outputTokens };
}

/** Refuses an `outputTokens` that is not a whole number of tokens from 0. */
export function checkOutputTokens(value: unknown, limiter: string, lineage?: RequestLineage): void {
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return;
  throw new ConcurrencyConfigError(
    `Expected \`concurrency.outputTokens\` to be a whole number of tokens from 0, got \`${String(value)}\``,
    { limiter, ...lineage, field: 'concurrency.outputTokens', value },
  );
}
