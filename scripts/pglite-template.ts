/**
 * Creates and migrates an embedded (PGlite) database in the folder given, then exits: the
 * template the test run's server tests copy. Run in its own process with the source condition,
 * so it needs no build of the packages.
 */
import { openStore } from '../packages/server/src/store/store.js';

const dir = process.argv[2];
if (!dir) throw new Error('usage: pglite-template.ts <folder>');
const store = await openStore({ dataDir: dir });
await store.close();
