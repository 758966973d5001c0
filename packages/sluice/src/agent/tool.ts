/** What a tool's `execute` gets besides its arguments. */
export interface ToolContext {
  /** The run's cancellation, and the tool's own timeout. */
  readonly signal: AbortSignal;
  readonly runId: string;
  readonly toolCallId: string;
}

/** A JSON Schema object (a TypeBox schema is one too). */
export type JsonSchema = Record<string, unknown>;

export interface ToolDefinition<Args = Record<string, unknown>> {
  name: string;
  description: string;
  /** JSON Schema of the arguments (TypeBox schemas work as they are). */
  parameters: JsonSchema;
  /**
   * Runs the tool. Returns a string, or any JSON value, which the model sees as the result.
   * Throwing gives the model an error result. Calling another agent's `run()` here starts a
   * child run.
   */
  execute(args: Args, context: ToolContext): unknown;
}

export interface Tool<Args = Record<string, unknown>> extends ToolDefinition<Args> {
  readonly kind: 'sluice-tool';
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
  if (typeof definition.execute !== 'function') {
    throw new TypeError(`Expected \`tool.execute\` of \`${definition.name}\` to be a function`);
  }
  return { ...definition, kind: 'sluice-tool' };
}
