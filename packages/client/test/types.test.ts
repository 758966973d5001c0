import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { startTestServer } from '../../server/test/helpers.js';
import { renderTypes, typesFile } from '../scripts/render-types.js';

describe('the committed OpenAPI types', () => {
  it('are what openapi-typescript makes of the document the running server serves (npm run generate -w packages/client)', async () => {
    const t = await startTestServer();
    const response = await fetch(`${t.server.url}/api/client/v1/openapi.json`);
    expect(response.status).toBe(200);
    expect(readFileSync(typesFile, 'utf8')).toBe(await renderTypes((await response.json()) as object));
  });
});
