/**
 * The settings table of docs/server.md and the variables the server reads: a setting added
 * without its row, a row left for a setting that is gone, or the table pasted twice fails here.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { resolveSettings } from '@sluice/server';

const root = fileURLToPath(new URL('../../../../', import.meta.url));
const serverDoc = readFileSync(join(root, 'docs/server.md'), 'utf8');

/** The variable column of the table under `## Settings`, in order, duplicates kept. */
function tableVariables(doc: string): string[] {
  const section = doc.split(/^## Settings$/m)[1]?.split(/^## /m)[0] ?? '';
  return [...section.matchAll(/^\| `([A-Z][A-Z0-9_]*)` +\|/gm)].map((m) => m[1]!);
}

/**
 * Every environment variable resolveSettings looks at, found by handing it an environment that
 * records each name it is asked for (and answers none): no list kept by hand to go stale.
 */
function variablesRead(): string[] {
  const read = new Set<string>();
  const env = new Proxy({} as NodeJS.ProcessEnv, {
    get(_target, key) {
      if (typeof key === 'string') read.add(key);
      return undefined;
    },
  });
  resolveSettings({}, env);
  return [...read];
}

/** The text of every source file of the server, to find a variable named in it. */
function serverSources(dir = join(root, 'packages/server/src')): string {
  return readdirSync(dir, { withFileTypes: true })
    .map((entry) =>
      entry.isDirectory()
        ? serverSources(join(dir, entry.name))
        : entry.name.endsWith('.ts')
          ? readFileSync(join(dir, entry.name), 'utf8')
          : '',
    )
    .join('\n');
}

describe('the settings table of docs/server.md', () => {
  const rows = tableVariables(serverDoc);

  it('has one row per variable (one table, not two copies)', () => {
    expect(rows.length).toBeGreaterThan(20);
    expect(rows.filter((name, i) => rows.indexOf(name) !== i)).toEqual([]);
    expect(serverDoc.split(/^## Settings$/m)[1]?.match(/^\| variable /gm)).toHaveLength(1);
  });

  it('names every variable resolveSettings reads', () => {
    const read = variablesRead();
    // The probe itself works: these are read whatever the config says.
    expect(read).toEqual(
      expect.arrayContaining(['AGENT_RUN_CONCURRENCY', 'SLUICE_REQUEST_TIMEOUT_MS', 'MODE']),
    );
    expect(read.filter((name) => !rows.includes(name))).toEqual([]);
  });

  it('names only variables the server reads', () => {
    const sources = serverSources();
    expect(rows.filter((name) => !new RegExp(`\\b${name}\\b`).test(sources))).toEqual([]);
  });
});
