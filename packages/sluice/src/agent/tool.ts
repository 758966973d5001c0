import { createRequire } from 'node:module';

/** What a tool's `execute` gets besides its arguments. */
export interface ToolContext {
  /** The run's cancellation, and the tool's own timeout. */
  readonly signal: AbortSignal;
  readonly runId: string;
  readonly toolCallId: string;
}

/** A JSON Schema object (a TypeBox schema is one too). */
export type JsonSchema = Record<string, unknown>;

/** A schema of a Standard Schema library (zod 4), whose output type becomes the arguments' type. */
export interface StandardSchemaLike<Output> {
  readonly '~standard': { readonly vendor: string; readonly types?: { readonly output: Output } };
}

/**
 * A check of a call's arguments. Declared as a method so a tool with typed arguments still fits
 * the agent's `tools` list, as `execute` does.
 */
export type ApprovalCheck<Args> = { check(args: Args): boolean | Promise<boolean> }['check'];

interface ToolBase<Args> {
  name: string;
  description: string;
  /** JSON Schema of the arguments (TypeBox schemas work as they are), or a zod schema. */
  parameters: JsonSchema | StandardSchemaLike<Args>;
}

/** A tool the runtime runs. */
export interface ExecutedToolDefinition<Args = Record<string, unknown>> extends ToolBase<Args> {
  /**
   * Runs the tool. Returns a string, or any JSON value, which the model sees as the result.
   * Throwing gives the model an error result. Calling another agent's `run()` here starts a
   * child run.
   */
  execute(args: Args, context: ToolContext): unknown;
  /**
   * Whether a call waits for a person's decision first: `true`, or a check of the call's
   * arguments (after validation). A run whose model makes such a call does not run it: it ends
   * with `status: 'requires_action'` and the pending calls, and `agent.resume()` goes on once
   * they are approved or declined. A check that throws counts as `true`. @default false
   */
  needsApproval?: boolean | ApprovalCheck<Args>;
  ask?: false;
}

/**
 * A tool a person answers: the model's call is the question (its `question` argument when it
 * has a string one, else its arguments as JSON). A run whose model calls it ends with `status:
 * 'requires_action'`, the call pending as a question, and `agent.resume()` goes on with the
 * person's answer as the call's result. It has no `execute`.
 */
export interface AskToolDefinition<Args = Record<string, unknown>> extends ToolBase<Args> {
  ask: true;
  execute?: never;
  needsApproval?: never;
}

export type ToolDefinition<Args = Record<string, unknown>> =
  ExecutedToolDefinition<Args> | AskToolDefinition<Args>;

export type Tool<Args = Record<string, unknown>> = ToolDefinition<Args> & {
  readonly kind: 'sluice-tool';
  /** The arguments' schema as JSON Schema, whatever form it was given in. */
  readonly jsonSchema: JsonSchema;
};

const require = createRequire(import.meta.url);

/** JSON Schema for the model and for validation; a zod schema is converted with zod's own converter. */
function toJsonSchema(name: string, parameters: JsonSchema | StandardSchemaLike<unknown>): JsonSchema {
  const standard = (parameters as StandardSchemaLike<unknown>)['~standard'];
  if (standard === undefined) return parameters as JsonSchema;
  if (standard.vendor !== 'zod') {
    throw new TypeError(
      `Expected \`tool.parameters\` of \`${name}\` to be JSON Schema, TypeBox or zod, got a ${standard.vendor} schema`,
    );
  }
  const zod = require('zod') as { toJSONSchema(schema: unknown, options?: object): JsonSchema };
  const { $schema: _ignored, ...schema } = zod.toJSONSchema(parameters, { io: 'input' });
  return schema;
}

const namePattern = /^[a-zA-Z0-9_-]{1,64}$/;

/**
 * Defines a tool for `createAgent({ tools })`.
 *
 * @example
 * const weather = tool({
 *   name: 'weather',
 *   description: 'Current weather for a city',
 *   parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
 *   execute: async ({ city }, { signal }) => fetchWeather(city, { signal }),
 * });
 */
export function tool<Args = Record<string, unknown>>(definition: ToolDefinition<Args>): Tool<Args> {
  if (typeof definition?.name !== 'string' || !namePattern.test(definition.name)) {
    throw new TypeError(
      `Expected \`tool.name\` to be 1 to 64 letters, digits, _ or -, got \`${String(definition?.name)}\``,
    );
  }
  if (typeof definition.description !== 'string') {
    throw new TypeError(`Expected \`tool.description\` of \`${definition.name}\` to be a string`);
  }
  if (typeof definition.parameters !== 'object' || definition.parameters === null) {
    throw new TypeError(`Expected \`tool.parameters\` of \`${definition.name}\` to be a JSON Schema object`);
  }
  if (definition.ask !== undefined && typeof definition.ask !== 'boolean') {
    throw new TypeError(
      `Expected \`tool.ask\` of \`${definition.name}\` to be true or false, got \`${String(definition.ask)}\``,
    );
  }
  if (definition.ask === true) checkAskTool(definition);
  else checkExecutedTool(definition);
  return {
    ...definition,
    kind: 'sluice-tool',
    jsonSchema: toJsonSchema(definition.name, definition.parameters),
  };
}

/** A person answers an ask tool: running it or guarding it with an approval means nothing. */
function checkAskTool(definition: AskToolDefinition<unknown>): void {
  if (definition.execute !== undefined) {
    throw new TypeError(
      `Expected \`tool.execute\` of \`${definition.name}\` to be absent: a tool with \`ask: true\` is answered by a person`,
    );
  }
  if (definition.needsApproval !== undefined) {
    throw new TypeError(
      `Expected \`tool.needsApproval\` of \`${definition.name}\` to be absent: a tool with \`ask: true\` waits for a person already`,
    );
  }
}

function checkExecutedTool(definition: ExecutedToolDefinition<unknown>): void {
  const { needsApproval } = definition;
  if (
    needsApproval !== undefined &&
    typeof needsApproval !== 'boolean' &&
    typeof needsApproval !== 'function'
  ) {
    throw new TypeError(
      `Expected \`tool.needsApproval\` of \`${definition.name}\` to be a boolean or a function, got \`${String(needsApproval)}\``,
    );
  }
  if (typeof definition.execute !== 'function') {
    throw new TypeError(
      `Expected \`tool.execute\` of \`${definition.name}\` to be a function (or \`ask: true\` for a tool a person answers)`,
    );
  }
}
