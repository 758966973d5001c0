import type { ServerSettings } from '../settings.js';
import type { RunConfig } from './store.js';

/** Bounds a client may send with a run (`config`). */
export interface ClientConfig {
  timeout_ms?: number | null;
  tool_timeout_ms?: number | null;
  turn_timeout_ms?: number | null;
  max_parallel_tool_calls?: number;
}

/** The smaller of two optional limits, where null, undefined and 0 mean "none". */
function tighter(a: number | null | undefined, b: number | null | undefined): number | undefined {
  const set = [a, b].filter((v): v is number => typeof v === 'number' && v > 0);
  return set.length === 0 ? undefined : Math.min(...set);
}

/**
 * The bounds a run is admitted with. A client can tighten the server's, never loosen them: its
 * `max_parallel_tool_calls` and `timeout_ms` are lowered to the server's values, and the run
 * timeout (`runs.timeoutMs`) applies to held runs whatever the client sends.
 */
export function runConfig(
  given: ClientConfig | undefined,
  settings: ServerSettings,
  held: boolean,
): RunConfig {
  const config: RunConfig = {
    max_parallel_tool_calls: Math.min(
      given?.max_parallel_tool_calls ?? settings.maxParallelToolCalls,
      settings.maxParallelToolCalls,
    ),
  };
  const timeout = tighter(given?.timeout_ms, held ? settings.runTimeoutMs : undefined);
  if (timeout !== undefined) config.timeout_ms = timeout;
  const tool = tighter(given?.tool_timeout_ms, undefined);
  if (tool !== undefined) config.tool_timeout_ms = tool;
  const turn = tighter(given?.turn_timeout_ms, undefined);
  if (turn !== undefined) config.turn_timeout_ms = turn;
  return config;
}
