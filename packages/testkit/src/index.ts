/**
 * `@sluice/testkit`: a model provider on 127.0.0.1 for tests, demos and benchmarks. It speaks
 * the OpenAI chat-completions and Anthropic messages wire protocols (streaming and not, tool
 * calls included), replies
 * as a script says, injects faults (an HTTP error with retry-after, a dropped connection, a
 * stalled stream), and counts the requests in flight exactly, so a test can check a limit
 * where it matters: at the provider.
 */
export { startProviderStandIn } from './stand-in.js';
export type {
  LimitName,
  ProviderStandIn,
  Reply,
  RequestRecord,
  StandInImage,
  StandInLimits,
  StandInOptions,
  StandInRequest,
} from './types.js';
export { echo, replies, toolThenAnswer } from './replies.js';
export { until } from './until.js';
export type { UntilOptions } from './until.js';
