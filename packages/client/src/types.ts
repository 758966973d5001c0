import type { paths } from './generated/openapi.js';

type JsonBody<P extends keyof paths, M extends keyof paths[P]> = paths[P][M] extends {
  requestBody?: { content: { 'application/json': infer B } };
}
  ? B
  : never;

/** The body of `POST /agents/:agent/runs`, as the server's OpenAPI document describes it. */
export type CreateRunBody = JsonBody<'/api/client/v1/agents/{agent}/runs', 'post'>;
/** The body of `POST /threads`. */
export type CreateThreadBody = JsonBody<'/api/client/v1/threads', 'post'>;
/** The query of `GET /agents/runs`. */
export type ListRunsQuery = Omit<
  NonNullable<paths['/api/client/v1/agents/runs']['get']['parameters']['query']>,
  'limit'
> & { limit?: string | number };

export type RunStatus =
  'scheduled' | 'queued' | 'running' | 'requires_action' | 'succeeded' | 'failed' | 'canceled';

/** Why a queued or scheduled run has not started. */
export interface Waiting {
  reason:
    | 'schedule'
    | 'tenant_cap'
    | 'project_cap'
    | 'deferred_running_cap'
    | 'worker'
    | 'thread'
    | 'provider_slot';
  position?: number;
  /** Epoch seconds. */
  estimated_start_at?: number;
}

/** A run as the server shows it (its routes declare no response schema, so this is written here). */
export interface Run {
  id: string;
  object: 'agent.run';
  agent: string;
  class: 'default' | 'deferred';
  status: RunStatus;
  input?: unknown;
  output?: { text: string; data?: unknown } | null;
  error: { type: string; message: string } | null;
  metadata: unknown;
  usage: unknown;
  /** Epoch seconds, like every time of a run. */
  created_at: number;
  started_at: number | null;
  finished_at: number | null;
  scheduled_for: number | null;
  thread_id: string | null;
  required_action?: { type: 'approve_tool_calls'; tool_calls: unknown[] };
  waiting?: Waiting;
}

export interface Page<T> {
  object: 'list';
  data: T[];
  has_more?: boolean;
  next_cursor: string | null;
}

export interface Thread {
  id: string;
  object: 'thread';
  status: 'idle' | 'busy' | 'requires_action';
  created_at: number;
  metadata: unknown;
}

export interface ThreadMessage {
  role: 'user' | 'assistant' | 'system';
  content: unknown;
  run_id: string | null;
  created_at: number;
}

/** The figures of `GET /agents/runs/queue`. */
export interface QueueFigures {
  object: 'agent.run_queue';
  default: { running: number; queued: number; scheduled: number; limit: number };
  deferred: {
    running: number;
    queued: number;
    scheduled: number;
    running_limit: number;
    queued_limit: number;
    oldest_queued_at: number | null;
  };
  project: Record<'default' | 'deferred', { running: number; queued: number; scheduled: number }>;
}

/** The answers of a run paused for approvals (`POST /agents/runs/:id/resume`). */
export interface ResumeBody {
  approvals: { tool_call_id: string; approved: boolean; reason?: string }[];
  wait?: boolean;
}

/** One event of a run's stream; `id` orders them from 1 (`run.created`). */
export type StreamEvent =
  | { id: number; event: 'run.created' | 'run.started' | RunEndEvent; data: Run }
  | { id: number; event: 'message.delta'; data: { run_id: string; text: string } }
  | {
      id: number;
      event: 'tool.started' | 'tool.completed';
      data: { run_id: string; tool_call_id: string; name: string };
    };

export type RunEndEvent = 'run.completed' | 'run.failed' | 'run.canceled' | 'run.requires_action';
