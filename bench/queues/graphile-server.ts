/**
 * graphile-worker 0.16 in bench:queues, as its docs set it up: `makeWorkerUtils` for the
 * route's `addJob`, `run` with `concurrency` workers (LISTEN/NOTIFY wakes them) in the same
 * process, a task that calls the stand-in. Under a cap, each job gets one of the tenant's
 * `queueName` lanes (graphile-worker runs one job of a named queue at a time).
 */
import { Logger, makeWorkerUtils, run, type Runner } from 'graphile-worker';
import { answerParent, childOptions, failStart } from './child.js';
import { modelCaller } from './model-call.js';
import type { SystemOptions } from './options.js';
import { laneDealer, startPeerRoute, type RunJob } from './peer-route.js';

const options = childOptions<SystemOptions>();
try {
  const connectionString = options.databaseUrl;
  // Warnings and errors only: its log of every job done would be the bench's largest cost.
  const logger = new Logger(() => (level, message) => {
    if (level === 'error' || level === 'warning') console.error(`graphile-worker ${level}: ${message}`);
  });
  const utils = await makeWorkerUtils({ connectionString, logger });
  await utils.migrate();
  const call = modelCaller(options.providerUrl);
  const runner: Runner = await run({
    connectionString,
    concurrency: options.workers,
    // As many connections as Sluice's pool (20), at least the workers, as graphile-worker asks.
    maxPoolSize: Math.max(20, options.workers),
    crontab: '',
    logger,
    noHandleSignals: true,
    pollInterval: 1000,
    taskList: {
      model: async (payload) => {
        await call((payload as RunJob).input);
      },
    },
  });
  const lane = options.tenantCap > 0 ? laneDealer(options.tenantCap) : undefined;
  const { app, ready } = await startPeerRoute(options.tenants, async (job) => {
    const added = await utils.addJob('model', job, lane ? { queueName: lane(job.tenant) } : {});
    return added.id;
  });
  answerParent(
    { ...ready },
    {
      stop: async () => {
        await app.close();
        await runner.stop();
        await utils.release();
      },
    },
  );
} catch (error) {
  failStart(error);
}
