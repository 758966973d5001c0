import { expect } from 'vitest';
import { errorShapeProblem, type Answer } from './principals.js';

/**
 * Checks an error answer: its status, the one body shape, its type, and the field it names
 * (`param`, which the OpenAI clients read, and `field`). Returns the error for more checks.
 */
export function expectError(
  answer: Answer,
  status: number,
  type: string,
  field: string | null = null,
): Record<string, unknown> & { message: string } {
  expect({ status: answer.status, body: answer.body }).toMatchObject({ status });
  expect(errorShapeProblem(answer.body)).toBeUndefined();
  const error = answer.body!.error as Record<string, unknown> & { message: string };
  expect(error.type).toBe(type);
  expect(error.param).toBe(field);
  if (field !== null) expect(error.field).toBe(field);
  return error;
}
