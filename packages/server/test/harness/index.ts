// The server tests' harness: one way to start a server, one cleanup registry, one API client,
// the databases, the stand-in, and testkit's `until`. The leak guard runs from setup.ts.
export {
  apiClientOf,
  replyOf,
  type ApiClient,
  type Body,
  type Reply,
  type RequestExtras,
  type Who,
} from './client.js';
export {
  freshDatabase,
  poolLeftovers,
  postgres,
  preparedDataDir,
  runsLeftRunning,
  testPool,
} from './database.js';
export { deferred, type Deferred } from './deferred.js';
export { afterThisFile, afterThisTest, watchForLeaks } from './registry.js';
export {
  ownServer,
  serverLeftovers,
  startTestServer,
  type TestServer,
  type TestServerOptions,
} from './server.js';
export { openTestStore } from './store.js';
export { lastUserText, ownStandIn, standInModel, startStandIn } from './stand-in.js';
export {
  databaseNameOf,
  startDatabaseProxy,
  startTcpProxy,
  throughProxy,
  throughPgBouncer,
  type TcpProxy,
} from './tcp-proxy.js';
export { until } from './wait.js';
