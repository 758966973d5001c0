/**
 * The docs name files that exist, and the layout in docs/development.md names every source
 * folder and every test folder: a move or a new folder that the docs do not follow fails here.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../../../', import.meta.url));
const read = (path: string) => readFileSync(join(root, path), 'utf8');
const docs = [
  'README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

/** `packages/...` paths a text names; globs and elided paths are left out. */
function pathsIn(text: string): string[] {
  const found = new Set<string>();
  for (const [match] of text.matchAll(/packages\/[A-Za-z0-9_.\-/]+/g)) {
    // A sentence's full stop, or a line number after a colon, is not part of the path.
    const path = match.replace(/[.:]+$/, '');
    if (!path.includes('*')) found.add(path);
  }
  return [...found];
}

/** Every file of the repository, from its root, without dependencies and build output. */
function filesUnder(dir: string): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true }).flatMap((entry) => {
    if (['node_modules', 'dist', '.git', '.sluice', 'coverage'].includes(entry.name)) return [];
    const path = dir ? `${dir}/${entry.name}` : entry.name;
    return entry.isDirectory() ? filesUnder(path) : [path];
  });
}
const files = filesUnder('').map((f) => `/${f}`);

/** `folder/file.ts` (or .sql, .mjs) names that do not start from packages/; URLs left out. */
function shortPathsIn(text: string): string[] {
  const found = new Set<string>();
  for (const [match] of text.matchAll(/(?<![\w/.:-])(?:[\w.-]+\/)+[\w.-]+\.(?:ts|sql|mjs)\b/g)) {
    // A link from docs/ to a file of the repository (../examples/...) starts from the root.
    const path = match.replace(/^(\.\.\/)+/, '');
    if (!path.startsWith('packages/') && !path.includes('*')) found.add(path);
  }
  return [...found];
}

const folders = (dir: string, depth: number): string[] =>
  readdirSync(join(root, dir))
    .filter((name) => statSync(join(root, dir, name)).isDirectory())
    .flatMap((name) => {
      const path = `${dir}/${name}`;
      return depth > 1 ? [path, ...folders(path, depth - 1)] : [path];
    });

describe('the docs and the tree they describe', () => {
  it.each(docs)('every packages/ path %s names exists', (doc) => {
    // Build output (`packages/server/dist/cli.js`) is not in the tree until `npm run build`:
    // its paths are the build's to keep, not the docs'.
    const missing = pathsIn(read(doc)).filter(
      (path) => !path.includes('/dist/') && !existsSync(join(root, path)),
    );
    expect(missing, `${doc} names paths that do not exist`).toEqual([]);
  });

  it.each(docs)('every file %s names by a shorter path (runs/store.ts, sql/001_runs.sql) exists', (doc) => {
    const missing = shortPathsIn(read(doc)).filter((short) => !files.some((f) => f.endsWith(`/${short}`)));
    expect(missing, `${doc} names files that are nowhere in the repository`).toEqual([]);
  });

  it('docs/development.md names every folder of packages/*/src and every top-level folder of packages/*/test', () => {
    const layout = read('docs/development.md');
    const named = new Set(pathsIn(layout).map((path) => path.replace(/\/$/, '')));
    const packages = readdirSync(join(root, 'packages')).map((p) => `packages/${p}`);
    const expected = packages.flatMap((p) => [
      ...(existsSync(join(root, p, 'src')) ? folders(`${p}/src`, 8) : []),
      ...(existsSync(join(root, p, 'test')) ? folders(`${p}/test`, 1) : []),
    ]);
    expect(expected.length).toBeGreaterThan(10);
    const unnamed = expected.filter((path) => !named.has(path));
    expect(unnamed, 'folders docs/development.md does not name (add each to its layout)').toEqual([]);
  });

  it('each file the layout lists beside a folder is in that folder', () => {
    const layout = read('docs/development.md');
    const block = layout.slice(
      layout.indexOf('## Layout'),
      layout.indexOf('\n## ', layout.indexOf('## Layout') + 1),
    );
    const missing: string[] = [];
    let folder: string | undefined;
    for (const line of block.split('\n')) {
      const head = /^(packages\/\S+\/)\s/.exec(line + ' ');
      if (head) folder = head[1];
      else if (!/^\s/.test(line)) folder = undefined;
      if (!folder) continue;
      for (const [name] of line.matchAll(/(?<![\w/.-])[\w-]+\.(?:ts|sql)\b/g)) {
        const here = (dir: string): boolean =>
          readdirSync(join(root, dir), { withFileTypes: true }).some((e) =>
            e.isDirectory() ? here(join(dir, e.name)) : e.name === name,
          );
        if (!here(folder)) missing.push(`${relative(root, join(root, folder))}/…/${name}`);
      }
    }
    expect(missing, 'files the layout lists that are not in the folder beside them').toEqual([]);
  });
});
